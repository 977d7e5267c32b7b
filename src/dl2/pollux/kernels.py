"""The Pollux world's job model, compiled: measured throughput, gradient statistics, a job's 60 s of
training, its batch size, and the goodput model Pollux plans with. Formulas and the order of their
floating-point operations follow the artifact's (`applications.py`, `simulator.py`, `goodput.py`), so the
deterministic policies give its JCTs to the second.

A job's state lives in `JobArrays`, one entry per job of the workload. Its placement is the number of
GPUs it holds on each node it uses, in the order of its allocation (`counts[j, :nnodes[j]]`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from dl2.pollux.apps import AppTables

EPS = 1e-8  # the artifact's tolerance for ceilings of batch sizes
MAX_PLACEMENT_NODES = 64  # a placement holds at most this many nodes (one GPU on each of 64 nodes)
MAX_PROFILE = 256  # the most distinct (nodes, replicas, local batch size) a job measures
PERF_PARAMS = 7  # alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma
GEOM_POINTS = 50  # batch sizes the goodput model tries between the smallest and largest allowed
_BARY_EPS = 100 * np.finfo(np.float64).eps  # scipy's tolerance for a point on a tetrahedron's face
_BARY_EPS_BROAD = np.sqrt(np.finfo(np.float64).eps)


class JobArrays(NamedTuple):
    """Every job of a workload: what it is, how far it got, what it holds and what it measured."""

    app: np.ndarray  # int64 application id
    submit: np.ndarray  # int64 submission time (s)
    target_bsz: np.ndarray  # int64 total batch size the job keeps (0: the job picks its own, as under Pollux)
    completion: np.ndarray  # int64 completion time (s), -1 until it completes
    rescale: np.ndarray  # int64 seconds of restart left
    counts: np.ndarray  # (J, MAX_PLACEMENT_NODES) int64 GPUs per node of its placement, in allocation order
    nnodes: np.ndarray  # int64 nodes in its placement (0: it holds no GPU)
    atomic_bsz: np.ndarray  # int64 per-GPU batch of one pass
    accum_steps: np.ndarray  # int64 gradient accumulation steps between synchronisations
    progress: np.ndarray  # float64 statistical progress
    epoch: np.ndarray  # int64 epochs completed
    attained: np.ndarray  # float64 GPU-seconds held (restarts included)
    restarts: np.ndarray  # int64 restarts so far (-1: never started)
    grad: np.ndarray  # (J, 2) float64 gradient square and variance last measured
    perf: np.ndarray  # (J, PERF_PARAMS) float64 the throughput model fitted to its measurements
    has_perf: np.ndarray  # bool, whether `perf` holds a fit
    profile: np.ndarray  # (J, MAX_PROFILE, 5) float64 nodes, replicas, local bsz, step time, sync time measured
    profile_count: np.ndarray  # int64 rows of `profile` in use
    step_sync: np.ndarray  # (J, 2) float64 `throughput` of its placement at `step_sync_bsz` (a cache)
    step_sync_bsz: np.ndarray  # int64 the per-GPU batch `step_sync` holds, -1: none (set so when `counts` change)


def make_jobs(app: np.ndarray, submit: np.ndarray, target_bsz: np.ndarray) -> JobArrays:
    """Fresh state for jobs that have not started."""
    n = len(app)
    return JobArrays(
        app=np.asarray(app, dtype=np.int64).copy(), submit=np.asarray(submit, dtype=np.int64).copy(),
        target_bsz=np.asarray(target_bsz, dtype=np.int64).copy(), completion=np.full(n, -1, dtype=np.int64),
        rescale=np.zeros(n, dtype=np.int64), counts=np.zeros((n, MAX_PLACEMENT_NODES), dtype=np.int64),
        nnodes=np.zeros(n, dtype=np.int64), atomic_bsz=np.zeros(n, dtype=np.int64), accum_steps=np.zeros(n, dtype=np.int64),
        progress=np.zeros(n), epoch=np.zeros(n, dtype=np.int64), attained=np.zeros(n),
        restarts=np.full(n, -1, dtype=np.int64), grad=np.full((n, 2), np.nan), perf=np.zeros((n, PERF_PARAMS)),
        has_perf=np.zeros(n, dtype=np.bool_), profile=np.zeros((n, MAX_PROFILE, 5)), profile_count=np.zeros(n, dtype=np.int64),
        step_sync=np.zeros((n, 2)), step_sync_bsz=np.full(n, -1, dtype=np.int64),
    )


# --- measured throughput ---------------------------------------------------------------------------


@njit(cache=True)
def placement_id(counts: np.ndarray) -> int:
    """The placement's id as the measurements name it: its lexicographically smallest rotation, as digits."""
    n = len(counts)
    best = 0
    for start in range(1, n):
        for k in range(n):
            a, b = counts[(start + k) % n], counts[(best + k) % n]
            if a != b:
                if a < b:
                    best = start
                break
    pid = 0
    for k in range(n):
        pid = pid * 10 + counts[(best + k) % n]
    return pid


