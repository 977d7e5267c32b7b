"""DL2's decision environment on a Kubernetes testbed: `BackendEnv` over a `KubeCluster`, whose slots run on
the cluster (pods bound, progress counted, clock in the cluster).

Each environment owns one namespace and one pool of nodes; `KubeEnvFactory` hands them out, so
`Trainer(make_env=KubeEnvFactory(kubeconfig))` fine-tunes online against the testbed, and
`KubeEnvironments(kubeconfig)` gives each fine-tuning run of a stage its own prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dl2.k8s.backend import KubeCluster
from dl2.k8s.client import Kube
from dl2.k8s.resources import create_nodes, ensure_namespace
from dl2.learn.env import BackendEnv
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace


class KubeTraces:
    """`BackendEnv`'s `open_backend` on one namespace and pool: each trace restarts the same `KubeCluster`."""

    def __init__(self, kubeconfig: str | Path, scenario: Scenario, namespace: str, pool: str):
        self.backend = KubeCluster.connect(kubeconfig, scenario, namespace, pool)

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
