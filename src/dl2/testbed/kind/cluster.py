"""The kind cluster's lifecycle: `up`, `status`, `down`, with every step timed and recorded.

`up` starts the private Docker daemon (`daemon.py`), gets the node image (pulled where a registry
answers, else built offline by `images.py`), creates the kind network with FORWARD accepts for its
bridge (`firewall.py`), runs `kind create cluster` (one control plane, N workers labelled for dl2's
pool, every node with the mounts of `mounts()`), gives each node its pod network where kindnetd is not
available, loads the runtime image into the workers, advertises the workers' CPU and GPU slots and installs
the DL2Job CRD. The folder's `kind.json` records what was started (daemon pid and socket, container ids, network,
FORWARD rules), step by step, so `down` from any process removes exactly that, even after a failed `up`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx2
import yaml
from lightkube.resources.core_v1 import Node

from dl2.errors import Dl2Error
from dl2.kube.client import ApiError, Kube
from dl2.kube.resources import NODE_INDEX_LABEL, POOL_LABEL, advertise_slots, install_crd, is_ready, slots
from dl2.paths import repo_root, write_json_atomic, write_text_atomic
from dl2.testbed import build
from dl2.testbed.steps import HEARTBEAT_S, timed_step

from . import daemon as docker_daemon
from . import firewall, host, images
from .daemon import Daemon, run

CLUSTER = "dl2"
POOL = "dl2"
STATE_FILE = "kind.json"
SHARED_IN_NODE = "/dl2/shared"  # the shared read-write folder, at this path in every node (pods: hostPath)
POD_SUBNET = "10.244.0.0/16"  # kind's default; each node gets a /24 of it (spec.podCIDR)
CNI_CONFIG = "/etc/cni/net.d/10-dl2.conflist"
UPSTREAM_NODE_IMAGE = f"kindest/node:{build.KUBERNETES_VERSION}"
UPSTREAM_RUNTIME_BASE = "debian:bookworm-slim"
SLOTS_PER_NODE = (8, 8)  # CPU and GPU slots per worker, as a node of the paper's cluster (DESIGN §4)
RESERVED_MILLIS = 500  # with --isolate: the host's CPU left to the control plane, the kubelets and the scheduler
MIN_MILLIS_PER_SLOT = 10  # with --isolate: less than this per CPU slot and a pod could not even start Python
MODULES = Path("/lib/modules")
SYSTEM_FOLDERS = {"usr", "bin", "sbin", "lib", "lib64", "etc", "var", "opt", "run", "proc", "sys", "dev", "kind"}
READY_TIMEOUT = 300.0

Log = Callable[[str], object]


@dataclass(frozen=True)
class Mount:
    """A host folder bind-mounted into every node at `path` (pods reach it with a hostPath volume)."""

    host: str
    path: str
    read_only: bool


@dataclass(frozen=True)
class KindCluster:
    """A running kind testbed, as `up` recorded it."""

    folder: Path
    name: str
    kubeconfig: Path
    server: str
    control_plane: str
    workers: list[str]  # node names, in dl2.io/node-index order
    node_image: str
    runtime_image: str
    images_source: str  # "built" (offline) or "pulled"
    mounts: list[Mount]
    timings: dict[str, float] = field(default_factory=dict)
    cpu_millis_per_slot: int = 0  # each task pod's CPU per CPU slot it holds, in millicores (0: pods share the host)
    daemon_socket: str = ""  # the private Docker daemon's unix socket
    slots_per_node: tuple[int, int] = SLOTS_PER_NODE  # the CPU and GPU slots each worker advertises

    @property
    def docker(self) -> dict[str, str]:
        """How to reach the private daemon with a Docker client (`docker_access`)."""
        return docker_access(self.daemon_socket)

    @property
    def nodes(self) -> list[str]:
        return [self.control_plane, *self.workers]

    @property
    def shared(self) -> Path:
        """The shared folder on the host; every node (and pod, by hostPath) sees it at SHARED_IN_NODE."""
        return self.folder / "shared"

    def kube(self, **kwargs) -> Kube:
        return Kube.from_kubeconfig(self.kubeconfig, **kwargs)


def docker_access(socket: str | None) -> dict[str, str]:
    """The private daemon's socket, and the `docker ps` that lists its node containers (no other daemon knows them)."""
    if not socket:
        return {}
    return {"socket": socket, "docker_host": f"unix://{socket}", "docker_ps": f"DOCKER_HOST=unix://{socket} docker ps"}


