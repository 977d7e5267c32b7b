"""The simulator as a backend (`dl2.schedulers.base.Backend`): observe a slot, apply any scheduler's
allocation, advance; and `simulate`, one trace to completion under any scheduler.

This is the path for schedulers written in Python; it runs the same compiled slot steps as the built-in
heuristics' compiled loop (`dl2.sim.engine`), so both give the same results, and `simulate` takes the
compiled loop for a built-in heuristic.
"""

from __future__ import annotations

import numpy as np

from dl2.backends import load_scheduler, loop
from dl2.backends.observe import check_allocation, observation
from dl2.errors import Dl2Error
from dl2.schedulers.base import Allocation, Observation, Scheduler
from dl2.schedulers.builtin import BuiltinScheduler, simulate_builtin
from dl2.sim import engine
from dl2.sim.result import SimResult, sim_result
from dl2.sim.scenario import Scenario
from dl2.sim.state import Cluster, Jobs, make_cluster
from dl2.workload.traces import Trace


def simulate(trace: Trace, policy: str | Scheduler, scenario: Scenario) -> SimResult:
    """Run `trace` to completion under `policy`: a scheduler, or a name `load_scheduler` knows. A built-in
    heuristic runs compiled end to end; any other scheduler slot by slot on `SimulatedCluster`."""
    scheduler = load_scheduler(policy) if isinstance(policy, str) else policy
    if isinstance(scheduler, BuiltinScheduler):
        return simulate_builtin(trace, scheduler.name, scenario)
    backend = SimulatedCluster(trace, scenario)
    loop.run(backend, scheduler)
    return sim_result(scheduler.name, trace, backend.jobs.end, backend.order, np.array(backend.stats), scenario)


class SimulatedCluster:
    """One trace on one simulated cluster, stepped a slot at a time."""

    def __init__(self, trace: Trace, scenario: Scenario):
        self.scenario = scenario
        self.table = scenario.table
        self.jobs, self.order = scenario.jobs(trace)
        self.job_id = trace.job_id[self.order]
        p = scenario.preset
        self.cluster = make_cluster(p.num_nodes, p.node_cpu, p.node_gpu)
        n = len(trace)
        self.slot = 0
        self.completed = 0
        self._next_job = 0
        self._prev_workers = np.zeros(n, dtype=np.int64)
        self._prev_ps = np.zeros(n, dtype=np.int64)
        self._trained = engine.no_training(n)
        self.stats: list[np.ndarray] = []
        self._placed = 0  # tasks the last slot ran

    @property
    def done(self) -> bool:
        return self.completed == len(self.order)

    def observe(self) -> Observation:
        """Start the slot: admit arrivals, free the cluster, and show the uncompleted jobs."""
        if self.slot >= self.scenario.options.max_slots:
            raise Dl2Error(f"trace did not finish within max_slots={self.scenario.options.max_slots}")
        self._next_job = engine.admit_and_reset(self.jobs, self.cluster, self.slot, self._next_job)
        if self.scenario.options.assign_bundle:
            engine.assign_bundles(self.jobs, self.cluster)
        self._active = np.flatnonzero(self.jobs.active)
        self._obs = observation(self.slot, self.job_id[self._active], _compact(self.jobs, self._active),
                                _remap_tasks(self.cluster, self._active), self.scenario.preset.max_tasks, self.table,
                                self._trained[self._active])
        return self._obs

    def resume(self) -> None:
        """Nothing survives a restart of the simulator, so it never holds a committed allocation (`Backend.resume`)."""
        return None

    def census(self) -> dict[str, int]:
        """Jobs by phase (waiting: not arrived; running; done) and the tasks placed in the last slot."""
        n = len(self.order)
        return {"waiting": n - self._next_job, "running": self._next_job - self.completed, "done": self.completed,
                "tasks": self._placed}

    def jct(self) -> dict[int, float]:
        """JCT in slots of every completed job, by job id."""
        done = ~np.isnan(self.jobs.end)
        return dict(zip(self.job_id[done].tolist(), (self.jobs.end - self.jobs.arrival + 1.0)[done].tolist()))

    def apply(self, alloc: Allocation) -> float:
        """Check the allocation, train for one slot, and move to the next; returns the slot's reward."""
        check_allocation(self._obs, alloc)
        self.jobs.workers[self._active] = alloc.workers
        self.jobs.ps[self._active] = alloc.ps
        self.cluster.used[:] = alloc.cluster.used
        self._placed = int(alloc.workers.sum() + alloc.ps.sum())
        row = np.zeros(engine.NUM_STATS)
        engine.slot_stats(self.jobs, self.cluster, self._prev_workers, self._prev_ps, row)
        completed, reward = engine.advance(self.jobs, self.scenario.true_table, self.slot, self.scenario.options.fine_grained_jct,
                                            self.scenario.lost, self._trained)
        row[engine.STAT_REWARD] = reward
        self.stats.append(row)
        self.completed += completed
        self.slot += 1
        return reward


def _compact(jobs: Jobs, idx: np.ndarray) -> Jobs:
    """The uncompleted jobs only, with id ranks renumbered among them (same order)."""
    view = Jobs(*(a[idx] for a in jobs))
    idrank = np.empty(len(idx), dtype=np.int64)
    idrank[np.argsort(view.idrank, kind="stable")] = np.arange(len(idx))
    return view._replace(idrank=idrank)


def _remap_tasks(cluster: Cluster, idx: np.ndarray) -> Cluster:
    """A copy of the cluster whose recorded tasks refer to positions among the uncompleted jobs."""
    position = np.full(int(idx.max()) + 1 if len(idx) else 1, -1, dtype=np.int64)
    position[idx] = np.arange(len(idx))
    copy = Cluster(*(a.copy() for a in cluster))
    k = int(cluster.num_tasks[0])
    copy.task_job[:k] = position[cluster.task_job[:k]]
    return copy
