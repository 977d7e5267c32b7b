"""DL2's view of a slot: the window of schedulable jobs, its state, and the legal actions (DESIGN §3, §5).

The window holds the first `window` uncompleted jobs in arrival order that can still grow (not at the
maximum of both workers and PS). Per window position, six raw features: job type (model id + 1; 0 for
an empty position), slots since arrival, remaining-epoch fraction (of the epochs the scheduler is told),
dominant share, #workers, #PS.
Action `3*position + role` adds a worker (0), a PS (1) or a bundle (2) to that job; `3*window` is void.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl2.sim.placement import share_of
from dl2.sim.state import Cluster, Jobs


@njit(cache=True)
def observe_window(jobs: Jobs, cl: Cluster, slot: int, max_tasks: int, state: np.ndarray, window_jobs: np.ndarray) -> int:
    """Fill `state` (window, 6) and `window_jobs` (job index per position, -1 if empty); returns how many are filled."""
    window = state.shape[0]
    workers, ps = jobs.workers, jobs.ps
    totals = cl.used.shape[0] * cl.capacity
    filled = 0
    for i in range(jobs.model.shape[0]):
        if filled == window:
            break
        if not jobs.active[i] or (workers[i] >= max_tasks and ps[i] >= max_tasks):
            continue
        row = state[filled]
        row[0] = jobs.model[i] + 1
        row[1] = slot - jobs.arrival[i]
        row[2] = max(1.0 - jobs.progress[i] / jobs.known_epochs[i], 0.0)
        row[3] = share_of(workers, ps, jobs.worker_demand, jobs.ps_demand, totals, i)
        row[4] = workers[i]
        row[5] = ps[i]
        window_jobs[filled] = i
        filled += 1
    state[filled:] = 0.0
    window_jobs[filled:] = -1
    return filled


@njit(cache=True)
def action_mask(jobs: Jobs, window_jobs: np.ndarray, max_tasks: int, mask: np.ndarray) -> int:
    """Legal actions: none for empty positions; no worker/PS/bundle past the maximum; void always. Returns the
    count of legal non-void actions."""
    legal = 0
    for pos in range(window_jobs.shape[0]):
        i = window_jobs[pos]
        worker_ok = i >= 0 and jobs.workers[i] < max_tasks
        ps_ok = i >= 0 and jobs.ps[i] < max_tasks
        mask[3 * pos] = worker_ok
        mask[3 * pos + 1] = ps_ok
        mask[3 * pos + 2] = worker_ok and ps_ok
        legal += worker_ok + ps_ok + (worker_ok and ps_ok)
    mask[3 * window_jobs.shape[0]] = True
    return legal