def default_folder() -> Path:
    """Where `dl2 testbed up --kind` keeps its cluster: `DL2_KIND_FOLDER`, else `<testbed cache>/kind`."""
    return Path(os.environ["DL2_KIND_FOLDER"]) if os.environ.get("DL2_KIND_FOLDER") else build.cache_root() / "kind"


def python_prefix(venv: Path) -> Path:
    """The base interpreter's installation that `venv/bin/python` points to (its symlink, resolved)."""
    python = venv / "bin" / "python"
    if not python.exists():
        raise Dl2Error(f"{python} not found: create the environment first (`uv sync` in {repo_root()})")
    prefix = python.resolve().parents[1]
    if prefix == Path("/") or prefix.parts[1] in SYSTEM_FOLDERS:
        raise Dl2Error(f"{venv} runs on the system's Python ({python.resolve()}); the nodes cannot mount {prefix} over "
                       "their own: make the environment from a Python installed under a prefix of its own (uv python "
                       "install, pyenv)")
    return prefix


def environment() -> Path:
    """The project's virtual environment: the running one if this is a venv, else `<repo>/.venv`."""
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix)
    return repo_root() / ".venv"


def mounts(folder: Path) -> list[Mount]:
    """What every node mounts: the shared folder (read-write) and, read-only at the same absolute paths as
    on the host, the repository, its virtual environment and the base Python that environment runs on."""
    venv = environment()
    found = [Mount(str(folder / "shared"), SHARED_IN_NODE, False)]
    for path in (repo_root(), venv, python_prefix(venv)):
        path = path.resolve()
        if not any(m.host == str(path) for m in found):
            found.append(Mount(str(path), str(path), True))
    return found


def _tag(folder: Path) -> str:
    return hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:8]


def _cgroup_v1() -> bool:
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


def kind_config(workers: int, node_mounts: list[Mount], default_cni: bool) -> dict:
    """kind's cluster config: a control plane and `workers` workers labelled for dl2's pool."""
    extra = [{"hostPath": m.host, "containerPath": m.path, **({"readOnly": True} if m.read_only else {})} for m in node_mounts]
    nodes = [{"role": "control-plane", "extraMounts": [dict(m) for m in extra]}]
    nodes += [{"role": "worker", "labels": {POOL_LABEL: POOL, NODE_INDEX_LABEL: str(k)}, "extraMounts": [dict(m) for m in extra]}
              for k in range(workers)]
    config: dict = {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4", "name": CLUSTER,
                    "networking": {"podSubnet": POD_SUBNET, **({} if default_cni else {"disableDefaultCNI": True})},
                    "nodes": nodes}
    if _cgroup_v1():  # the kubelet refuses cgroup v1 unless told not to
        config["kubeadmConfigPatches"] = ["kind: KubeletConfiguration\nfailCgroupV1: false\n"]
    if default_cni and docker_daemon.bounding_set_lacks():
        # kindest/node's containerd may not lower OOM scores without CAP_SYS_RESOURCE (dl2's node image sees to it itself)
        config["containerdConfigPatches"] = ['[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n']
    return config


# -- state


def _save(folder: Path, state: dict) -> None:
    write_json_atomic(folder / STATE_FILE, state)


def _state(folder: Path) -> dict:
    path = folder / STATE_FILE
    if not path.is_file():
        raise Dl2Error(f"no kind testbed in {folder}: start one with `dl2 testbed up --kind`")
    return json.loads(path.read_text())


def load(folder: Path | None = None) -> KindCluster:
    """The cluster `up` recorded in `folder`; an error if none finished starting there."""
    folder = Path(folder or default_folder()).resolve()
    state = _state(folder)
    if not state.get("ready"):
        raise Dl2Error(f"the kind testbed in {folder} did not finish starting: `dl2 testbed down --kind` and up again")
    return KindCluster(folder, state["name"], Path(state["kubeconfig"]), state["server"], state["control_plane"],
                       state["workers"], state["node_image"], state["runtime_image"], state["images_source"],
                       [Mount(**m) for m in state["mounts"]], state["timings"], state.get("cpu_millis_per_slot", 0),
                       state.get("daemon_socket", ""), tuple(state.get("slots_per_node", SLOTS_PER_NODE)))


