"""The steps of a slot (DESIGN §3): admit arrivals and free the cluster, optionally one bundle per job,
then (after a scheduler allocated) train and complete.

Every path through the simulator chains these same steps: the built-in heuristics' compiled loop
(`dl2.schedulers.heuristics.run_to_completion`), the stepwise backend around any Python scheduler
(`dl2.backends.sim`) and DL2's decision environment (`dl2.learn.env`), so all share one semantics.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl2.sim.placement import commit, demand, reset_cluster, task_log, try_least_loaded
from dl2.sim.state import BUNDLE, PS, WORKER, Cluster, Jobs

# Per-slot statistics, columns of the `stats` array.
STAT_CPU_USED, STAT_GPU_USED, STAT_TASK_CHANGES, STAT_RUNNING, STAT_REWARD = 0, 1, 2, 3, 4
NUM_STATS = 5


@njit(cache=True)
def admit_and_reset(jobs: Jobs, cl: Cluster, slot: int, next_job: int) -> int:
    """Admit jobs arriving by `slot`, take every task away, free the cluster; returns the next job to admit."""
    n = jobs.model.shape[0]
    while next_job < n and jobs.arrival[next_job] <= slot:
        jobs.active[next_job] = True
        next_job += 1
    jobs.workers[:] = 0
    jobs.ps[:] = 0
    reset_cluster(cl)
    return next_job


@njit(cache=True)
def assign_bundles(jobs: Jobs, cl: Cluster) -> None:
    """The authors' "assign bundle": one bundle per uncompleted job, in arrival order, before the policy."""
    tasks = task_log(cl)
    for i in np.flatnonzero(jobs.active):
        cpu, gpu = demand(jobs.worker_demand, jobs.ps_demand, i, BUNDLE)
        node = try_least_loaded(cl.heap, cl.used, cl.capacity, cpu, gpu)
        if node >= 0:
            commit(jobs.workers, jobs.ps, tasks, i, BUNDLE, node)


@njit(cache=True, inline="always")
def restarts(jobs: Jobs, trained: np.ndarray, i: int) -> bool:
    """Whether job i, training this slot, starts a new configuration: its (workers, PS) counts differ from
    those it trained with in the previous slot, `trained[i]` ((0, 0) if it did not train there, so a first
    start is one too). Counts, not placement: the simulator places every task anew each slot, and a job's
    speed depends on its counts alone."""
    return jobs.workers[i] != trained[i, WORKER] or jobs.ps[i] != trained[i, PS]


@njit(cache=True, inline="always")
def starting_fraction(jobs: Jobs, trained: np.ndarray, i: int, lost: tuple[float, float]) -> float:
    """The fraction of this slot job i, training, spends starting, of `lost` (restart, rejoin): 0 if it keeps
    its configuration (`restarts`); rejoin if the new one only removes tasks (no more workers and no more PS
    than `trained[i]`: the survivors meet again, no pod starts); restart if it adds any (a first start too).
    0 whenever both are, without reading `trained`."""
    restart, rejoin = lost
    if (restart == 0.0 and rejoin == 0.0) or not restarts(jobs, trained, i):
        return 0.0
    if jobs.workers[i] <= trained[i, WORKER] and jobs.ps[i] <= trained[i, PS]:
        return rejoin
    return restart


@njit(cache=True, inline="always")
def slot_epochs(jobs: Jobs, table: np.ndarray, i: int, start: float) -> float:
    """The epochs job i, holding a worker and a PS, trains in a whole slot of which it spends the fraction
    `start` starting (`starting_fraction`): the table's, times (1 - `start`)."""
    epochs = table[jobs.model[i], jobs.ps[i], jobs.workers[i]]
    if start > 0.0:
        epochs *= 1.0 - start
    return epochs


@njit(cache=True)
def advance(jobs: Jobs, table: np.ndarray, slot: int, fine_grained: bool, lost: tuple[float, float],
            trained: np.ndarray) -> tuple[int, float]:
    """Train every job that has a worker and a PS for one slot; returns (jobs completed, slot reward: the
    epochs trained as fractions of the epochs schedulers are told).

    Reconfiguration cost: `lost` (restart, rejoin) are the preset's restart and rejoin seconds over its
    slot_seconds (`Scenario.lost`); a job that starts a new configuration (`restarts`) spends the fraction
    `starting_fraction` of the slot starting (restart if it adds a task, rejoin if it only removes some);
    it trains only the slot's rest, so its epochs are the table's times (1 - that), and if it completes, it
    does so at slot - 1 + f + (1 - f) * (the fraction of the rest it needed). `trained` (jobs, 2) holds the
    [workers, PS] each job trained with in the previous slot, and this slot's on return; with both costs 0
    it is neither read nor kept, and the slot trains as it always did."""
    completed, reward = 0, 0.0
    restart = lost[0] > 0.0 or lost[1] > 0.0
    for i in range(jobs.model.shape[0]):
        if not jobs.active[i] or jobs.workers[i] == 0 or jobs.ps[i] == 0:
            if restart:
                trained[i, WORKER] = 0
                trained[i, PS] = 0
            continue
        start = starting_fraction(jobs, trained, i, lost)
        epochs = slot_epochs(jobs, table, i, start)
        if restart:
            trained[i, WORKER] = jobs.workers[i]
            trained[i, PS] = jobs.ps[i]
        if jobs.progress[i] + epochs > jobs.epochs[i]:
            run_fraction = (jobs.epochs[i] - jobs.progress[i]) / epochs
            epochs = jobs.epochs[i] - jobs.progress[i]
            jobs.progress[i] = jobs.epochs[i]
        else:
            jobs.progress[i] += epochs
            run_fraction = 1.0
        reward += epochs / jobs.known_epochs[i]
        if jobs.progress[i] >= jobs.epochs[i]:
            if start > 0.0:
                run_fraction = start + (1.0 - start) * run_fraction
            jobs.end[i] = slot - 1 + run_fraction if fine_grained else slot
            jobs.active[i] = False
            completed += 1
    return completed, reward


def no_training(n: int) -> np.ndarray:
    """`advance`'s `trained` for `n` jobs before their first slot."""
    return np.zeros((n, 2), dtype=np.int64)


@njit(cache=True)
def slot_stats(jobs: Jobs, cl: Cluster, prev_workers: np.ndarray, prev_ps: np.ndarray, out: np.ndarray) -> None:
    """Fill one row of per-slot statistics and remember this slot's allocation."""
    out[STAT_CPU_USED] = cl.used[:, 0].sum()
    out[STAT_GPU_USED] = cl.used[:, 1].sum()
    changes, running = 0, 0
    for i in range(jobs.model.shape[0]):
        changes += abs(jobs.workers[i] - prev_workers[i]) + abs(jobs.ps[i] - prev_ps[i])
        if jobs.workers[i] > 0 and jobs.ps[i] > 0:
            running += 1
        prev_workers[i] = jobs.workers[i]
        prev_ps[i] = jobs.ps[i]
    out[STAT_TASK_CHANGES] = changes
    out[STAT_RUNNING] = running
