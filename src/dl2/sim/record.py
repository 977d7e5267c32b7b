"""Recording decisions as (state, action) pairs in DL2's action space (DESIGN §3 and §5).

The window holds the first `window` uncompleted jobs in arrival order that can still grow (not at the
maximum of both workers and PS). Per window position: job type (model id + 1; 0 = empty), slots since
arrival, remaining-epoch fraction, dominant share, #workers, #PS. Action `3*position + role` adds a
worker (0), a PS (1) or a bundle (2) to that job; `3*window` is void (stop for this slot).
"""

from __future__ import annotations

from numba import njit

from dl2.sim.placement import share_of
from dl2.sim.state import VOID, Cluster, Jobs, Recorder


@njit(cache=True)
def record(rec: Recorder, jobs: Jobs, cl: Cluster, slot: int, max_tasks: int, job: int, role: int) -> None:
    """Record the current state and the decision `role` for `job` (or void: role VOID, job -1)."""
    capacity = rec.actions.shape[0]
    if capacity == 0:
        return
    window = rec.states.shape[1]
    k = rec.count[0]
    workers, ps = jobs.workers, jobs.ps
    totals = cl.used.shape[0] * cl.capacity
    position = -1
    filled = 0
    for i in range(jobs.model.shape[0]):
        if filled == window:
            break
        if not jobs.active[i] or (workers[i] >= max_tasks and ps[i] >= max_tasks):
            continue
        if i == job:
            position = filled
        if k < capacity:
            row = rec.states[k, filled]
            row[0] = jobs.model[i] + 1
            row[1] = slot - jobs.arrival[i]
            row[2] = 1.0 - jobs.progress[i] / jobs.epochs[i]
            row[3] = share_of(workers, ps, jobs.worker_demand, jobs.ps_demand, totals, i)
            row[4] = workers[i]
            row[5] = ps[i]
        filled += 1
    if role != VOID and position < 0:
        rec.outside_window[0] += 1
        return
    if k < capacity:
        rec.states[k, filled:] = 0.0
        rec.actions[k] = 3 * window if role == VOID else 3 * position + role
        rec.slots[k] = slot
    rec.count[0] = k + 1