# -- up


def _registry_reachable(url: str = "https://registry-1.docker.io/v2/") -> bool:
    """Whether Docker Hub's registry answers (any HTTP answer: 401 is its usual one) within a few seconds."""
    try:
        httpx2.get(url, timeout=5.0)
    except httpx2.HTTPError:
        return False
    return True


def _timed(timings: dict[str, float], key: str, log: Log, text: str, action: Callable, heartbeat: bool = True):
    """Run `up`'s step `action` between its progress lines (`timed_step`); its seconds go to `timings[key]`."""
    with timed_step(log, f"[up] {text}", heartbeat_s=HEARTBEAT_S if heartbeat else 0) as took:
        result = action()
    timings[key] = round(took.seconds, 2)
    return result


def host_cores() -> int:
    """The cores this process (and so the kind nodes it starts) may run on."""
    return len(os.sched_getaffinity(0))


def cpu_millis_per_slot(cores: int, workers: int, cpu_slots: int = SLOTS_PER_NODE[0]) -> int:
    """With --isolate, each CPU slot's share of the host in millicores: the host's cores less the control plane's
    reserve, divided evenly over every worker's CPU slots, so that the pods together never ask for more CPU than
    the host has and a job's speed depends on its own slots, not on its neighbours'."""
    millis = (1000 * cores - RESERVED_MILLIS) // (workers * cpu_slots)
    if millis < MIN_MILLIS_PER_SLOT:
        raise Dl2Error(f"--isolate: {cores} core(s) less {RESERVED_MILLIS} m for the control plane over {workers} workers "
                       f"of {cpu_slots} CPU slots leave {max(millis, 0)} m per slot (at least {MIN_MILLIS_PER_SLOT} m): "
                       "use fewer --workers or a host with more cores")
    return millis


