"""The Kubernetes objects dl2 reads and writes: paths, and manifests for the CRD, nodes and task pods."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node, NodeStatus

from dl2.errors import Dl2Error
from dl2.kube.client import ApiError, Kube

GROUP, VERSION, PLURAL = "dl2.io", "v1alpha1", "dl2jobs"
CRD_FILE = Path(__file__).with_name("manifests") / "dl2job-crd.yaml"
SCHEDULER_NAME = "dl2"
POOL_LABEL = "dl2.io/pool"  # nodes dl2 schedules onto carry this label
NODE_INDEX_LABEL = "dl2.io/node-index"
JOB_LABEL, ROLE_LABEL = "dl2.io/job", "dl2.io/role"
CPU_SLOTS, GPU_SLOTS = "dl2.io/cpu-slots", "dl2.io/gpu-slots"  # a node's slots (DESIGN §4), as extended resources
GENERATION_LABEL = "dl2.io/generation"  # a trained job's configuration: the slot its PS and workers started in
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
CLOCK = "dl2-clock"  # the ConfigMap holding the slot clock and the slot's allocation
LEASE = "dl2-scheduler"  # the Lease the schedulers of a namespace elect their leader with
TASK_IMAGE = "dl2:latest"
DL2Job = create_namespaced_resource(GROUP, VERSION, "DL2Job", PLURAL)  # lightkube's resource: DL2Job, DL2Job.Status


def scheduler_rbac(namespace: str, account: str = "dl2-scheduler") -> list[dict]:
    """Least privilege for the dl2 scheduler of `namespace`, as service account `account` there: a Role for
    what lives in the namespace (DL2Jobs and their status, task pods and their bindings, the clock
    ConfigMap, the leader Lease) and cluster scope only to read nodes."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": account, "namespace": namespace},
            "rules": [
                {"apiGroups": [GROUP], "resources": [PLURAL, f"{PLURAL}/status"], "verbs": ["get", "list", "watch", "update", "patch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
                {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [CLOCK], "verbs": ["get", "update"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE], "verbs": ["get", "update"]},
            ]}
    nodes_role = f"{account}-{namespace}-nodes"
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        role,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": account, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account}, "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": nodes_role},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": nodes_role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": nodes_role}, "subjects": subject},
    ]


def crd_manifest() -> dict:
    return yaml.safe_load(CRD_FILE.read_text())


