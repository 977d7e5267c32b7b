"""DL2's decision environment on a Kubernetes testbed: `BackendEnv` over a `KubeCluster`, whose slots run on
the cluster (pods bound, progress counted, clock in the cluster).

On the local testbed each environment owns one namespace and one pool of KWOK nodes; `KubeEnvFactory`
hands them out, so `Trainer(make_env=KubeEnvFactory(kubeconfig))` fine-tunes online against the testbed,
and `KubeEnvironments(kubeconfig)` gives each fine-tuning run of a stage its own prefix. On the kind
testbed (`KindEnvFactory`, `KindEnvironments`) a run has one environment: its jobs' pods really train on
the cluster's workers, which are one cluster, and its progress is what they trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dl2.errors import Dl2Error
from dl2.k8s.backend import KubeCluster
from dl2.k8s.client import Kube
from dl2.k8s.resources import create_nodes, ensure_namespace
from dl2.k8s.workloads import Trained, Workload
from dl2.learn.env import BackendEnv
from dl2.sim.scenario import Scenario
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


class KindEnvFactory:
    """`make_env` for `Trainer` on the kind testbed (`dl2 testbed up --kind`, in `folder` or the default): one
    environment in namespace `namespace`, whose DL2Jobs' PS and worker pods train on the cluster's workers for
    the preset's `slot_seconds` each slot. The preset must be the cluster's: as many nodes as it has workers."""

    def __init__(self, folder: str | Path | None, namespace: str):
        self.folder, self.namespace, self.made = None if folder is None else str(folder), namespace, 0

    def __call__(self, traces: Sequence[Trace], scenario: Scenario, window: int, seed: int = 0) -> BackendEnv:
        from dl2.k8s import kind

        if self.made:
            raise Dl2Error("finetune.num_envs: the kind testbed is one cluster, which one training environment uses "
                           "whole: set finetune.num_envs: 1")
        self.made += 1
        cluster = kind.load(self.folder)
        p = scenario.preset
        if p.num_nodes != len(cluster.workers) or (p.node_cpu, p.node_gpu) != kind.SLOTS_PER_NODE:
            raise Dl2Error(f"learn.preset: {p.name!r} has {p.num_nodes} nodes of {p.node_cpu} CPU and {p.node_gpu} GPU slots; "
                           f"the kind testbed has {len(cluster.workers)} workers of {kind.SLOTS_PER_NODE[0]} and "
                           f"{kind.SLOTS_PER_NODE[1]}: use learn.preset: testbed (or a preset of that cluster)")
        workload = Trained(self.namespace, scenario.catalog.names, kind.pod_runtime(self.folder), p.slot_seconds,
                           scenario.options.fine_grained_jct)
        kube = cluster.kube()
        try:
            ensure_namespace(kube, self.namespace)
        finally:
            kube.close()
        opener = KubeTraces(cluster.kubeconfig, scenario, self.namespace, kind.POOL, workload)
        return BackendEnv(traces, scenario, window, seed, open_backend=opener)


class KindEnvironments:
    """`finetune_all`'s environments on the kind testbed: run `r` trains in namespace `dl2-<r>`."""

    def __init__(self, folder: str | Path | None = None):
        self.folder = None if folder is None else str(folder)

    def __call__(self, run: str) -> KindEnvFactory:
        return KindEnvFactory(self.folder, f"dl2-{run}")
