"""Where fine-tuning trains (`finetune.backend`): the simulator, or DL2's decision environment on a Kubernetes
testbed, `BackendEnv` over a `KubeCluster`, whose slots run on the cluster (pods bound, progress counted, clock
in the cluster). What a testbed environment needs (the kubeconfig; on kind, the cluster's pods) is handed in
by whoever started the testbed (`dl2.testbed.running.connection`).

On the local testbed each environment owns one namespace and one pool of KWOK nodes; `KubeEnvFactory`
hands them out, so `Trainer(make_env=KubeEnvFactory(kubeconfig))` fine-tunes online against the testbed,
and `KubeEnvironments(kubeconfig)` gives each fine-tuning run of a stage its own prefix. On the kind
testbed (`KindEnvFactory`, `KindEnvironments`) a run has one environment: its jobs' pods really train on
the cluster's workers, which are one cluster, and its progress is what they trained.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from dl2.backends.kube import KubeCluster
from dl2.backends.workloads import Trained, Workload
from dl2.errors import Dl2Error
from dl2.kube.client import Kube
from dl2.kube.resources import PodCluster, create_nodes, ensure_namespace
from dl2.learn.env import BackendEnv
from dl2.learn.settings import check_backend
from dl2.learn.workflow import EnvFactory, simulator_environments
from dl2.sim.scenario import Scenario
from dl2.workload.presets import Preset
from dl2.workload.traces import Trace


class KubeTraces:
    """`BackendEnv`'s `open_backend` on one namespace and pool: each trace restarts the same `KubeCluster`."""

    def __init__(self, kubeconfig: str | Path, scenario: Scenario, namespace: str, pool: str, workload: Workload | None = None):
        self.backend = KubeCluster.connect(kubeconfig, scenario, namespace, pool, workload)

    def __call__(self, trace: Trace) -> KubeCluster:
        self.backend.restart(trace)
        return self.backend


class KubeEnvFactory:
    """`make_env` for `Trainer`: environment k gets namespace and node pool `<prefix>-k`, nodes per the preset."""

    def __init__(self, kubeconfig: str | Path, prefix: str = "dl2-rl"):
        self.kubeconfig, self.prefix, self.made = str(kubeconfig), prefix, 0

    def __call__(self, traces: Sequence[Trace], scenario: Scenario, window: int, seed: int = 0) -> BackendEnv:
        name = f"{self.prefix}-{self.made}"
        self.made += 1
        p = scenario.preset
        kube = Kube.from_kubeconfig(self.kubeconfig)
        try:
            ensure_namespace(kube, name)
            create_nodes(kube, name, p.num_nodes, p.node_cpu, p.node_gpu)
        finally:
            kube.close()
        return BackendEnv(traces, scenario, window, seed, open_backend=KubeTraces(self.kubeconfig, scenario, name, name))


class KubeEnvironments:
    """`finetune_all`'s environments on the testbed: run `r` trains in namespaces and pools `dl2-<r>-k`."""

    def __init__(self, kubeconfig: str | Path):
        self.kubeconfig = str(kubeconfig)

    def __call__(self, run: str) -> KubeEnvFactory:
        return KubeEnvFactory(self.kubeconfig, prefix=f"dl2-{run}")


def require_cluster_preset(preset: Preset, pods: PodCluster, key: str = "learn.preset") -> None:
    """A Dl2Error naming `key` unless `preset` is the pod cluster's: as many nodes as it has workers, each with
    its CPU and GPU slots."""
    if preset.num_nodes != pods.workers or (preset.node_cpu, preset.node_gpu) != pods.slots_per_node:
        raise Dl2Error(f"{key}: {preset.name!r} has {preset.num_nodes} nodes of {preset.node_cpu} CPU and {preset.node_gpu} "
                       f"GPU slots; the kind testbed has {pods.workers} workers of {pods.slots_per_node[0]} and "
                       f"{pods.slots_per_node[1]}: use the testbed preset (or a preset of that cluster), or bring the testbed "
                       f"up to match (`dl2 testbed up --kind --cpu-slots {preset.node_cpu}`)")


class KindEnvFactory:
    """`make_env` for `Trainer` on a cluster whose pods train (the kind testbed, `pods`): one environment in
    namespace `namespace`, whose DL2Jobs' PS and worker pods train on the cluster's workers for the preset's
    `slot_seconds` each slot. The preset must be the cluster's: as many nodes as it has workers."""

    def __init__(self, pods: PodCluster, namespace: str):
        self.pods, self.namespace, self.made = pods, namespace, 0

    def __call__(self, traces: Sequence[Trace], scenario: Scenario, window: int, seed: int = 0) -> BackendEnv:
        if self.made:
            raise Dl2Error("finetune.num_envs: the kind testbed is one cluster, which one training environment uses "
                           "whole: set finetune.num_envs: 1")
        self.made += 1
        p, pods = scenario.preset, self.pods
        require_cluster_preset(p, pods)
        workload = Trained(self.namespace, scenario.catalog.names, pods.runtime, p.slot_seconds, scenario.options.fine_grained_jct)
        kube = Kube.from_kubeconfig(pods.kubeconfig)
        try:
            ensure_namespace(kube, self.namespace)
        finally:
            kube.close()
        opener = KubeTraces(pods.kubeconfig, scenario, self.namespace, pods.pool, workload)
        return BackendEnv(traces, scenario, window, seed, open_backend=opener)


class KindEnvironments:
    """`finetune_all`'s environments on the kind testbed: run `r` trains in namespace `dl2-<r>`."""

    def __init__(self, pods: PodCluster):
        self.pods = pods

    def __call__(self, run: str) -> KindEnvFactory:
        return KindEnvFactory(self.pods, f"dl2-{run}")


def training_environments(backend: str, kubeconfig: str | Path | None = None,
                          pods: PodCluster | None = None) -> Callable[[str], EnvFactory]:
    """Where `finetune.backend` trains: `environments(run)` gives each run its environments. `sim`: the
    simulator; `k8s`: the local testbed at `kubeconfig`; `kind`: the cluster `pods`, whose pods train.
    `dl2.testbed.running.connection(backend)` gives the running testbed's `kubeconfig` or `pods`."""
    if check_backend(backend) == "sim":
        return simulator_environments
    if backend == "k8s":
        if kubeconfig is None:
            raise Dl2Error("finetune.backend: k8s trains on the local testbed: hand in its kubeconfig (`dl2 testbed up --local` first)")
        return KubeEnvironments(kubeconfig)
    if pods is None:
        raise Dl2Error("finetune.backend: kind trains on the kind testbed: hand in its pods (`dl2 testbed up --kind` first)")
    return KindEnvironments(pods)
