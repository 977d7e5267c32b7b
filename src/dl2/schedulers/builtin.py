"""The built-in heuristics behind the scheduler protocol, and their compiled end-to-end runs."""

from __future__ import annotations

import numpy as np

from dl2.errors import Dl2Error
from dl2.schedulers.base import Allocation, Observation
from dl2.schedulers.heuristics import POLICY_IDS, run_heuristic, run_to_completion
from dl2.schedulers.names import check_policy
from dl2.sim import engine
from dl2.sim.result import Decisions, SimResult, sim_result
from dl2.sim.scenario import Scenario
from dl2.sim.state import make_cluster, make_recorder
from dl2.workload.traces import Trace

BUILTIN_POLICIES = tuple(POLICY_IDS)
_NO_RECORDING = make_recorder(0, 1)


class BuiltinScheduler:
    """FIFO, SRTF, DRF, Tetris or Optimus exactly as DESIGN §3 defines them."""

    def __init__(self, name: str):
        self.name = name
        self.policy_id = POLICY_IDS[name]

    def schedule(self, obs: Observation) -> Allocation:
        alloc = obs.allocation()
        run_heuristic(self.policy_id, alloc.jobs, alloc.cluster, _NO_RECORDING, obs.slot, obs.max_tasks, obs.epochs_table)
        return alloc

    def __repr__(self) -> str:
        return f"BuiltinScheduler({self.name!r})"


def simulate_builtin(trace: Trace, name: str, scenario: Scenario, record_window: int | None = None) -> SimResult:
    """`trace` to completion under built-in policy `name`, compiled end to end; with `record_window`, its
    decisions in DL2's action space for a window of that size are returned too."""
    name = check_policy(name, BUILTIN_POLICIES)
    p, o = scenario.preset, scenario.options
    capacity = 0 if record_window is None else 64 * len(trace)
    while True:
        jobs, order = scenario.jobs(trace)
        cluster = make_cluster(p.num_nodes, p.node_cpu, p.node_gpu)
        recorder = make_recorder(capacity, record_window or 1)
        stats = np.empty((min(o.max_slots, int(trace.arrival.max()) + 100_000), engine.NUM_STATS))
        slots = run_to_completion(POLICY_IDS[name], jobs, cluster, recorder, scenario.table, scenario.true_table,
                                  p.max_tasks, o.fine_grained_jct, o.assign_bundle, stats, scenario.lost)
        if slots < 0:
            raise Dl2Error(f"trace did not finish within {stats.shape[0]} slots under {name}")
        if recorder.count[0] <= capacity:
            break
        capacity = int(recorder.count[0])
    decisions = None
    if record_window is not None:
        k = int(recorder.count[0])
        decisions = Decisions(recorder.states[:k], recorder.actions[:k], recorder.slots[:k], int(recorder.outside_window[0]))
    return sim_result(name, trace, jobs.end, order, stats[:slots].copy(), scenario, decisions)
