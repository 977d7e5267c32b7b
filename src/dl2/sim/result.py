"""What a simulated run leaves: per-job ends, per-slot statistics, and optionally the decisions made."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl2.sim.scenario import Scenario
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


def sim_result(name: str, trace: Trace, end_by_index: np.ndarray, order: np.ndarray, stats: np.ndarray,
               scenario: Scenario, decisions: Decisions | None = None) -> SimResult:
    """A `SimResult` from the simulator's per-job-index ends (`order`: the trace row of each job index)."""
    end = np.empty(len(trace))
    end[order] = end_by_index
    p = scenario.preset
    return SimResult(name, trace, end, stats, p.num_nodes, (p.node_cpu, p.node_gpu), decisions)
