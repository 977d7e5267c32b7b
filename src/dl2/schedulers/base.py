"""The scheduler protocol: an observation of one slot in, an allocation out; and the backend protocol that
carries allocations out.

A scheduler knows nothing of the slot loop. Every slot it gets an `Observation` (the uncompleted jobs,
each starting the slot with no tasks, and an empty cluster) and returns an `Allocation` built with
`obs.allocation()`: how many workers and PS each job gets, and on which nodes. A backend (the simulator,
or Kubernetes) checks and applies it. A complete user policy:

    class ShortestFirst:
        name = "shortest-first"

        def schedule(self, obs):
            alloc = obs.allocation()
            for j in np.argsort(obs.num_epochs - obs.progress, kind="stable"):
                while alloc.add_bundle(j):
                    pass
            return alloc
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dl2.errors import Dl2Error
from dl2.sim.placement import place_least_loaded, place_on_node
from dl2.sim.state import BUNDLE, PS, WORKER, Cluster, Jobs

ROLES = {"worker": WORKER, "ps": PS, "bundle": BUNDLE}


class Allocation:
    """Tasks placed for the observed jobs in one slot (index `j` = position in the observation)."""

    def __init__(self, jobs: Jobs, cluster: Cluster, max_tasks: int):
        self.jobs = jobs
        self.cluster = cluster
        self.max_tasks = max_tasks

    @property
    def workers(self) -> np.ndarray:
        return self.jobs.workers

    @property
    def ps(self) -> np.ndarray:
        return self.jobs.ps

    def _checked(self, j: int, role: str) -> tuple[int, int]:
        """(job position, role code), or a Dl2Error naming the bad argument."""
        if role not in ROLES:
            raise Dl2Error(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
        if not 0 <= int(j) < len(self.jobs.workers):
            raise Dl2Error(f"job: expected a position 0..{len(self.jobs.workers) - 1} in the observation, got {j!r}")
        return int(j), ROLES[role]

    def _room(self, j: int, role: int) -> bool:
        w = self.jobs.workers[j] + (role != PS)
        p = self.jobs.ps[j] + (role != WORKER)
        return w <= self.max_tasks and p <= self.max_tasks

    def add(self, j: int, role: str = "bundle") -> bool:
        """Place a worker, PS or bundle of job `j` on the least-loaded node; False if at the maximum or it does not fit."""
        j, code = self._checked(j, role)
        return self._room(j, code) and place_least_loaded(self.jobs, self.cluster, j, code)

    def add_bundle(self, j: int) -> bool:
        return self.add(j, "bundle")

    def add_worker(self, j: int) -> bool:
        return self.add(j, "worker")

    def add_ps(self, j: int) -> bool:
        return self.add(j, "ps")

    def place(self, j: int, role: str, node: int) -> bool:
        """Place a worker, PS or bundle of job `j` on `node`; False if at the maximum or it does not fit."""
        j, code = self._checked(j, role)
        if not 0 <= int(node) < len(self.cluster.used):
            raise Dl2Error(f"node: expected 0..{len(self.cluster.used) - 1}, got {node!r}")
        return self._room(j, code) and place_on_node(self.jobs, self.cluster, j, code, int(node))

    def tasks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(job position, role 0=worker 1=PS, node) of every task placed."""
        k = int(self.cluster.num_tasks[0])
        return self.cluster.task_job[:k].copy(), self.cluster.task_role[:k].copy(), self.cluster.task_node[:k].copy()


@dataclass(frozen=True)
class Observation:
    """What a scheduler sees at the start of a slot: uncompleted jobs in (arrival, id) order."""

    slot: int
    job_ids: np.ndarray
    models: np.ndarray  # model id per job (catalog index)
    arrival: np.ndarray
    progress: np.ndarray  # epochs trained so far
    num_epochs: np.ndarray
    worker_demand: np.ndarray  # (jobs, 2) [cpu, gpu] slots per worker
    ps_demand: np.ndarray  # (jobs, 2) per PS
    num_nodes: int
    node_capacity: np.ndarray  # (2,) [cpu, gpu] slots per node
    max_tasks: int  # the most workers, and the most PS, per job
    epochs_table: np.ndarray  # [model, #PS, #workers] -> epochs per slot, up to max_tasks + 1
    _jobs: Jobs
    _cluster: Cluster
    _trained: np.ndarray  # what `dl2.sim.engine.advance` holds as `trained` for these jobs (the restart cost)

    def allocation(self) -> Allocation:
        """A fresh allocation to fill (it starts from the tasks already given this slot, usually none)."""
        jobs = Jobs(*(a.copy() for a in self._jobs))
        cluster = Cluster(*(a.copy() for a in self._cluster))
        return Allocation(jobs, cluster, self.max_tasks)


class Scheduler(Protocol):
    """Anything with a `name` and a `schedule(obs) -> Allocation` method."""

    name: str

    def schedule(self, obs: Observation) -> Allocation: ...


class Backend(Protocol):
    """Where allocations are carried out, a slot at a time: the simulator (`dl2.backends.sim`) or a
    Kubernetes namespace (`dl2.backends.kube`); `dl2.backends.loop` runs either. Each slot: `observe()`, then
    `resume()` (the slot's reward if the backend carried out an allocation it had committed for the slot
    before a restart; else None, and a scheduler fills the observation's allocation and `apply(alloc)` runs
    the slot and returns its reward: epochs trained over the epochs each job was told it needs, summed over
    jobs). Both backends refuse an allocation that does not fit the observation with the same error
    (`dl2.backends.observe.check_allocation`)."""

    @property
    def slot(self) -> int: ...

    @property
    def done(self) -> bool: ...

    def observe(self) -> Observation: ...

    def resume(self) -> float | None: ...

    def apply(self, alloc: Allocation) -> float: ...

    def census(self) -> dict[str, int]:
        """Jobs by phase (`waiting`, `running`, `done`) and the `tasks` placed."""

    def jct(self) -> dict[int, float]:
        """JCT in slots of every completed job, by job id."""
