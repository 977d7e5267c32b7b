"""A private Docker daemon for the kind testbed: its own data root, exec root, socket and pid file.

kind needs privileged containers. Where the capability bounding set lacks CAP_SYS_RESOURCE (some
sandboxes), runc cannot give a privileged container every capability and `kind create cluster` fails
with "unable to apply caps: operation not permitted". The daemon's default runtime is then a small
wrapper that drops CAP_SYS_RESOURCE from each container's OCI spec before it runs Debian's `runc`.
The wrapper is only put in place where the bounding set lacks the capability.

The daemon's images live in `<folder>/docker` and outlive it, so a later `start` finds the node image
already loaded. `stop` ends exactly the processes `start` recorded (the daemon, the containerd it
manages, and any container shim left behind if the daemon died).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dl2.errors import Dl2Error

from . import firewall

CAP_SYS_RESOURCE = 24
WRAPPER = "runc-dl2"
NAMESPACE = "dl2-kind"  # containerd namespace: apart from any other Docker daemon's, should they share a containerd
START_TIMEOUT = 60.0
INSTALL = "apt-get install docker.io (Debian) or your distribution's Docker Engine"


@dataclass(frozen=True)
class Daemon:
    """A running private dockerd: `docker(...)` runs the Docker client against it."""

    folder: Path
    socket: Path
    exec_root: Path
    pid: int
    cap_fix: bool  # whether the runtime wrapper drops CAP_SYS_RESOURCE

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def env(self) -> dict[str, str]:
        """The environment for a Docker client (or kind) that should talk to this daemon."""
        return {**os.environ, "DOCKER_HOST": self.host}

    def docker(self, *args: str, check: bool = True, timeout: float | None = 600, input: bytes | None = None,
               capture: bool = True) -> subprocess.CompletedProcess:
        """Run `docker ARGS` against this daemon; a failure (when `check`) is a Dl2Error with its output."""
        return run([docker_client(), *args], env=self.env(), check=check, timeout=timeout, input=input, capture=capture)


def run(cmd: Sequence[str], env: dict[str, str] | None = None, check: bool = True, timeout: float | None = 600,
        input: bytes | None = None, capture: bool = True) -> subprocess.CompletedProcess:
    """Run a command; when `check`, a non-zero exit is a Dl2Error that quotes the command and its output."""
    try:
        done = subprocess.run(list(cmd), env=env, input=input, timeout=timeout, check=False,
                              stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)
    except subprocess.TimeoutExpired:
        raise Dl2Error(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from None
    except FileNotFoundError:
        raise Dl2Error(f"`{cmd[0]}` is not installed") from None
    if check and done.returncode != 0:
        output = ((done.stderr or b"") + (done.stdout or b"")).decode(errors="replace").strip()[-2000:]
        raise Dl2Error(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {output}")
    return done


def docker_client() -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise Dl2Error(f"the kind testbed needs the Docker client and daemon: {INSTALL}")
    return docker


def bounding_set_lacks(cap: int = CAP_SYS_RESOURCE) -> bool:
    """Whether this process's capability bounding set (CapBnd in /proc/self/status) lacks `cap`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return not (int(line.split()[1], 16) >> cap) & 1
    return False


def exec_root_for(folder: Path) -> Path:
    """A short exec root (unix socket paths are limited to 108 bytes), one per kind folder."""
    tag = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:10]
    base = Path("/run") if os.access("/run", os.W_OK) else Path("/tmp")
    return base / f"dl2-kind-{tag}"


def _wrapper_text(runc: str) -> str:
    """A runtime wrapper: drop CAP_SYS_RESOURCE from the container's spec (`create`, `run`: the bundle's
    config.json) or from the process of a `docker exec` (`exec --process FILE`), then exec runc."""
    return f"""#!{sys.executable} -I
# Written by dl2 (dl2.testbed.kind.daemon): the capability bounding set here lacks CAP_SYS_RESOURCE, so a
# privileged container or exec asking for it fails; drop it from the OCI spec, then run the real runc.
import json, os, sys
args = sys.argv[1:]

def value(*flags):
    for k, arg in enumerate(args):
        for flag in flags:
            if arg == flag and k + 1 < len(args):
                return args[k + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None

def strip(path, capabilities):
    with open(path) as f:
        spec = json.load(f)
    caps = capabilities(spec) or {{}}
    for kind in caps:
        caps[kind] = [c for c in caps[kind] if c != "CAP_SYS_RESOURCE"]
    with open(path, "w") as f:
        json.dump(spec, f)

if "create" in args or "run" in args:
    strip(os.path.join(value("--bundle", "-b") or ".", "config.json"), lambda s: s.get("process", {{}}).get("capabilities"))
elif "exec" in args and value("--process", "-p"):
    strip(value("--process", "-p"), lambda s: s.get("capabilities"))
os.execv({runc!r}, [{runc!r}, *args])
"""


def _alive(pid: int, needle: str) -> bool:
    """Whether `pid` runs and its command line contains `needle` (so a reused pid is not taken for ours)."""
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


def _ping(socket: Path) -> bool:
    if not socket.exists():
        return False
    done = subprocess.run([docker_client(), "-H", f"unix://{socket}", "version", "--format", "{{.Server.Version}}"],
                          capture_output=True, timeout=15, check=False)
    return done.returncode == 0