@njit(cache=True)
def _interp_measured(t: AppTables, row: int, local_bsz: float) -> tuple[float, float]:
    """Linear interpolation in the local batch size over one measured placement's rows (scipy's interp1d)."""
    lo_row, hi_row = t.known_start[row], t.known_start[row + 1]
    x = t.known_rows[lo_row:hi_row, 0]
    if local_bsz < x[0] or local_bsz > x[-1]:
        return np.nan, np.nan
    i = min(max(np.searchsorted(x, local_bsz), 1), len(x) - 1)
    lo, hi = lo_row + i - 1, lo_row + i
    x_lo, x_hi = t.known_rows[lo, 0], t.known_rows[hi, 0]
    step = (t.known_rows[hi, 1] - t.known_rows[lo, 1]) / (x_hi - x_lo) * (local_bsz - x_lo) + t.known_rows[lo, 1]
    sync = (t.known_rows[hi, 2] - t.known_rows[lo, 2]) / (x_hi - x_lo) * (local_bsz - x_lo) + t.known_rows[lo, 2]
    return step, sync


@njit(cache=True)
def _barycentric(t: AppTables, s: int, x: np.ndarray, c: np.ndarray) -> None:
    c[3] = 1.0
    for i in range(3):
        c[i] = 0.0
        for j in range(3):
            c[i] += t.nd_transform[s, i, j] * (x[j] - t.nd_transform[s, 3, j])
        c[3] -= c[i]


@njit(cache=True)
def _inside(c: np.ndarray, k: int, eps: float, broad: float) -> bool:
    return -broad <= c[k] <= 1 + eps


@njit(cache=True)
def _search_all(t: AppTables, x: np.ndarray, c: np.ndarray) -> int:
    """Every tetrahedron in turn; a flat one (no transform) is replaced by its neighbours, with leeway
    towards it."""
    for s in range(len(t.nd_simplices)):
        if not np.isnan(t.nd_transform[s, 0, 0]):
            _barycentric(t, s, x, c)
            if _inside(c, 0, _BARY_EPS, _BARY_EPS) and _inside(c, 1, _BARY_EPS, _BARY_EPS) and \
                    _inside(c, 2, _BARY_EPS, _BARY_EPS) and _inside(c, 3, _BARY_EPS, _BARY_EPS):
                return s
            continue
        for k in range(4):
            other = t.nd_neighbors[s, k]
            if other == -1 or np.isnan(t.nd_transform[other, 0, 0]):
                continue
            _barycentric(t, other, x, c)
            inside = True
            for m in range(4):
                broad = _BARY_EPS_BROAD if t.nd_neighbors[other, m] == s else _BARY_EPS
                if not _inside(c, m, _BARY_EPS, broad):
                    inside = False
                    break
            if inside:
                return other
    return -1


@njit(cache=True)
def _plane_distance(t: AppTables, s: int, z: np.ndarray) -> float:
    dist = t.nd_equations[s, 4]
    for k in range(4):
        dist += t.nd_equations[s, k] * z[k]
    return dist


