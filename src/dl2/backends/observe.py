"""What every backend shows a scheduler and what it accepts back: the one `Observation` builder and the one
check of an `Allocation` against the observed jobs and the cluster's capacity."""

from __future__ import annotations

import numpy as np

from dl2.errors import Dl2Error
from dl2.schedulers.base import Allocation, Observation
from dl2.sim.state import Cluster, Jobs


def observation(slot: int, job_ids: np.ndarray, jobs: Jobs, cluster: Cluster, max_tasks: int, table: np.ndarray,
                trained: np.ndarray) -> Observation:
    """The start of `slot` as a scheduler sees it: the uncompleted `jobs` (in (arrival, id) order, with the ids
    `job_ids`) on `cluster`, at most `max_tasks` workers and PS per job, `table` the epochs per slot; `trained`
    is the restart cost's record of their previous slot (`dl2.sim.engine.advance`)."""
    return Observation(slot=slot, job_ids=job_ids, models=jobs.model, arrival=jobs.arrival, progress=jobs.progress.copy(),
                       num_epochs=jobs.known_epochs, worker_demand=jobs.worker_demand, ps_demand=jobs.ps_demand,
                       num_nodes=len(cluster.used), node_capacity=cluster.capacity.copy(), max_tasks=max_tasks,
                       epochs_table=table, _jobs=jobs, _cluster=cluster,
                       _trained=trained.copy())


def check_allocation(obs: Observation, alloc: Allocation) -> None:
    """Refuse an allocation that does not fit what `obs` showed: one count per observed job, at most `max_tasks`
    workers and PS each, tasks placed as counted, no node over its capacity. Every backend calls it before it
    carries an allocation out, so an allocation is refused (never trimmed) everywhere, with the same error."""
    n = len(obs.job_ids)
    if alloc.workers.shape != (n,) or alloc.ps.shape != (n,):
        raise Dl2Error(f"slot {obs.slot}: allocation is for {alloc.workers.shape[0]} jobs, the slot has {n}")
    counts = np.concatenate([alloc.workers, alloc.ps])
    if (counts > obs.max_tasks).any() or (counts < 0).any():
        raise Dl2Error(f"slot {obs.slot}: a job gets more than max_tasks={obs.max_tasks} workers or PS")
    job, role, node = alloc.tasks()
    if ((job < 0) | (job >= n)).any() or ((node < 0) | (node >= obs.num_nodes)).any() or \
            np.bincount(job[role == 0], minlength=n).tolist() != alloc.workers.tolist() or \
            np.bincount(job[role == 1], minlength=n).tolist() != alloc.ps.tolist():
        raise Dl2Error(f"slot {obs.slot}: placed tasks do not match the workers and PS counts")
    demand = np.where(role[:, None] == 0, obs.worker_demand[job], obs.ps_demand[job])
    used = np.zeros((obs.num_nodes, 2), dtype=np.int64)
    np.add.at(used, node, demand)
    if (used > obs.node_capacity).any():
        raise Dl2Error(f"slot {obs.slot}: node {int(np.argwhere(used > obs.node_capacity)[0, 0])} is over capacity")