def install_crd(kube: Kube, timeout: float = 30.0) -> None:
    """Create (or update) the DL2Job CRD and wait until the API server serves it."""
    crd = crd_manifest()
    kube.apply(crd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = kube.get(CustomResourceDefinition, crd["metadata"]["name"]).get("status", {})
        if any(c["type"] == "Established" and c["status"] == "True" for c in status.get("conditions") or []):
            return
        time.sleep(0.05)
    raise Dl2Error(f"the DL2Job CRD was not established within {timeout:.0f} s")


def ensure_namespace(kube: Kube, namespace: str) -> None:
    try:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except ApiError as exc:
        if exc.status != 409:
            raise


def node_manifest(name: str, index: int, pool: str, cpu: int, gpu: int) -> dict:
    """A KWOK-simulated node with `cpu` CPU slots and `gpu` GPU slots, in dl2 pool `pool`."""
    resources = {"cpu": str(cpu), "memory": "256Gi", "pods": "110", CPU_SLOTS: str(cpu), GPU_SLOTS: str(gpu)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       POOL_LABEL: pool, NODE_INDEX_LABEL: str(index)},
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


def create_nodes(kube: Kube, pool: str, num_nodes: int, cpu: int, gpu: int, timeout: float = 60.0) -> list[str]:
    """Create the pool's KWOK nodes (those missing) and wait until KWOK reports them Ready."""
    names = [f"{pool}-node-{i:03d}" for i in range(num_nodes)]
    for i, name in enumerate(names):
        try:
            kube.create(node_manifest(name, i, pool, cpu, gpu))
        except ApiError as exc:
            if exc.status != 409:
                raise
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = {n["metadata"]["name"] for n in kube.list(Node, labels={POOL_LABEL: pool}) if is_ready(n)}
        if ready.issuperset(names):
            return names
        time.sleep(0.05)
    raise Dl2Error(f"KWOK did not mark the nodes of pool {pool!r} Ready within {timeout:.0f} s (is kwok running? see its log)")


def advertise_slots(kube: Kube, node: str, cpu: int, gpu: int) -> None:
    """Advertise a real node's slots (what the scheduler may place on it) as extended resources, as
    `kubectl patch node --subresource=status` would; the kubelet keeps them and admits pods against them."""
    slots = {CPU_SLOTS: str(cpu), GPU_SLOTS: str(gpu)}
    kube.patch(NodeStatus, node, {"status": {"capacity": slots, "allocatable": slots}})


def slots(node: dict) -> tuple[int, int]:
    """The CPU and GPU slots a node advertises (0 where it advertises none)."""
    allocatable = node.get("status", {}).get("allocatable", {})
    return int(allocatable.get(CPU_SLOTS, 0)), int(allocatable.get(GPU_SLOTS, 0))


def is_ready(node: dict) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return not node.get("spec", {}).get("unschedulable") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def jct_status(jct: float) -> dict:
    """A finished job's JCT in its status: exact (`jct`, what dl2 reads) and as `kubectl get dl2jobs` shows it."""
    return {"jct": jct, "jctSlots": f"{jct:.2f}"}


# What every pod dl2 creates runs as: no root, no privilege escalation, no capabilities, a read-only root.
RESTRICTED_CONTAINER = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
                        "seccompProfile": {"type": "RuntimeDefault"}}


def pod_manifest(job: dict, name: str, role: str, demand: tuple[int, int], container: dict, labels: dict | None = None,
                 volumes: list[dict] | None = None, grace_seconds: int = 0, cpu_millis: int = 0) -> dict:
    """A PS or worker pod of `job` running `container` (image, command, ...), requesting the task's slots and
    left unscheduled for the dl2 scheduler (`schedulerName: dl2`) to bind. `cpu_millis` > 0: the pod may use
    that much CPU (its request and limit, in millicores), so that its speed does not depend on its neighbours'."""
    meta = job["metadata"]
    requests = {CPU_SLOTS: str(demand[0]), GPU_SLOTS: str(demand[1])}
    if cpu_millis > 0:
        requests["cpu"] = f"{cpu_millis}m"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {JOB_LABEL: meta["name"], ROLE_LABEL: role, **(labels or {})},
            "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "DL2Job", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True}],
        },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace_seconds,
            "containers": [{"name": role, "imagePullPolicy": "IfNotPresent", **container,
                            "resources": {"requests": requests, "limits": requests}, "securityContext": RESTRICTED_CONTAINER}],
            "volumes": volumes or [],
        },
    }


@dataclass(frozen=True)
class PodRuntime:
    """How training pods run on a cluster: the image, the interpreter that has dl2 and torch, the volumes
    that bring them (and the shared folder) into the pod, and the shared folder as pods and dl2 see it."""

    image: str
    python: str
    volumes: list[dict]
    volume_mounts: list[dict]
    shared_in_pod: str  # the shared folder's path in a pod
    shared_here: Path  # the same folder, where the scheduler runs
    cpu_millis_per_slot: int = 0  # the CPU a task gets per CPU slot it holds, in millicores (0: no limit)


@dataclass(frozen=True)
class PodCluster:
    """A cluster whose nodes run training pods, as a backend needs it handed in (by the testbed that started it):
    its kubeconfig, the pool its worker nodes carry, how many there are and the slots each advertises, and how
    pods run there."""

    kubeconfig: Path
    pool: str
    workers: int
    slots_per_node: tuple[int, int]  # CPU and GPU slots
    runtime: PodRuntime
