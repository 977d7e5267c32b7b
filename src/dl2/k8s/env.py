"""DL2's decision environment over a Kubernetes testbed: `DecisionEnv`'s interface (reset/step, masks in
`info`), with every slot carried out by `KubeCluster` (pods bound, progress emulated, clock in the cluster).

Within a slot the policy's decisions are placed locally on the observed (empty) cluster, exactly as in
the simulator's environment; the slot's allocation then goes to the cluster in one `apply`. Each
environment owns one namespace and one pool of KWOK nodes; `KubeEnvFactory` hands them out, so
`Trainer(make_env=KubeEnvFactory(kubeconfig))` fine-tunes online against the testbed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dl2.errors import Dl2Error
from dl2.k8s.backend import KubeCluster
from dl2.k8s.client import Kube
from dl2.k8s.jobs import job_name, submit_trace
from dl2.k8s.resources import CLOCK, JOB_LABEL, configmap_path, create_nodes, ensure_namespace, jobs_path, pods_path
from dl2.learn.env import CONTINUE, DONE, TRUNCATED, DecisionEnv, choose_trace, slot_potential
from dl2.learn.workflow import BACKENDS
from dl2.sim.placement import place_least_loaded
from dl2.sim.scenario import Scenario
from dl2.sim.state import NUM_FEATURES
from dl2.sim.window import action_mask, observe_window
from dl2.workload.traces import Trace


class KubeDecisionEnv:
    """One namespace and node pool of a testbed running traces one after another (Gymnasium-style API)."""

    def __init__(self, traces: Sequence[Trace], scenario: Scenario, window: int = 20, seed: int = 0,
                 shuffle: bool = True, *, kubeconfig: str | Path, namespace: str, pool: str):
        if not traces:
            raise ValueError("KubeDecisionEnv needs at least one trace")
        self.traces, self.scenario, self.window, self.shuffle = list(traces), scenario, window, shuffle
        self.kubeconfig, self.namespace, self.pool = str(kubeconfig), namespace, pool
        self.rng = np.random.default_rng(seed)
        self.max_tasks = scenario.preset.max_tasks
        self.state = np.zeros((window, NUM_FEATURES), dtype=np.float32)
        self.window_jobs = np.full(window, -1, dtype=np.int64)
        self.mask = np.zeros(3 * window + 1, dtype=np.bool_)
        self._next_trace = 0
        self.trace: Trace | None = None
        self._connect()

    def _connect(self) -> None:
        self.kube = Kube.from_kubeconfig(self.kubeconfig)
        self.backend = KubeCluster(self.kube, self.scenario, self.namespace, self.pool)

    def __getstate__(self) -> dict:
        """Checkpoints keep the decisions of the open slot; the connection is made anew on load."""
        return {k: v for k, v in self.__dict__.items() if k not in ("kube", "backend")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._connect()
        if self.trace is not None and not self.backend.done:
            self.backend.observe()  # the open slot was never applied: observe it again

    @property
    def num_actions(self) -> int:
        return 3 * self.window + 1

    @property
    def slot(self) -> int:
        return self.obs.slot

    def reset(self, seed: int | None = None, trace: Trace | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Clear the namespace, submit the next trace as DL2Jobs and run to the first decision."""
        self.trace = trace = choose_trace(self, seed, trace)
        self._clear()
        submit_trace(self.kube, trace, self.scenario.catalog, self.namespace)
        if self._next_decision() != CONTINUE:
            raise RuntimeError("trace has no decision to make")
        return self.state, {"mask": self.mask, "slot": self.slot}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        action = int(action)
        if action < 3 * self.window and self.mask[action]:
            job = int(self.window_jobs[action // 3])
            if place_least_loaded(self.alloc.jobs, self.alloc.cluster, job, action % 3) and self._refresh() > 0:
                return self.state, 0.0, False, False, {"mask": self.mask, "slot": self.slot, "slot_end": False}
        reward = self.backend.apply(self.alloc)
        status = self._next_decision()
        info: dict[str, Any] = {"mask": self.mask, "slot": self.slot, "slot_end": True}
        if status == DONE:
            info["jct"] = self.jct()
        return self.state, reward, status == DONE, status == TRUNCATED, info

    def potential(self, table: np.ndarray) -> float:
        """What the open slot would pay if it ended now, by `table` (for reward shaping)."""
        return slot_potential(self.alloc.jobs, table)

    def jct(self) -> np.ndarray:
        """Per-job JCT of the current trace, in trace order (nan for unfinished jobs)."""
        done = self.backend.jct()
        return np.array([done.get(job_name(int(i)), np.nan) for i in self.trace.job_id])

    def _clear(self) -> None:
        ensure_namespace(self.kube, self.namespace)
        for path in (jobs_path(self.namespace), pods_path(self.namespace)):
            self.kube.request("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
                              params={"labelSelector": JOB_LABEL} if path.endswith("pods") else None)
        self.kube.delete(configmap_path(self.namespace, CLOCK))

    def _refresh(self) -> int:
        observe_window(self.alloc.jobs, self.alloc.cluster, self.obs.slot, self.max_tasks, self.state, self.window_jobs)
        return action_mask(self.alloc.jobs, self.window_jobs, self.max_tasks, self.mask)

    def _next_decision(self) -> int:
        """Run slots with nothing to decide; CONTINUE at the next decision, or DONE / TRUNCATED."""
        while True:
            if self.backend.done:
                return DONE
            if self.backend.slot >= self.scenario.options.max_slots:
                return TRUNCATED
            self.obs = self.backend.observe()
            self.alloc = self.obs.allocation()
            if self._refresh() > 0:
                return CONTINUE
            self.backend.apply(self.alloc)


class KubeEnvFactory:
    """`make_env` for `Trainer`: environment k gets namespace and node pool `<prefix>-k`, nodes per the preset."""

    def __init__(self, kubeconfig: str | Path, prefix: str = "dl2-rl"):
        self.kubeconfig, self.prefix, self.made = str(kubeconfig), prefix, 0

    def __call__(self, traces: Sequence[Trace], scenario: Scenario, window: int, seed: int = 0) -> KubeDecisionEnv:
        name = f"{self.prefix}-{self.made}"
        self.made += 1
        p = scenario.preset
        kube = Kube.from_kubeconfig(self.kubeconfig)
        try:
            ensure_namespace(kube, name)
            create_nodes(kube, name, p.num_nodes, p.node_cpu, p.node_gpu)
        finally:
            kube.close()
        return KubeDecisionEnv(traces, scenario, window, seed, kubeconfig=self.kubeconfig, namespace=name, pool=name)


def environment_factory(backend: str, run: str, kubeconfig: str | Path | None = None, where: str = "params.yaml"):
    """`make_env` for `finetune.backend`: the simulator's `DecisionEnv`, or testbed environments for run `run`
    (namespaces and pools `dl2-<run>-k`) on `kubeconfig`, by default the running local testbed's."""
    if backend == "sim":
        return DecisionEnv
    if backend != "k8s":
        raise Dl2Error(f"{where}: finetune.backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if kubeconfig is None:
        from dl2.k8s import testbed

        kubeconfig = testbed.load().kubeconfig
    return KubeEnvFactory(kubeconfig, prefix=f"dl2-{run}")
