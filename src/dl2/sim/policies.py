"""The built-in heuristics as compiled per-slot kernels (DESIGN §3: FIFO, SRTF, DRF, Tetris, Optimus).

Each kernel sees the uncompleted jobs (all starting the slot with nothing) and an empty cluster, and
places tasks until its rule says stop. Priority ties break by ascending job id. Every decision that
takes effect is recorded, and the slot's end as void, when the recorder has room.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl2.sim import pqueue
from dl2.sim.placement import dominant_share, place_least_loaded, place_on_node
from dl2.sim.record import record
from dl2.sim.state import BUNDLE, PS, VOID, WORKER, Cluster, Jobs, Recorder

FIFO, SRTF, DRF, TETRIS, OPTIMUS = 0, 1, 2, 3, 4
POLICY_IDS = {"fifo": FIFO, "srtf": SRTF, "drf": DRF, "tetris": TETRIS, "optimus": OPTIMUS}
NO_UTILITY = -2147483647.0


@njit(cache=True)
def _bundles_in_order(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int, order: np.ndarray) -> None:
    """Give each job in `order` up to `max_tasks` bundles; the first failure ends the slot."""
    for i in order:
        for _ in range(max_tasks):
            if not place_least_loaded(jobs, cl, i, BUNDLE):
                record(rec, jobs, cl, slot, max_tasks, -1, VOID)
                return
            record_after(rec, jobs, cl, slot, max_tasks, i, BUNDLE)
    record(rec, jobs, cl, slot, max_tasks, -1, VOID)


@njit(cache=True)
def record_after(rec: Recorder, jobs: Jobs, cl: Cluster, slot: int, max_tasks: int, i: int, role: int) -> None:
    """Record a decision that was just applied, with the state as it was before it."""
    if rec.actions.shape[0] == 0:
        return
    _undo_counts(jobs, i, role, -1)
    record(rec, jobs, cl, slot, max_tasks, i, role)
    _undo_counts(jobs, i, role, 1)


@njit(cache=True)
def _undo_counts(jobs: Jobs, i: int, role: int, sign: int) -> None:
    if role == WORKER or role == BUNDLE:
        jobs.workers[i] += sign
    if role == PS or role == BUNDLE:
        jobs.ps[i] += sign


@njit(cache=True)
def fifo(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int) -> None:
    """Jobs by (arrival, id), each up to the maximum of bundles."""
    _bundles_in_order(jobs, cl, rec, slot, max_tasks, np.flatnonzero(jobs.active))


@njit(cache=True)
def srtf(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int) -> None:
    """Jobs by (remaining-epoch fraction, arrival, id), each up to the maximum of bundles."""
    active = np.flatnonzero(jobs.active)
    remaining = 1.0 - jobs.progress[active] / jobs.epochs[active]
    _bundles_in_order(jobs, cl, rec, slot, max_tasks, active[np.argsort(remaining, kind="mergesort")])


@njit(cache=True)
def drf(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int) -> None:
    """One bundle at a time to the job with the least dominant share; the first failure ends the slot."""
    q = pqueue.new_pqueue(jobs.model.shape[0])
    for i in np.flatnonzero(jobs.active):
        pqueue.push(q, 0.0, i, i)
    while q.size[0] > 0:
        _, i = pqueue.pop(q)
        if not place_least_loaded(jobs, cl, i, BUNDLE):
            break
        record_after(rec, jobs, cl, slot, max_tasks, i, BUNDLE)
        if jobs.workers[i] < max_tasks and jobs.ps[i] < max_tasks:
            pqueue.push(q, dominant_share(jobs, cl, i), i, i)
    record(rec, jobs, cl, slot, max_tasks, -1, VOID)


@njit(cache=True)
def optimus_utility(jobs: Jobs, table: np.ndarray, i: int) -> tuple[float, int]:
    """(priority, role): minus the slots saved by one more worker or PS, whichever saves more."""
    if jobs.workers[i] == 0:
        return NO_UTILITY, WORKER
    if jobs.ps[i] == 0:
        return NO_UTILITY, PS
    m, p, w = jobs.model[i], jobs.ps[i], jobs.workers[i]
    remaining = jobs.epochs[i] - jobs.progress[i]
    base = remaining / table[m, p, w]
    gain_worker = base - remaining / table[m, p, w + 1]
    gain_ps = base - remaining / table[m, p + 1, w]
    if gain_ps >= gain_worker:
        return -gain_ps, PS
    return -gain_worker, WORKER


@njit(cache=True)
def optimus(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int, table: np.ndarray) -> None:
    """One task at a time to the job whose next task saves the most time, until nothing helps."""
    q = pqueue.new_pqueue(jobs.model.shape[0])
    role_of = np.zeros(jobs.model.shape[0], dtype=np.int64)
    for i in np.flatnonzero(jobs.active):
        priority, role_of[i] = optimus_utility(jobs, table, i)
        pqueue.push(q, priority, jobs.idrank[i], i)
    while q.size[0] > 0:
        priority, i = pqueue.pop(q)
        if priority >= 0:
            break
        role = role_of[i]
        if (role == WORKER and jobs.workers[i] >= max_tasks) or (role == PS and jobs.ps[i] >= max_tasks):
            continue
        if not place_least_loaded(jobs, cl, i, role):
            break
        record_after(rec, jobs, cl, slot, max_tasks, i, role)
        priority, role_of[i] = optimus_utility(jobs, table, i)
        pqueue.push(q, priority, jobs.idrank[i], i)
    record(rec, jobs, cl, slot, max_tasks, -1, VOID)


@njit(cache=True)
def tetris(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int) -> None:
    """Node by node, bundles to the job with the best alignment + weighted remaining-work score.

    As the DL2 authors coded it: the score rewards *more* remaining work.
    """
    active = np.flatnonzero(jobs.active)
    if active.shape[0] == 0:
        return
    by_id = active[np.argsort(jobs.idrank[active])]
    num_nodes = cl.used.shape[0]
    align = np.zeros(jobs.model.shape[0])
    work = np.zeros(jobs.model.shape[0])
    for node in range(num_nodes):
        while True:
            free_cpu = cl.capacity[0] - cl.used[node, 0]
            free_gpu = cl.capacity[1] - cl.used[node, 1]
            align_sum, work_sum = 0.0, 0.0
            for i in by_id:
                cpu = jobs.worker_demand[i, 0] + jobs.ps_demand[i, 0]
                gpu = jobs.worker_demand[i, 1] + jobs.ps_demand[i, 1]
                work[i] = (cpu + gpu) * (1.0 - jobs.progress[i] / jobs.epochs[i])
                align[i] = free_cpu * cpu + free_gpu * gpu
                align_sum += align[i]
                work_sum += work[i]
            weight = (align_sum / by_id.shape[0]) / (work_sum / by_id.shape[0])
            if weight == 0:
                break
            best, best_score = -1, -np.inf
            for i in by_id:
                if jobs.workers[i] >= max_tasks:
                    continue
                score = align[i] + weight * work[i]
                if score > best_score:
                    best, best_score = i, score
            if best < 0 or not place_on_node(jobs, cl, best, BUNDLE, node):
                break
            record_after(rec, jobs, cl, slot, max_tasks, best, BUNDLE)
    record(rec, jobs, cl, slot, max_tasks, -1, VOID)


@njit(cache=True)
def run_policy(policy: int, jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int, table: np.ndarray) -> None:
    """Run the kernel of built-in policy `policy` (an id from POLICY_IDS) for one slot."""
    if policy == FIFO:
        fifo(jobs, cl, rec, slot, max_tasks)
    elif policy == SRTF:
        srtf(jobs, cl, rec, slot, max_tasks)
    elif policy == DRF:
        drf(jobs, cl, rec, slot, max_tasks)
    elif policy == TETRIS:
        tetris(jobs, cl, rec, slot, max_tasks)
    elif policy == OPTIMUS:
        optimus(jobs, cl, rec, slot, max_tasks, table)
