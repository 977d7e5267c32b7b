"""The built-in heuristics as compiled per-slot kernels (DESIGN §3: FIFO, SRTF, DRF, Tetris, Optimus).

Each kernel sees the uncompleted jobs (all starting the slot with nothing) and an empty cluster, and
places tasks until its rule says stop. Priority ties break by ascending job id. Every decision that
takes effect is recorded, and the slot's end as void, when the recorder has room. `run_heuristic` runs
one slot of a kernel by id; `run_to_completion` chains the simulator's slot steps around it, entirely in
compiled code.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl2.sim import pqueue
from dl2.sim.engine import STAT_REWARD, admit_and_reset, advance, assign_bundles, slot_stats
from dl2.sim.placement import commit, demand, rebuild_queue, share_of, task_log, try_least_loaded, try_on_node
from dl2.sim.record import record
from dl2.sim.state import BUNDLE, PS, VOID, WORKER, Cluster, Jobs, Recorder

FIFO, SRTF, DRF, TETRIS, OPTIMUS = 0, 1, 2, 3, 4
POLICY_IDS = {"fifo": FIFO, "srtf": SRTF, "drf": DRF, "tetris": TETRIS, "optimus": OPTIMUS}
NO_UTILITY = -2147483647.0


@njit(cache=True)
def _bundles_in_order(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int, order: np.ndarray) -> None:
    """Give each job in `order` up to `max_tasks` bundles; the first failure ends the slot."""
    recording = rec.actions.shape[0] > 0
    tasks = task_log(cl)
    for i in order:
        cpu, gpu = demand(jobs.worker_demand, jobs.ps_demand, i, BUNDLE)
        while jobs.workers[i] < max_tasks and jobs.ps[i] < max_tasks:
            node = try_least_loaded(cl.heap, cl.used, cl.capacity, cpu, gpu)
            if node < 0:
                record(rec, jobs, cl, slot, max_tasks, -1, VOID)
                return
            commit(jobs.workers, jobs.ps, tasks, i, BUNDLE, node)
            if recording:
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
    remaining = 1.0 - jobs.progress[active] / jobs.known_epochs[active]
    _bundles_in_order(jobs, cl, rec, slot, max_tasks, active[np.argsort(remaining, kind="mergesort")])


@njit(cache=True)
def drf(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int) -> None:
    """One bundle at a time to the job with the least dominant share; the first failure ends the slot."""
    recording = rec.actions.shape[0] > 0
    tasks = task_log(cl)
    totals = cl.used.shape[0] * cl.capacity
    key, tie, item = pqueue.new_pqueue(jobs.model.shape[0])
    size = 0
    for i in np.flatnonzero(jobs.active):  # tasks given before the policy (assign bundle) count too
        if jobs.workers[i] < max_tasks and jobs.ps[i] < max_tasks:
            share = share_of(jobs.workers, jobs.ps, jobs.worker_demand, jobs.ps_demand, totals, i)
            size = pqueue.push(key, tie, item, size, share, i, i)
    while size > 0:
        i = item[0]
        cpu, gpu = demand(jobs.worker_demand, jobs.ps_demand, i, BUNDLE)
        node = try_least_loaded(cl.heap, cl.used, cl.capacity, cpu, gpu)
        if node < 0:
            break
        commit(jobs.workers, jobs.ps, tasks, i, BUNDLE, node)
        if recording:
            record_after(rec, jobs, cl, slot, max_tasks, i, BUNDLE)
        if jobs.workers[i] < max_tasks and jobs.ps[i] < max_tasks:
            share = share_of(jobs.workers, jobs.ps, jobs.worker_demand, jobs.ps_demand, totals, i)
            pqueue.replace_top(key, tie, item, size, share, i, i)
        else:
            size = pqueue.pop(key, tie, item, size)
    record(rec, jobs, cl, slot, max_tasks, -1, VOID)


@njit(cache=True, inline="always")
def optimus_utility(table: np.ndarray, model: np.ndarray, epochs: np.ndarray, progress: np.ndarray,
                    workers: np.ndarray, ps: np.ndarray, i: int) -> tuple[float, int]:
    """(priority, role): minus the slots saved by one more worker or PS, whichever saves more."""
    if workers[i] == 0:
        return NO_UTILITY, WORKER
    if ps[i] == 0:
        return NO_UTILITY, PS
    m, p, w = model[i], ps[i], workers[i]
    remaining = max(epochs[i] - progress[i], 0.0)
    base = remaining / table[m, p, w]
    gain_worker = base - remaining / table[m, p, w + 1]
    gain_ps = base - remaining / table[m, p + 1, w]
    if gain_ps >= gain_worker:
        return -gain_ps, PS
    return -gain_worker, WORKER


@njit(cache=True)
def optimus(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int, table: np.ndarray) -> None:
    """One task at a time to the job whose next task saves the most time, until nothing helps."""
    recording = rec.actions.shape[0] > 0
    tasks = task_log(cl)
    model, epochs, progress, workers, ps = jobs.model, jobs.known_epochs, jobs.progress, jobs.workers, jobs.ps
    key, tie, item = pqueue.new_pqueue(model.shape[0])
    size = 0
    role_of = np.zeros(model.shape[0], dtype=np.int64)
    for i in np.flatnonzero(jobs.active):
        priority, role_of[i] = optimus_utility(table, model, epochs, progress, workers, ps, i)
        size = pqueue.push(key, tie, item, size, priority, jobs.idrank[i], i)
    while size > 0:
        if key[0] >= 0:
            break
        i = item[0]
        role = role_of[i]
        if (role == WORKER and workers[i] >= max_tasks) or (role == PS and ps[i] >= max_tasks):
            size = pqueue.pop(key, tie, item, size)
            continue
        cpu, gpu = demand(jobs.worker_demand, jobs.ps_demand, i, role)
        node = try_least_loaded(cl.heap, cl.used, cl.capacity, cpu, gpu)
        if node < 0:
            break
        commit(workers, ps, tasks, i, role, node)
        if recording:
            record_after(rec, jobs, cl, slot, max_tasks, i, role)
        priority, role_of[i] = optimus_utility(table, model, epochs, progress, workers, ps, i)
        pqueue.replace_top(key, tie, item, size, priority, jobs.idrank[i], i)
    record(rec, jobs, cl, slot, max_tasks, -1, VOID)


@njit(cache=True)
def tetris(jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int) -> None:
    """Node by node, bundles to the job with the best alignment + weighted remaining-work score.

    As the DL2 authors coded it: the score rewards *more* remaining work. Per job (in id order) the
    alignment is free_cpu * cpu + free_gpu * gpu and the work (cpu + gpu) * remaining fraction; the work
    and its sum (in id order) are fixed for the slot, and the alignments are integers, so their sum is
    exact in any order.
    """
    active = np.flatnonzero(jobs.active)
    if active.shape[0] == 0:
        return
    recording = rec.actions.shape[0] > 0
    tasks = task_log(cl)
    by_id = active[np.argsort(jobs.idrank[active])]
    count = by_id.shape[0]
    cpu = np.empty(count, dtype=np.int64)
    gpu = np.empty(count, dtype=np.int64)
    work = np.empty(count)
    cpu_sum, gpu_sum, work_sum = 0, 0, 0.0
    for j in range(count):
        i = by_id[j]
        cpu[j], gpu[j] = demand(jobs.worker_demand, jobs.ps_demand, i, BUNDLE)
        work[j] = (cpu[j] + gpu[j]) * max(1.0 - jobs.progress[i] / jobs.known_epochs[i], 0.0)
        cpu_sum += cpu[j]
        gpu_sum += gpu[j]
        work_sum += work[j]
    used, capacity, workers = cl.used, cl.capacity, jobs.workers
    for node in range(used.shape[0]):
        while True:
            free_cpu = capacity[0] - used[node, 0]
            free_gpu = capacity[1] - used[node, 1]
            align_sum = float(free_cpu * cpu_sum + free_gpu * gpu_sum)
            weight = (align_sum / count) / (work_sum / count)
            if weight == 0:
                break
            best, best_score = -1, -np.inf
            for j in range(count):
                if workers[by_id[j]] >= max_tasks:
                    continue
                score = float(free_cpu * cpu[j] + free_gpu * gpu[j]) + weight * work[j]
                if score > best_score:
                    best, best_score = j, score
            if best < 0 or not try_on_node(used, capacity, node, cpu[best], gpu[best]):
                break
            commit(workers, jobs.ps, tasks, by_id[best], BUNDLE, node)
            if recording:
                record_after(rec, jobs, cl, slot, max_tasks, by_id[best], BUNDLE)
    rebuild_queue(cl.heap, used)  # tasks went to chosen nodes: the least-loaded queue follows for whoever places next
    record(rec, jobs, cl, slot, max_tasks, -1, VOID)


@njit(cache=True)
def run_heuristic(policy: int, jobs: Jobs, cl: Cluster, rec: Recorder, slot: int, max_tasks: int, table: np.ndarray) -> None:
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


@njit(cache=True)
def run_to_completion(policy: int, jobs: Jobs, cl: Cluster, rec: Recorder, table: np.ndarray, true_table: np.ndarray,
                      max_tasks: int, fine_grained: bool, assign_bundle: bool, stats: np.ndarray,
                      lost: tuple[float, float]) -> int:
    """Simulate until every job completes under built-in policy `policy`; returns the number of slots, or -1
    past `stats` rows. The policy knows `table`; jobs train at `true_table`, losing a fraction of `lost` (restart,
    rejoin) of a slot to each new configuration (`dl2.sim.engine.advance`)."""
    n = jobs.model.shape[0]
    prev_workers = np.zeros(n, dtype=np.int64)
    prev_ps = np.zeros(n, dtype=np.int64)
    trained = np.zeros((n, 2), dtype=np.int64)
    done = 0
    next_job = slot = np.int64(0)  # not the literal 0, for which numba would compile every callee a second time
    while done < n:
        if slot >= stats.shape[0]:
            return -1
        next_job = admit_and_reset(jobs, cl, slot, next_job)
        if assign_bundle:
            assign_bundles(jobs, cl)
        run_heuristic(policy, jobs, cl, rec, slot, max_tasks, table)
        slot_stats(jobs, cl, prev_workers, prev_ps, stats[slot])
        completed, reward = advance(jobs, true_table, slot, fine_grained, lost, trained)
        stats[slot, STAT_REWARD] = reward
        done += completed
        slot += 1
    return slot