@njit(cache=True)
def _find_tetrahedron(t: AppTables, x: np.ndarray, c: np.ndarray) -> int:
    """The tetrahedron holding `x`, its barycentric coordinates left in `c`, or -1: scipy's search step for
    step (a walk on the lifted hull towards a facet above the point, then a directed walk, then every
    tetrahedron). Where flat tetrahedra make the interpolant jump, this picks the side scipy picks."""
    for i in range(3):
        if x[i] < t.nd_bounds[0, i] - _BARY_EPS or x[i] > t.nd_bounds[1, i] + _BARY_EPS:
            return -1
    z = np.empty(4)
    z[3] = 0.0
    for i in range(3):
        z[i] = x[i]
        z[3] += x[i] ** 2
    z[3] = z[3] * t.nd_lift[0] + t.nd_lift[1]
    s = 0
    best = _plane_distance(t, s, z)
    changed = True
    while changed and not best > 0:
        changed = False
        for k in range(4):
            other = t.nd_neighbors[s, k]
            if other == -1:
                continue
            dist = _plane_distance(t, other, z)
            if dist > best + _BARY_EPS * (1 + abs(best)):
                s, best, changed = other, dist, True
    for _ in range(1 + len(t.nd_simplices) // 4):
        inside = 1
        for k in range(4):
            if k < 3:
                c[k] = 0.0
                for j in range(3):
                    c[k] += t.nd_transform[s, k, j] * (x[j] - t.nd_transform[s, 3, j])
            else:
                c[3] = 1.0 - c[0] - c[1] - c[2]
            if c[k] < -_BARY_EPS:
                s = t.nd_neighbors[s, k]
                if s == -1:
                    return -1
                inside = -1
                break
            if not c[k] <= 1 + _BARY_EPS:
                inside = 0
        if inside == 1:
            return s
        if inside == 0:
            return _search_all(t, x, c)
    return _search_all(t, x, c)


@njit(cache=True)
def _interp_scaled(t: AppTables, num_nodes: int, num_replicas: int, local_bsz: float) -> tuple[float, float]:
    """Linear interpolation over (nodes, replicas, local batch size) for a placement not measured as such."""
    x = np.array([float(min(num_nodes, 16)), float(num_replicas), local_bsz])
    c = np.empty(4)
    s = _find_tetrahedron(t, x, c)
    if s < 0:
        return np.nan, np.nan
    step, sync = 0.0, 0.0
    for k in range(4):
        v = t.nd_simplices[s, k]
        step += c[k] * t.nd_values[v, 0]
        sync += c[k] * t.nd_values[v, 1]
    return step, sync


@njit(cache=True)
def throughput(t: AppTables, counts: np.ndarray, local_bsz: float) -> tuple[float, float]:
    """(step time, sync time) in seconds of one pass on placement `counts` at `local_bsz` per GPU; NaN
    outside what was measured."""
    pid = placement_id(counts)
    row = np.searchsorted(t.known_ids, pid)
    if row < len(t.known_ids) and t.known_ids[row] == pid:
        return _interp_measured(t, row, local_bsz)
    return _interp_scaled(t, len(counts), counts.sum(), local_bsz)


# --- gradient statistics and iterations --------------------------------------------------------------


@njit(cache=True)
def _bracket(t: AppTables, batch_size: float) -> tuple[int, int]:
    """The measured batch sizes around `batch_size` (equal when it was measured); -1 when outside."""
    lower, upper = -1, -1
    for k in range(len(t.val_bsz)):
        if t.val_bsz[k] <= batch_size:
            lower = k
        if t.val_bsz[k] >= batch_size:
            upper = k
            break
    return lower, upper


@njit(cache=True)
def _between(t: AppTables, table: np.ndarray, batch_size: float, epoch: int) -> float:
    lower, upper = _bracket(t, batch_size)
    if lower < 0 or upper < 0:
        return np.nan
    if lower == upper:
        return table[lower, epoch]
    lo, up = t.val_bsz[lower], t.val_bsz[upper]
    return ((batch_size - lo) * table[upper, epoch] + (up - batch_size) * table[lower, epoch]) / (up - lo)


@njit(cache=True)
def grad_stats(t: AppTables, batch_size: float, epoch: int) -> tuple[float, float]:
    """(gradient square, gradient variance) during `epoch` at total `batch_size`."""
    return _between(t, t.val_grad_sqr, batch_size, epoch), _between(t, t.val_grad_var, batch_size, epoch)


@njit(cache=True)
def iterations(t: AppTables, batch_size: float, epoch: int) -> float:
    """Iterations done by the end of `epoch` at total `batch_size`."""
    return _between(t, t.val_iteration, batch_size, epoch)


# --- the goodput model (what Pollux plans with) --------------------------------------------------------


@njit(cache=True)
def predicted_throughput(perf: np.ndarray, num_nodes: int, num_replicas: int, atomic_bsz: float, accum_steps: float) -> float:
    """Samples per second the fitted model predicts."""
    accum_time = perf[0] + perf[1] * atomic_bsz
    if num_nodes > 1:
        bottleneck, retrogress = perf[2], perf[3]
    elif num_replicas > 1:
        bottleneck, retrogress = perf[4], perf[5]
    else:
        bottleneck, retrogress = 1e-8, 1e-8
    network_time = bottleneck + retrogress * max(num_replicas - 2, 1e-8)
    gamma = perf[6]
    optim_time = np.exp(np.log(accum_time ** gamma + network_time ** gamma) / gamma)
    total_time = accum_steps * accum_time + optim_time
    return num_replicas * atomic_bsz * (accum_steps + 1) / total_time


@njit(cache=True)
def efficiency(grad: np.ndarray, init_bsz: float, batch_size: float) -> float:
    """Statistical efficiency of `batch_size` relative to the initial one, from the gradient noise scale."""
    scale = batch_size / init_bsz
    denom = grad[1] / scale + grad[0]
    gain = (grad[1] + grad[0]) / denom if denom > 0 else 1.0
    return gain / scale


@njit(cache=True)
def _geomspace(start: float, stop: float, out: np.ndarray) -> None:
    """numpy's geomspace(start, stop, len(out)), operation for operation."""
    n = len(out)
    log_start, log_stop = np.log10(start), np.log10(stop)
    step = (log_stop - log_start) / (n - 1)
    for i in range(n):
        y = i * (log_stop - log_start) / (n - 1) if step == 0 else i * step
        out[i] = 10.0 ** (y + log_start)
    out[0] = start
    out[n - 1] = stop


@njit(cache=True)
def best_batch(perf: np.ndarray, grad: np.ndarray, t: AppTables, num_nodes: int, num_replicas: int) -> tuple[float, int, int]:
    """(goodput, atomic batch, accumulation steps) the model predicts best for this many nodes and replicas,
    over 50 total batch sizes from the smallest allowed to the largest measured, with accumulation."""
    min_atomic, max_atomic = t.min_local_bsz, t.max_local_bsz
    sizes = np.empty(GEOM_POINTS)
    _geomspace(max(t.init_bsz, min_atomic * num_replicas), t.max_bsz, sizes)
    best, best_atomic, best_accum = -1.0, 0, 0
    for batch_size in sizes:
        local_bsz = batch_size / num_replicas
        accum = np.ceil(local_bsz / max_atomic - EPS) - 1
        if num_replicas == 1 and local_bsz > t.init_bsz + EPS:
            accum = max(accum, 1.0)
        atomic = np.ceil(local_bsz / (accum + 1) - EPS)
        goodput = 0.0
        if min_atomic <= atomic <= max_atomic:
            total = num_replicas * atomic * (accum + 1)
            goodput = predicted_throughput(perf, num_nodes, num_replicas, atomic, accum) * efficiency(grad, t.init_bsz, total)
        if goodput > best:
            best, best_atomic, best_accum = goodput, int(atomic), int(accum)
    return best, best_atomic, best_accum


# --- a job's batch size and its training -------------------------------------------------------------


@njit(cache=True)
def split_batch(t: AppTables, batch_size: int, replicas: int) -> tuple[int, int]:
    """(atomic batch, accumulation steps) of a total `batch_size` over `replicas` GPUs, before the cap at the
    largest total batch: the fewest accumulation steps whose per-GPU batch was measured."""
    local_bsz = np.ceil(batch_size / replicas - EPS)
    accum = int(np.ceil(local_bsz / t.max_local_bsz - EPS)) - 1
    if replicas == 1 and batch_size > t.init_bsz:
        accum = max(1, accum)
    return int(np.ceil(local_bsz / (accum + 1) - EPS)), accum


@njit(cache=True)
def set_batch(jobs: JobArrays, j: int, t: AppTables) -> None:
    """The job's atomic batch and accumulation steps on its placement: its target batch size split over its
    GPUs, or, for a job that picks its own, the best the fitted model predicts (before any fit: the
    smallest that uses every GPU)."""
    n = jobs.nnodes[j]
    replicas = jobs.counts[j, :n].sum()
    batch_size = jobs.target_bsz[j]
    if batch_size == 0 and not jobs.has_perf[j]:
        batch_size = max(int(t.init_bsz), int(t.min_local_bsz) * replicas)
    if batch_size == 0:
        _, atomic, accum = best_batch(jobs.perf[j], jobs.grad[j], t, n, replicas)
    else:
        atomic, accum = split_batch(t, batch_size, replicas)
    count = replicas * (accum + 1)
    jobs.atomic_bsz[j] = min(atomic, int(t.max_bsz / count))
    jobs.accum_steps[j] = accum


@njit(cache=True)
def _measure(jobs: JobArrays, j: int, n: int, replicas: int, step: float, sync: float) -> bool:
    """Record a configuration's step and sync time; True when the job had not measured it before."""
    atomic = jobs.atomic_bsz[j]
    for k in range(jobs.profile_count[j]):
        row = jobs.profile[j, k]
        if row[0] == n and row[1] == replicas and row[2] == atomic:
            return False
    k = jobs.profile_count[j]
    if k == MAX_PROFILE:
        raise ValueError("a job measured more configurations than MAX_PROFILE")
    jobs.profile[j, k, 0], jobs.profile[j, k, 1], jobs.profile[j, k, 2] = n, replicas, atomic
    jobs.profile[j, k, 3], jobs.profile[j, k, 4] = step, sync
    jobs.profile_count[j] = k + 1
    return True


@njit(cache=True)
def advance(jobs: JobArrays, j: int, seconds: int, now: int, t: AppTables, measure: bool) -> tuple[bool, int, int]:
    """Train job `j` for `seconds` from time `now` on its placement: first what is left of a restart, then
    at its true goodput, an epoch at a time (an epoch ends on a whole second).

    With `measure`, the job records every new configuration's throughput; when it meets one, it pauses
    after that stretch of training, so that its model is refitted (and its batch size chosen again) before
    it goes on. Returns (paused, seconds left, time): call it again with the last two after the refit."""
    n = jobs.nnodes[j]
    if n == 0:
        return False, 0, now + seconds
    counts = jobs.counts[j, :n]
    replicas = counts.sum()
    delay = min(jobs.rescale[j], seconds)
    now += delay
    jobs.attained[j] += delay * replicas
    jobs.rescale[j] -= delay
    seconds -= delay
    while seconds > 0 and jobs.completion[j] < 0:
        atomic, accum, epoch = jobs.atomic_bsz[j], jobs.accum_steps[j], jobs.epoch[j]
        batch_size = replicas * atomic * (accum + 1)
        scale = batch_size / t.init_bsz
        if jobs.step_sync_bsz[j] == atomic:  # the placement's throughput at this batch, as computed before
            step, sync = jobs.step_sync[j, 0], jobs.step_sync[j, 1]
        else:
            step, sync = throughput(t, counts, float(atomic))
            jobs.step_sync[j, 0], jobs.step_sync[j, 1], jobs.step_sync_bsz[j] = step, sync, atomic
        if np.isnan(step):
            raise ValueError("a placement and batch size outside the measured throughput")
        sqr, var = grad_stats(t, float(batch_size), epoch)
        gain = (var + sqr) / (var / scale + sqr)
        fresh = False
        if measure:
            jobs.grad[j, 0], jobs.grad[j, 1] = sqr, var
            fresh = _measure(jobs, j, n, replicas, step, sync)
        goodput = gain / (step + (step - sync) * accum)
        next_progress = t.progress_at[epoch + 1]
        if jobs.progress[j] + goodput * seconds < next_progress:
            jobs.progress[j] += goodput * seconds
            now += seconds
            jobs.attained[j] += seconds * replicas
            seconds = 0
        else:
            jobs.epoch[j] = epoch + 1
            delta = int(np.rint((next_progress - jobs.progress[j]) / goodput))
            if epoch + 1 > t.max_epochs - 1:
                jobs.completion[j] = now + delta
            jobs.progress[j] = next_progress
            now += delta
            jobs.attained[j] += delta * replicas
            seconds -= delta
        if fresh:
            return True, seconds, now
        set_batch(jobs, j, t)
    return False, 0, now + seconds


@njit(cache=True)
def advance_all(jobs: JobArrays, seconds: int, now: int, apps: tuple, measure: bool, left: np.ndarray, clock: np.ndarray) -> None:
    """`advance` every job for `seconds` from `now`. A job that paused for a refit leaves in `left[j]` the
    seconds it still has to train and in `clock[j]` the time it paused at (`left[j]` is -1 for the others)."""
    for j in range(len(jobs.app)):
        paused, rest, at = advance(jobs, j, seconds, now, apps[jobs.app[j]], measure)
        left[j] = rest if paused else -1
        clock[j] = at
