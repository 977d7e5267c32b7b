"""`simulate`: one trace under one scheduler, to a `SimResult` (per-job ends, per-slot statistics)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2.errors import Dl2Error
from dl2.schedulers import BuiltinScheduler, Scheduler, get_scheduler
from dl2.sim import engine
from dl2.sim.backend import SimulatedCluster
from dl2.sim.scenario import Scenario
from dl2.sim.state import make_cluster, make_recorder
from dl2.workload.traces import Trace


@dataclass(frozen=True)
class Decisions:
    """A policy's decisions as (state, action) pairs in DL2's action space (see `dl2.sim.record`)."""

    states: np.ndarray  # float32 (decisions, window, 6)
    actions: np.ndarray  # int64 (decisions,)
    slots: np.ndarray  # int64 (decisions,)
    outside_window: int  # decisions for jobs beyond the window, which the action space cannot express

    @property
    def window(self) -> int:
        return self.states.shape[1]


@dataclass(frozen=True)
class SimResult:
    policy: str
    trace: Trace
    end: np.ndarray  # completion slot per job, in trace order
    stats: np.ndarray  # (slots, engine.NUM_STATS)
    num_nodes: int
    node_capacity: tuple[int, int]
    decisions: Decisions | None = None

    @property
    def jct(self) -> np.ndarray:
        """Job completion time in slots, per job in trace order: end - arrival + 1."""
        return self.end - self.trace.arrival + 1.0

    @property
    def num_slots(self) -> int:
        return self.stats.shape[0]


def simulate(trace: Trace, policy: str | Scheduler, scenario: Scenario, record_window: int | None = None) -> SimResult:
    """Run `trace` to completion under `policy` (a name or a scheduler object).

    Built-in policies run compiled end to end; with `record_window`, their decisions are returned too.
    """
    scheduler = get_scheduler(policy) if isinstance(policy, str) else policy
    if isinstance(scheduler, BuiltinScheduler):
        return _simulate_builtin(trace, scheduler, scenario, record_window)
    if record_window is not None:
        raise Dl2Error("recording decisions is supported for the built-in policies only")
    return _simulate_stepwise(trace, scheduler, scenario)


def _simulate_builtin(trace: Trace, scheduler: BuiltinScheduler, scenario: Scenario, record_window: int | None) -> SimResult:
    p, o = scenario.preset, scenario.options
    capacity = 0 if record_window is None else 64 * len(trace)
    while True:
        jobs, order = scenario.jobs(trace)
        cluster = make_cluster(p.num_nodes, p.node_cpu, p.node_gpu)
        recorder = make_recorder(capacity, record_window or 1)
        stats = np.empty((min(o.max_slots, int(trace.arrival.max()) + 100_000), engine.NUM_STATS))
        slots = engine.run_builtin(
            scheduler.policy_id, jobs, cluster, recorder, scenario.table, scenario.true_table, p.max_tasks, o.fine_grained_jct,
            o.assign_bundle, stats
        )
        if slots < 0:
            raise Dl2Error(f"trace did not finish within {stats.shape[0]} slots under {scheduler.name}")
        if recorder.count[0] <= capacity:
            break
        capacity = int(recorder.count[0])
    decisions = None
    if record_window is not None:
        k = int(recorder.count[0])
        decisions = Decisions(recorder.states[:k], recorder.actions[:k], recorder.slots[:k], int(recorder.outside_window[0]))
    return _result(scheduler.name, trace, jobs.end, order, stats[:slots].copy(), scenario, decisions)


def _simulate_stepwise(trace: Trace, scheduler: Scheduler, scenario: Scenario) -> SimResult:
    backend = SimulatedCluster(trace, scenario)
    while not backend.done:
        backend.apply(scheduler.schedule(backend.observe()))
    return _result(scheduler.name, trace, backend.jobs.end, backend.order, np.array(backend.stats), scenario, None)


def _result(name, trace, end_by_index, order, stats, scenario, decisions) -> SimResult:
    end = np.empty(len(trace))
    end[order] = end_by_index
    p = scenario.preset
    return SimResult(name, trace, end, stats, p.num_nodes, (p.node_cpu, p.node_gpu), decisions)