def up(folder: Path | None = None, workers: int = 3, log: Log = print, images_source: str | None = None,
       isolate: bool = False, cpu_slots: int = SLOTS_PER_NODE[0]) -> KindCluster:
    """Create the kind testbed in `folder` (default: the cache's `kind/`). `images_source`: "pull", "build" or
    None (pull where a registry answers, else build; `DL2_KIND_IMAGES` sets it too). `isolate`: each task pod
    gets a CPU request and limit of its CPU slots' share of the host (`cpu_millis_per_slot`). `cpu_slots`: the
    CPU slots each worker advertises (a preset of this cluster has `node_cpu` equal to it)."""
    folder = Path(folder or default_folder()).resolve()
    if workers < 1:
        raise Dl2Error(f"--workers must be at least 1 (got {workers})")
    if cpu_slots < 1:
        raise Dl2Error(f"--cpu-slots must be at least 1 (got {cpu_slots})")
    slots_per_node = (cpu_slots, SLOTS_PER_NODE[1])
    cores = host_cores()
    share = cpu_millis_per_slot(cores, workers, cpu_slots) if isolate else 0
    if (folder / STATE_FILE).is_file():
        raise Dl2Error(f"a kind testbed is recorded in {folder}: `dl2 testbed down --kind` first")
    if os.geteuid() != 0:
        raise Dl2Error("`dl2 testbed up --kind` runs a private Docker daemon and edits iptables: run it as root "
                       "(or, with Docker and internet, use deploy/kind-up.sh)")
    source = images_source or os.environ.get("DL2_KIND_IMAGES") or "auto"
    if source not in ("auto", "pull", "build"):
        raise Dl2Error(f"DL2_KIND_IMAGES must be auto, pull or build (got {source!r})")
    host.ensure_tools(log)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shared").mkdir(exist_ok=True)
    (folder / "shared").chmod(0o1777)  # training pods run as a non-root user; sticky: none removes another's files
    node_mounts = mounts(folder)
    state: dict = {"folder": str(folder), "name": CLUSTER, "ready": False, "containers": {}, "forward_rules": [],
                   "mounts": [asdict(m) for m in node_mounts], "timings": timings, "host_cores": cores,
                   "cpu_millis_per_slot": share, "slots_per_node": list(slots_per_node)}
    _save(folder, state)
    try:
        daemon = _timed(timings, "daemon_s", log, "starting the private Docker daemon",
                        lambda: docker_daemon.start(folder, log))
        state.update(daemon_pid=daemon.pid, daemon_socket=str(daemon.socket))
        _save(folder, state)
        log(f"the private Docker daemon: pid {daemon.pid}; its containers: {docker_access(str(daemon.socket))['docker_ps']}")
        pulled = source != "build" and (source == "pull" or _registry_reachable()) and \
            _timed(timings, "pull_s", log, "a registry answers: pulling the images", lambda: _pull(daemon, log, source == "pull"))
        if pulled:
            kind = shutil.which("kind") or str(build.ensure_binaries(log).path("kind"))
            node_image = UPSTREAM_NODE_IMAGE
            runtime_archive, runtime_image = _timed(timings, "runtime_image_s", log, "building the runtime image from "
                                                    f"{UPSTREAM_RUNTIME_BASE}", lambda: _runtime_from_registry(daemon, folder))
        else:
            binaries = _timed(timings, "binaries_s", log, "building the Go binaries (cached after the first time)",
                              lambda: build.ensure_binaries(log), heartbeat=False)
            kind = str(binaries.path("kind"))
            built = _timed(timings, "images_s", log, "building the node and runtime images (cached after the first time)",
                           lambda: images.ensure_images(binaries, log), heartbeat=False)
            node_image, runtime_image, runtime_archive = built.node, built.runtime, built.runtime_archive
            _timed(timings, "node_image_load_s", log, f"loading {node_image} into the daemon",
                   lambda: _load_archive(daemon, node_image, built.node_archive))
        state.update(images_source="pulled" if pulled else "built", node_image=node_image, runtime_image=runtime_image)
        _timed(timings, "network_s", log, "creating the kind network and its FORWARD accepts", lambda: _network(daemon, folder, state))
        config = folder / "kind-config.yaml"
        write_text_atomic(config, yaml.safe_dump(kind_config(workers, node_mounts, default_cni=pulled), sort_keys=False))
        _timed(timings, "kind_create_s", log, f"kind create cluster ({workers} workers; log: {folder / 'kind.log'})",
               lambda: _create(daemon, kind, folder, config, node_image, state))
        kube = _timed(timings, "kubeconfig_s", log, "writing the kubeconfig", lambda: _kubeconfig(daemon, folder, state))
        try:
            if not pulled:
                _timed(timings, "pod_network_s", log, "pod network: each node's bridge conflist and routes to the others",
                       lambda: _pod_network(daemon, kube, state))
            _timed(timings, "runtime_load_s", log, f"loading {runtime_image} into the workers",
                   lambda: run([kind, "load", "image-archive", str(runtime_archive), f"--name={CLUSTER}",
                                f"--nodes={','.join(state['workers'])}"], env=daemon.env(), timeout=900))
            _timed(timings, "nodes_ready_s", log, "waiting for every node to be Ready", lambda: _wait_ready(kube, state))
            _timed(timings, "slots_crd_s", log, f"advertising {slots_per_node[0]} CPU and {slots_per_node[1]} GPU slots per "
                   "worker; installing the DL2Job CRD", lambda: _slots_and_crd(kube, state["workers"], slots_per_node))
        finally:
            kube.close()
    except BaseException:
        log(f"kind testbed: `up` failed; removing what it started (logs stay in {folder})")
        try:
            down(folder)
        except Exception as exc:  # noqa: BLE001 - the original error matters more
            log(f"kind testbed: cleaning up after the failure also failed: {exc}")
        raise
    timings["up_s"] = round(time.perf_counter() - started, 2)
    state["ready"] = True
    _save(folder, state)
    return load(folder)


