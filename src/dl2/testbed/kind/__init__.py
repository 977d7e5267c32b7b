"""The kind testbed: a multi-node kind cluster, built offline where no image registry answers (DESIGN §6).

- `daemon.py`: the private Docker daemon (with a runc wrapper where CAP_SYS_RESOURCE is missing);
- `images.py`: the node image and the training pods' runtime image, built from Debian and Go sources;
- `firewall.py`: the host's iptables rules the testbed adds, and their removal;
- `cluster.py`: `up`, `status`, `down`.

What the scheduler side uses: `load()` (the running cluster: kubeconfig, node names, images),
`runtime_image()`, `pod_volumes()` (the hostPath volumes that give a pod the project's environment and
the shared folder), `SHARED_IN_NODE`.
"""

from __future__ import annotations

from pathlib import Path

from dl2.kube.resources import PodCluster, PodRuntime

from .cluster import (
    CLUSTER,
    POOL,
    SHARED_IN_NODE,
    SLOTS_PER_NODE,
    KindCluster,
    Mount,
    default_folder,
    down,
    environment,
    load,
    mounts,
    status,
    up,
)

__all__ = ["CLUSTER", "POOL", "SLOTS_PER_NODE", "SHARED_IN_NODE", "KindCluster", "Mount", "build", "default_folder", "down",
           "kubeconfig", "load", "mounts", "pod_cluster", "pod_runtime", "pod_volumes", "runtime_image", "status", "up", "worker_nodes"]


def runtime_image(folder: Path | None = None) -> str:
    """The training pods' image in the running cluster (`dl2.local/runtime:<content hash>`)."""
    return load(folder).runtime_image


def kubeconfig(folder: Path | None = None) -> Path:
    """The running cluster's kubeconfig (admin credentials; server: the control plane on the kind network)."""
    return load(folder).kubeconfig


def worker_nodes(folder: Path | None = None) -> list[str]:
    """The workers' node names, in `dl2.io/node-index` order (all labelled `dl2.io/pool=dl2`)."""
    return load(folder).workers


def pod_volumes(folder: Path | None = None) -> tuple[list[dict], list[dict]]:
    """`(volumes, volumeMounts)` for a pod spec: every node mount as a hostPath volume, mounted in the
    container at the same path (the repository, its venv and base Python read-only; /dl2/shared read-write)."""
    volumes, volume_mounts = [], []
    for k, mount in enumerate(load(folder).mounts):
        name = f"dl2-mount-{k}"
        volumes.append({"name": name, "hostPath": {"path": mount.path, "type": "Directory"}})
        volume_mounts.append({"name": name, "mountPath": mount.path, "readOnly": mount.read_only})
    return volumes, volume_mounts


def pod_runtime(folder: Path | None = None) -> PodRuntime:
    """How training pods run on the running cluster: its runtime image, the project's interpreter (mounted from
    the host), the hostPath volumes, and the shared folder as pods and this host see it."""
    cluster = load(folder)
    volumes, volume_mounts = pod_volumes(folder)
    return PodRuntime(image=cluster.runtime_image, python=str(environment() / "bin" / "python"), volumes=volumes,
                      volume_mounts=volume_mounts, shared_in_pod=SHARED_IN_NODE, shared_here=cluster.shared,
                      cpu_millis_per_slot=cluster.cpu_millis_per_slot)


def pod_cluster(folder: Path | None = None) -> PodCluster:
    """The running cluster as a Kubernetes backend needs it handed in: kubeconfig, worker pool and slots, pod runtime."""
    cluster = load(folder)
    return PodCluster(kubeconfig=cluster.kubeconfig, pool=POOL, workers=len(cluster.workers), slots_per_node=cluster.slots_per_node,
                      runtime=pod_runtime(folder))


def build(log=print):
    """Build (or take from the cache) the Go binaries and the offline node and runtime images."""
    from dl2.testbed.build import ensure_binaries

    from .host import ensure_tools
    from .images import ensure_images

    ensure_tools(log)
    binaries = ensure_binaries(log)
    return binaries, ensure_images(binaries, log)