def start(folder: Path, log=print) -> Daemon:
    """Start the private daemon for `folder` (or return the one already running there)."""
    folder = folder.resolve()
    state = folder / "daemon.json"
    before = None
    if state.is_file():
        known = load(folder)
        if known is not None:
            return known
        before = json.loads(state.read_text()).get("iptables_before")  # a dead daemon of ours: its chains are still ours
    dockerd, runc = shutil.which("dockerd"), shutil.which("runc")
    if dockerd is None or runc is None:
        raise Dl2Error(f"the kind testbed runs its own Docker daemon: `dockerd` and `runc` are needed ({INSTALL})")
    docker_client()
    folder.mkdir(parents=True, exist_ok=True)
    exec_root = exec_root_for(folder)
    exec_root.mkdir(parents=True, exist_ok=True)
    socket = exec_root / "docker.sock"
    cap_fix = bounding_set_lacks(CAP_SYS_RESOURCE)
    args = [dockerd, f"--data-root={folder / 'docker'}", f"--exec-root={exec_root}", f"--host=unix://{socket}",
            f"--pidfile={exec_root / 'dockerd.pid'}", "--bridge=none", f"--containerd-namespace={NAMESPACE}",
            f"--containerd-plugins-namespace={NAMESPACE}-plugins", "--log-level=warn"]
    if cap_fix:
        wrapper = folder / WRAPPER
        wrapper.write_text(_wrapper_text(runc))
        wrapper.chmod(0o755)
        args += [f"--add-runtime={WRAPPER}={wrapper}", f"--default-runtime={WRAPPER}"]
        log("the capability bounding set lacks CAP_SYS_RESOURCE: containers run through a runc wrapper that drops it")
    if before is None and not firewall.dockerd_running():
        before = firewall.snapshot()  # what this daemon's iptables setup will change
    with open(folder / "dockerd.log", "a") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while not _ping(socket):
        if proc.poll() is not None or time.monotonic() > deadline:
            _terminate(proc.pid)
            if before is not None:
                firewall.restore(before)
            tail = "".join((folder / "dockerd.log").read_text(errors="replace").splitlines(keepends=True)[-8:])
            raise Dl2Error(f"the private dockerd did not start (see {folder / 'dockerd.log'}):\n{tail}")
        time.sleep(0.2)
    daemon = Daemon(folder, socket, exec_root, proc.pid, cap_fix)
    state.write_text(json.dumps({"pid": proc.pid, "socket": str(socket), "exec_root": str(exec_root), "cap_fix": cap_fix,
                                 "data_root": str(folder / "docker"), "iptables_before": before}, indent=2))
    return daemon


def load(folder: Path) -> Daemon | None:
    """The daemon recorded in `folder`, if it still runs."""
    state = folder / "daemon.json"
    if not state.is_file():
        return None
    raw = json.loads(state.read_text())
    if not _alive(raw["pid"], str(folder / "docker")) or not _ping(Path(raw["socket"])):
        return None
    return Daemon(folder, Path(raw["socket"]), Path(raw["exec_root"]), raw["pid"], raw["cap_fix"])


def stop(folder: Path, timeout: float = 30.0) -> list[str]:
    """Stop what `start` started in `folder`: the daemon, its containerd, and orphaned container shims."""
    folder = folder.resolve()
    state = folder / "daemon.json"
    if not state.is_file():
        return []
    raw = json.loads(state.read_text())
    exec_root = Path(raw["exec_root"])
    stopped = []
    if _alive(raw["pid"], str(folder / "docker")) and _terminate(raw["pid"], timeout):
        stopped.append("dockerd")
    for pid in _orphaned_containers(exec_root):  # a container outlives a dead daemon: kill its init (and its pid namespace)
        if _terminate(pid, 10.0, signal.SIGKILL):
            stopped.append(f"container init {pid}")
    for pid, name in _leftovers(exec_root):  # containerd and shims whose command line names our exec root
        if _terminate(pid, 10.0):
            stopped.append(name)
    if raw.get("iptables_before"):
        stopped += firewall.restore(raw["iptables_before"])
    state.unlink(missing_ok=True)
    shutil.rmtree(exec_root, ignore_errors=True)
    return stopped


def _orphaned_containers(exec_root: Path) -> list[int]:
    """Init pids of containers runc still records under our exec root (runc's state.json files)."""
    pids = []
    for state in exec_root.rglob("state.json"):
        try:
            pid = json.loads(state.read_text()).get("init_process_pid")
        except (OSError, ValueError):
            continue
        if isinstance(pid, int) and pid > 1 and Path(f"/proc/{pid}").exists():
            pids.append(pid)
    return pids


def _leftovers(exec_root: Path) -> list[tuple[int, str]]:
    """Processes started for our daemon that outlived it: they name our exec root on their command line."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(exec_root) in cmdline and ("containerd" in cmdline.split(" ")[0]):
            found.append((int(proc.name), Path(cmdline.split(" ")[0]).name))
    return sorted(found, key=lambda item: "shim" not in item[1])  # shims first, then containerd


def _terminate(pid: int, timeout: float = 30.0, sig: int = signal.SIGTERM) -> bool:
    """`sig` (SIGTERM), then SIGKILL after `timeout`; True if the process was running."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        if not Path(f"/proc/{pid}").exists():
            return True
        if _zombie(pid):
            try:
                os.waitpid(pid, os.WNOHANG)  # ours: reap it (else its parent will)
            except ChildProcessError:
                pass
            return True
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True
