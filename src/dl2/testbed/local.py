"""The local testbed: etcd + kube-apiserver + KWOK on loopback, no Docker (DESIGN §6).

`up(folder)` builds (or takes from the cache) the binaries, writes fresh certificates and a token,
starts the three processes on free loopback ports, waits until the API server is ready, writes a
kubeconfig and installs the DL2Job CRD. The folder's `testbed.json` records the processes, so `down`
(from any process) stops exactly those. Timings of the last `up` are recorded there too.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx2

from dl2.errors import Dl2Error
from dl2.kube.client import Kube
from dl2.kube.resources import KWOK_ANNOTATION, install_crd
from dl2.paths import write_json_atomic, write_text_atomic
from dl2.testbed import build, pki

STATE_FILE = "testbed.json"
KWOK_STAGES = Path(__file__).with_name("manifests") / "kwok-stages.yaml"
READY_TIMEOUT = 60.0


@dataclass(frozen=True)
class Testbed:
    folder: Path
    server: str
    kubeconfig: Path
    pids: dict[str, int]
    timings: dict[str, float]  # build_s (0 from cache), start_s (launch to API ready), up_s (whole `up`)

    def kube(self, **kwargs) -> Kube:
        return Kube.from_kubeconfig(self.kubeconfig, **kwargs)


def default_folder() -> Path:
    return build.cache_root() / "run"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the process that started it dies (Linux PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _start(binary: Path, args: list[str], log: Path, detach: bool) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([str(binary), *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=None if detach else _die_with_parent)


def _wait(what: str, proc: subprocess.Popen, log: Path, probe, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-5:])
            if "address already in use" in tail:
                raise Dl2Error(f"{what} could not bind its loopback port: another process took it after the "
                               f"testbed chose it; run `dl2 testbed up --local` again (see {log})")
            raise Dl2Error(f"{what} exited with code {proc.returncode} while starting; see {log}:\n{tail}")
        try:
            if probe():
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.1)
    raise Dl2Error(f"{what} was not ready within {timeout:.0f} s; see {log}")


def _kubeconfig(server: str, creds: pki.Credentials) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dl2-testbed",
        "clusters": [{"name": "dl2-testbed", "cluster": {"server": server, "certificate-authority": str(creds.ca)}}],
        "users": [{"name": pki.ADMIN_USER, "user": {"token": creds.token}}],
        "contexts": [{"name": "dl2-testbed", "context": {"cluster": "dl2-testbed", "user": pki.ADMIN_USER}}],
    }, indent=2)


def up(folder: Path | None = None, log=print, detach: bool = True) -> Testbed:
    """Start a testbed in `folder` (default: the cache's `run/`); an already running one there is an error.

    Detached (the CLI), it outlives this process until `down`; else (tests) it dies with this process too.
    """
    folder = Path(folder) if folder is not None else default_folder()
    if _alive(folder):
        raise Dl2Error(f"a testbed is already running in {folder}: `dl2 testbed down` first")
    started = time.perf_counter()
    binaries = build.ensure_binaries(log)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / "etcd-data", ignore_errors=True)
    creds = pki.generate(folder / "pki")
    launch = time.perf_counter()
    procs: dict[str, subprocess.Popen] = {}
    try:
        client, peer = _free_port(), _free_port()
        etcd_url = f"http://127.0.0.1:{client}"
        procs["etcd"] = _start(binaries.path("etcd"), [
            "--name=dl2", f"--data-dir={folder / 'etcd-data'}", f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}", f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}", f"--initial-cluster=dl2=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true", "--log-level=warn"], folder / "etcd.log", detach)
        _wait("etcd", procs["etcd"], folder / "etcd.log", lambda: httpx2.get(f"{etcd_url}/health", timeout=1).status_code == 200)
        port = _free_port()
        server = f"https://127.0.0.1:{port}"
        procs["kube-apiserver"] = _start(binaries.path("kube-apiserver"), [
            f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={port}", f"--tls-cert-file={creds.cert}", f"--tls-private-key-file={creds.key}",
            f"--token-auth-file={creds.token_file}", f"--client-ca-file={creds.ca}", "--authorization-mode=RBAC",
            f"--service-account-key-file={creds.sa_pub}", f"--service-account-signing-key-file={creds.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/16", "--disable-admission-plugins=ServiceAccount",
            "--enable-priority-and-fairness=false", "--profiling=false", "--endpoint-reconciler-type=none",
            "--allow-privileged=true", "-v=1"], folder / "kube-apiserver.log", detach)
        headers = {"Authorization": f"Bearer {creds.token}"}
        tls = ssl.create_default_context(cafile=str(creds.ca))
        _wait("kube-apiserver", procs["kube-apiserver"], folder / "kube-apiserver.log",
              lambda: httpx2.get(f"{server}/readyz", headers=headers, verify=tls, timeout=2).status_code == 200)
        start_s = time.perf_counter() - launch
        kubeconfig = folder / "kubeconfig"
        write_text_atomic(kubeconfig, _kubeconfig(server, creds))
        kwok_port = _free_port()
        procs["kwok"] = _start(binaries.path("kwok"), [
            f"--kubeconfig={kubeconfig}", f"--config={KWOK_STAGES}", f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{kwok_port}", f"--node-port={kwok_port}", "--node-ip=127.0.0.1",
            "--cidr=10.0.0.1/16"], folder / "kwok.log", detach)
        kube = Kube.from_kubeconfig(kubeconfig)
        try:
            install_crd(kube)
        finally:
            kube.close()
        if procs["kwok"].poll() is not None:
            raise Dl2Error(f"kwok exited with code {procs['kwok'].returncode}; see {folder / 'kwok.log'}")
    except BaseException:
        for proc in reversed(procs.values()):
            _stop(proc.pid)
        raise
    testbed = Testbed(folder, server, kubeconfig, {k: p.pid for k, p in procs.items()},
                      {"build_s": binaries.build_seconds, "start_s": start_s, "up_s": time.perf_counter() - started})
    write_json_atomic(folder / STATE_FILE, {**asdict(testbed), "folder": str(folder), "kubeconfig": str(kubeconfig),
                                            "binaries": str(binaries.folder)})
    return testbed


def load(folder: Path | None = None) -> Testbed:
    """The testbed recorded in `folder`; an error if none is recorded there."""
    folder = Path(folder) if folder is not None else default_folder()
    state = folder / STATE_FILE
    if not state.is_file():
        raise Dl2Error(f"no testbed in {folder}: start one with `dl2 testbed up --local`")
    raw = json.loads(state.read_text())
    return Testbed(Path(raw["folder"]), raw["server"], Path(raw["kubeconfig"]), raw["pids"], raw["timings"])


def status(folder: Path | None = None) -> dict:
    """Which of the testbed's processes are alive, and where its kubeconfig is."""
    testbed = load(folder)
    return {"folder": str(testbed.folder), "server": testbed.server, "kubeconfig": str(testbed.kubeconfig),
            "processes": {name: _is_ours(pid, testbed.folder) for name, pid in testbed.pids.items()},
            "timings": testbed.timings}


def down(folder: Path | None = None) -> list[str]:
    """Stop the testbed's processes (only those it started) and forget it; returns what was stopped."""
    testbed = load(folder)
    stopped = [name for name, pid in reversed(list(testbed.pids.items())) if _is_ours(pid, testbed.folder) and _stop(pid)]
    (testbed.folder / STATE_FILE).unlink(missing_ok=True)
    shutil.rmtree(testbed.folder / "etcd-data", ignore_errors=True)
    return stopped


def _alive(folder: Path) -> bool:
    try:
        testbed = load(folder)
    except Dl2Error:
        return False
    return any(_is_ours(pid, testbed.folder) for pid in testbed.pids.values())


def _is_ours(pid: int, folder: Path) -> bool:
    """Whether `pid` is still a process of this testbed (its command line names the folder)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return str(folder) in cmdline


def _stop(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM the process (its own session), then SIGKILL after `timeout`; True if it was running."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            waited = 0 if Path(f"/proc/{pid}").exists() else pid
        if waited == pid or not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return True