def _pull(daemon: Daemon, log: Log, required: bool) -> bool:
    """Pull kindest/node and the runtime image's base; False (or an error, if `required`) where that fails."""
    for image in (UPSTREAM_NODE_IMAGE, UPSTREAM_RUNTIME_BASE):
        log(f"pulling {image}")
        done = daemon.docker("pull", image, check=False, timeout=1800)
        if done.returncode != 0:
            if required:
                raise Dl2Error(f"could not pull {image}: {done.stderr.decode(errors='replace').strip()}")
            log(f"could not pull {image}: building the images offline instead")
            return False
    return True


def _runtime_from_registry(daemon: Daemon, folder: Path) -> tuple[Path, str]:
    """The runtime image from debian:bookworm-slim plus the same libraries; named by its content (image id)."""
    context = folder / "runtime-build"
    context.mkdir(exist_ok=True)
    (context / "Dockerfile").write_text(
        f"FROM {UPSTREAM_RUNTIME_BASE}\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
        f"--no-install-recommends {' '.join(images.RUNTIME_PACKAGES)} && rm -rf /var/lib/apt/lists/* && chmod 755 /root\n")
    daemon.docker("build", "-q", "--network=host", "-t", f"{images.RUNTIME_REPOSITORY}:build", str(context), timeout=1800)
    image_id = daemon.docker("image", "inspect", "-f", "{{.Id}}", f"{images.RUNTIME_REPOSITORY}:build").stdout.decode().strip()
    ref = f"{images.RUNTIME_REPOSITORY}:{image_id.split(':')[-1][:12]}"
    daemon.docker("tag", image_id, ref)
    archive = folder / "runtime-image.tar"
    daemon.docker("save", "-o", str(archive), ref, timeout=900)
    return archive, ref


def _load_archive(daemon: Daemon, ref: str, archive: Path) -> None:
    """Load the node image into the daemon unless it holds it already; drop older node images of ours."""
    if daemon.docker("image", "inspect", ref, check=False).returncode != 0:
        daemon.docker("load", "-i", str(archive), timeout=1800)
    repository = ref.rsplit(":", 1)[0]
    held = daemon.docker("images", repository, "--format", "{{.Repository}}:{{.Tag}}").stdout.decode().split()
    for old in sorted(set(held) - {ref}):
        daemon.docker("image", "rm", old, check=False)


def _network(daemon: Daemon, folder: Path, state: dict) -> dict:
    """The `kind` network (kind reuses it), on a bridge named after the folder, with FORWARD accepts."""
    bridge = f"dl2k-{_tag(folder)}"
    if daemon.docker("network", "inspect", "kind", check=False).returncode != 0:
        daemon.docker("network", "create", "-d=bridge", "-o", "com.docker.network.bridge.enable_ip_masquerade=true",
                      "-o", f"com.docker.network.bridge.name={bridge}", "kind")
    raw = json.loads(daemon.docker("network", "inspect", "kind").stdout)[0]
    bridge = raw.get("Options", {}).get("com.docker.network.bridge.name", f"br-{raw['Id'][:12]}")
    state["network"] = {"id": raw["Id"], "bridge": bridge, "subnet": raw["IPAM"]["Config"][0]["Subnet"]}
    state["forward_rules"] = firewall.accept_bridge(bridge, _tag(folder))
    _save(folder, state)
    return state["network"]


