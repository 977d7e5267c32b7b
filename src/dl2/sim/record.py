"""Recording decisions as (state, action) pairs in DL2's action space (see `dl2.sim.window`)."""

from __future__ import annotations

import numpy as np
from numba import njit

from dl2.sim.state import VOID, Cluster, Jobs, Recorder
from dl2.sim.window import observe_window


@njit(cache=True)
def record(rec: Recorder, jobs: Jobs, cl: Cluster, slot: int, max_tasks: int, job: int, role: int) -> None:
    """Record the current state and the decision `role` for `job` (or void: role VOID, job -1)."""
    capacity = rec.actions.shape[0]
    if capacity == 0:
        return
    window = rec.states.shape[1]
    k = rec.count[0]
    state = rec.states[k] if k < capacity else np.zeros((window, rec.states.shape[2]), dtype=rec.states.dtype)
    window_jobs = np.empty(window, dtype=np.int64)
    observe_window(jobs, cl, slot, max_tasks, state, window_jobs)
    position = -1
    for pos in range(window):
        if window_jobs[pos] == job:
            position = pos
    if role != VOID and position < 0:
        rec.outside_window[0] += 1
        return
    if k < capacity:
        rec.actions[k] = 3 * window if role == VOID else 3 * position + role
        rec.slots[k] = slot
    rec.count[0] = k + 1