def _create(daemon: Daemon, kind: str, folder: Path, config: Path, image: str, state: dict) -> None:
    if not MODULES.exists():  # kind mounts the host's /lib/modules into each node; Docker creates it if missing
        state["created"] = [str(MODULES)]
        _save(folder, state)
    with open(folder / "kind.log", "w") as out:
        done = subprocess.run(
            [kind, "create", "cluster", f"--name={CLUSTER}", f"--config={config}", f"--image={image}",
             f"--kubeconfig={folder / 'kind-kubeconfig'}", "--retain", "--wait=0s", "-v=1"],
            env=daemon.env(), stdout=out, stderr=subprocess.STDOUT, timeout=1200, check=False)
    _record_containers(daemon, folder, state)
    if done.returncode != 0:
        run([kind, "export", "logs", str(folder / "logs"), f"--name={CLUSTER}"], env=daemon.env(), check=False, timeout=300)
        tail = "".join((folder / "kind.log").read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise Dl2Error(f"kind create cluster failed (exit {done.returncode}); node logs in {folder / 'logs'}:\n{tail}")


def _record_containers(daemon: Daemon, folder: Path, state: dict) -> None:
    listed = daemon.docker("ps", "-a", "--filter", f"label=io.x-k8s.kind.cluster={CLUSTER}",
                           "--format", "{{.ID}} {{.Names}}").stdout.decode().split("\n")
    state["containers"] = dict(sorted(line.split()[::-1] for line in listed if line.strip()))
    state["control_plane"] = f"{CLUSTER}-control-plane"
    state["workers"] = sorted((n for n in state["containers"] if n != state["control_plane"]),
                              key=lambda n: int(n.removeprefix(f"{CLUSTER}-worker") or 1))
    _save(folder, state)


def _kubeconfig(daemon: Daemon, folder: Path, state: dict) -> Kube:
    """kind's kubeconfig, pointed at the control plane's address on the kind network (reachable from the host)."""
    config = yaml.safe_load((folder / "kind-kubeconfig").read_text())
    address = _container_ip(daemon, state["control_plane"])
    server = f"https://{address}:6443"
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = server
    path = folder / "kubeconfig"
    write_text_atomic(path, yaml.safe_dump(config))
    path.chmod(0o600)
    state.update(kubeconfig=str(path), server=server)
    _save(folder, state)
    return Kube.from_kubeconfig(path)


def _container_ip(daemon: Daemon, container: str) -> str:
    return daemon.docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                         container).stdout.decode().strip()


def _wait(what: str, check: Callable[[], object], timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except ApiError as exc:
            if exc.status not in (0, 404):
                raise
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise Dl2Error(f"kind testbed: {what} within {timeout:.0f} s")
        time.sleep(1)


def _pod_network(daemon: Daemon, kube: Kube, state: dict) -> None:
    """What kindnetd does: each node bridges its own podCIDR, routes every other node's podCIDR to that node,
    and masquerades pod traffic that leaves the pod network."""

    def assigned():
        nodes = kube.list(Node)
        if len(nodes) == len(state["containers"]) and all(n["spec"].get("podCIDR") for n in nodes):
            return nodes
        return None

    nodes = _wait("every node registered with a podCIDR", assigned, READY_TIMEOUT)
    cidrs = {n["metadata"]["name"]: n["spec"]["podCIDR"] for n in nodes}
    addresses = {n["metadata"]["name"]: next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
                 for n in nodes}
    for name, cidr in cidrs.items():
        conflist = {"cniVersion": "0.4.0", "name": "dl2", "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]}
        routes = "".join(f"ip route replace {other_cidr} via {addresses[other]}\n"
                         for other, other_cidr in cidrs.items() if other != name)
        masquerade = f"-s {POD_SUBNET} ! -d {POD_SUBNET} -m comment --comment dl2-pod-egress -j MASQUERADE"
        script = (f"set -e\nmkdir -p {Path(CNI_CONFIG).parent}\ncat > {CNI_CONFIG}.tmp <<'EOF'\n{json.dumps(conflist, indent=2)}\nEOF\n"
                  f"mv {CNI_CONFIG}.tmp {CNI_CONFIG}\n{routes}"
                  f"iptables -t nat -C POSTROUTING {masquerade} 2>/dev/null || iptables -t nat -A POSTROUTING {masquerade}\n")
        daemon.docker("exec", "-i", name, "sh", "-s", input=script.encode(), timeout=60)
    state["pod_cidrs"] = cidrs
    _save(Path(state["folder"]), state)


def _wait_ready(kube: Kube, state: dict) -> None:
    def ready():
        nodes = kube.list(Node)
        return len(nodes) == len(state["containers"]) and all(is_ready(n) for n in nodes)

    _wait("not every node became Ready", ready, READY_TIMEOUT)
    labelled = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in kube.list(Node)}
    for k, worker in enumerate(state["workers"]):
        labels = labelled.get(worker, {})
        if labels.get(POOL_LABEL) != POOL or labels.get(NODE_INDEX_LABEL) != str(k):
            raise Dl2Error(f"kind testbed: node {worker} lacks the labels {POOL_LABEL}={POOL}, {NODE_INDEX_LABEL}={k}")


def _slots_and_crd(kube: Kube, workers: list[str], slots_per_node: tuple[int, int]) -> None:
    """Each worker's CPU and GPU slots (extended resources, as the Kubernetes docs advertise them), then the CRD."""
    for worker in workers:
        advertise_slots(kube, worker, *slots_per_node)

    def advertised():
        nodes = {n["metadata"]["name"]: n for n in kube.list(Node)}
        return all(slots(nodes[w]) == slots_per_node for w in workers)

    _wait("the workers did not advertise their slots", advertised, 60)
    install_crd(kube)


# -- status and down


def status(folder: Path | None = None) -> dict:
    """What `up` recorded, whether its daemon and containers still run, and the nodes' readiness."""
    folder = Path(folder or default_folder()).resolve()
    state = _state(folder)
    daemon = docker_daemon.load(folder)
    containers: dict[str, str] = {}
    if daemon is not None:
        for name, cid in state.get("containers", {}).items():
            done = daemon.docker("inspect", "-f", "{{.State.Status}}", cid, check=False)
            containers[name] = done.stdout.decode().strip() if done.returncode == 0 else "missing"
    nodes: dict[str, bool] = {}
    if state.get("ready") and daemon is not None:
        kube = Kube.from_kubeconfig(state["kubeconfig"], retries=1)
        try:
            nodes = {n["metadata"]["name"]: is_ready(n) for n in kube.list(Node)}
        except ApiError:
            pass
        finally:
            kube.close()
    return {"folder": str(folder), "name": state["name"], "ready": state.get("ready", False),
            "kubeconfig": state.get("kubeconfig"), "server": state.get("server"), "daemon": daemon is not None,
            "daemon_pid": state.get("daemon_pid"), "docker": docker_access(state.get("daemon_socket")),
            "containers": containers, "nodes_ready": nodes, "node_image": state.get("node_image"),
            "runtime_image": state.get("runtime_image"), "images_source": state.get("images_source"),
            "mounts": state.get("mounts"), "timings": state.get("timings", {}), "host_cores": state.get("host_cores"),
            "cpu_millis_per_slot": state.get("cpu_millis_per_slot", 0),
            "slots_per_node": state.get("slots_per_node", list(SLOTS_PER_NODE))}


def down(folder: Path | None = None) -> list[str]:
    """Remove what `up` started in `folder`: the node containers, the network, the FORWARD rules, the daemon
    (and what it left in iptables). Returns what was removed. The images stay in the daemon's data root."""
    folder = Path(folder or default_folder()).resolve()
    state = _state(folder)
    removed: list[str] = []
    containers = state.get("containers", {})
    daemon = docker_daemon.load(folder)
    if daemon is None and (containers or state.get("network")) and (folder / "docker").is_dir():
        daemon = docker_daemon.start(folder, log=lambda _: None)  # the daemon died: restart it to remove its containers
    if daemon is not None:
        listed = daemon.docker("ps", "-a", "--filter", f"label=io.x-k8s.kind.cluster={CLUSTER}",
                               "--format", "{{.Names}} {{.ID}}").stdout.decode().split("\n")
        named = {**containers, **dict(line.split() for line in listed if line.strip())}  # recorded, and any kind made since
        for name, cid in sorted(named.items()):
            if daemon.docker("rm", "-f", "-v", cid, check=False).returncode == 0:
                removed.append(f"container {name}")
        if state.get("network") and daemon.docker("network", "rm", state["network"]["id"], check=False).returncode == 0:
            removed.append(f"network {state['network']['bridge']}")
    for created in state.get("created", []):  # folders Docker made on the host for our nodes' mounts, if still empty
        path = Path(created)
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
            removed.append(f"folder {path}")
    rules = state.get("forward_rules", []) + firewall.tagged_rules(_tag(folder))
    if firewall.delete_rules(rules):
        removed.append("FORWARD rules")
    removed += docker_daemon.stop(folder)
    for name in ("kubeconfig", "kind-kubeconfig", STATE_FILE):
        (folder / name).unlink(missing_ok=True)
    return removed


def in_pod_network(address: str) -> bool:
    """Whether `address` lies in the cluster's pod network."""
    return ipaddress.ip_address(address) in ipaddress.ip_network(POD_SUBNET)
