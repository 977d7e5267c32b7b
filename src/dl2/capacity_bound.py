"""A capacity-aware lower bound on average JCT in the PS/worker world: the LP relaxation of the slot-by-slot
allocation, solved with HiGHS (through SciPy).

The model (docs/bounds.md derives each step). Job j arrives at slot a_j and needs E_j epochs; in config k
(a #PS and #workers of its model that fits the empty cluster) it trains s_k epochs per slot (the
scenario's true speeds) and holds d_k CPU and GPU slots. x[j, t, k] >= 0 is the share of slot t job j
spends in config k, sum_k x[j, t, k] <= 1, and in every slot the jobs hold at most the cluster's CPU and
GPU slots in all (nodes pooled: a relaxation). y[j, t] = sum_k x[j, t, k] s_k / E_j, the share of the
job done in slot t, sums to 1 over the slots t < H and an uncapacitated tail [H, inf) counted at time H.

Any schedule's completion time C_j (slot t's share finishing at t + r) satisfies
- C_j >= a_j + L_j (+ the restart fraction: a job's first slot always starts its pods), L_j = E_j over its
  best speed: the contention-free bound (`dl2.metrics.lower_bound_jct`);
- C_j >= (the mean time of its work) + L_j / 2, as the job never does more than 1 / L_j of itself per unit
  time; the work of a slot it does not finish in has mean time >= t + 1/2 (the slot trains at one rate,
  from t or, after a restart, later), and of its last slot >= t + y L_j / 2, which falls short of
  t + 1/2 by at most `_last_slot_slack`;
- more sharply, C_j >= (the mean time of its work) + Q(w), w[k] the share of the job done in config k and
  Q convex (`_tangent`): L_j / 2 when all is done at the best speed, more when slower configs do some. The
  LP holds Q's tangent at the best config from the start and adds, a few rounds, the tangent at each job's
  shares where the solution violates it (a cutting-plane outer approximation: every tangent is valid).

The LP minimises sum_j (c_j - a_j) under these; with integer JCT (whole slots) c_j - a_j is also at least
the contention-free ceil. Configs no schedule needs are dropped first: those a mix of the model's other
configs (weights summing to at most 1) beats with no more of either resource (`useful_configs`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import sparse
from scipy.optimize import linprog
from scipy.spatial import ConvexHull

from dl2.errors import Dl2Error
from dl2.metrics import _fits_alone
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace

HIGHS_OPTIONS = {"presolve": True, "primal_feasibility_tolerance": 1e-9, "dual_feasibility_tolerance": 1e-9}
TAIL_TOLERANCE = 1e-9  # a job's share left to the tail below this counts as none (any horizon gives a valid bound)
MAX_DOUBLINGS = 12  # the horizon doubles until no job leaves work to the tail, at most this often
MAX_CUT_ROUNDS = 4  # rounds of tangent cuts (any number gives a valid bound; on dev, 4 reach 99% of what 40 add)
CUT_TOLERANCE = 1e-7  # a job violating its completion bound by less than this gets no new cut
HULL_MARGIN = 1e-9  # a config is dropped only this far inside what mixes of the others reach (unit coordinates)


@dataclass(frozen=True)
class CapacityBound:
    """The bound on one trace: its average JCT, each job's (trace order), the LP's solve time and size."""

    avg_jct: float
    per_job: np.ndarray  # the LP's c_j - a_j, one per job in trace order
    solve_seconds: float  # wall-clock seconds of every LP solved (the horizon's doublings included)
    variables: int  # columns of the last (largest) LP
    horizon: int  # the slots modelled one by one before the tail


@dataclass(frozen=True)
class Configs:
    """One model's useful configs: #PS, #workers, epochs per slot, [cpu, gpu] slots held."""

    ps: np.ndarray
    workers: np.ndarray
    speed: np.ndarray
    demand: np.ndarray  # (configs, 2)


def capacity_bound(trace: Trace, scenario: Scenario, *, label: str | None = None) -> CapacityBound:
    """The capacity-aware lower bound on `trace`'s average JCT under `scenario` (see the module's docstring).

    `label` names the trace in errors (default: its size and job ids)."""
    name = label or _describe(trace)
    if len(trace) == 0:
        raise Dl2Error(f"capacity bound: trace {name} has no jobs")
    if trace.model_names != scenario.catalog.names:
        raise Dl2Error(f"capacity bound: trace {name} was read with a different model catalog than preset {scenario.preset.name!r}'s")
    configs = [useful_configs(scenario, int(m)) for m in range(scenario.catalog.num_models)]
    floor = _jct_floor(trace, scenario)
    horizon = int(trace.arrival.max()) + int(math.ceil(floor.max())) + 1
    seconds = 0.0
    for _ in range(MAX_DOUBLINGS + 1):  # the horizon, on the LP without cuts
        per_job, tail, variables, took = _solve(trace, scenario, configs, floor, horizon, name, rounds=0)
        seconds += took
        if tail <= TAIL_TOLERANCE or horizon >= scenario.options.max_slots:
            break
        # the tail is used; if it need not be (the same optimum without it), no longer horizon gives more
        without, _, _, took = _solve(trace, scenario, configs, floor, horizon, name, tail=False, rounds=0)
        seconds += took
        if without is not None and without.mean() <= per_job.mean() + TAIL_TOLERANCE:
            break
        horizon = min(2 * horizon, scenario.options.max_slots)
    per_job, _, variables, took = _solve(trace, scenario, configs, floor, horizon, name, rounds=MAX_CUT_ROUNDS)
    seconds += took
    return CapacityBound(avg_jct=float(per_job.mean()), per_job=per_job, solve_seconds=seconds, variables=variables, horizon=horizon)


def _describe(trace: Trace) -> str:
    if len(trace) == 0:
        return "(empty)"
    ids, arrivals = trace.job_id, trace.arrival
    return f"of {len(trace)} jobs (ids {ids.min()}..{ids.max()}, arrivals {arrivals.min()}..{arrivals.max()})"


def _jct_floor(trace: Trace, scenario: Scenario) -> np.ndarray:
    """Per job, the least JCT it can have: alone on the cluster at its best speed (`lower_bound_jct`), plus
    the restart fraction (its first slot starts its pods); whole slots with integer JCT."""
    slots = trace.num_epochs / best_speeds(scenario)[trace.model] + scenario.restart_fraction
    return slots if scenario.options.fine_grained_jct else np.ceil(slots)


def best_speeds(scenario: Scenario) -> np.ndarray:
    """Per model, the most epochs per slot of any config that fits the empty cluster."""
    return np.array([useful_configs(scenario, m).speed.max() for m in range(scenario.catalog.num_models)])


def _last_slot_slack(length: np.ndarray) -> np.ndarray:
    """How far below t + 1/2 the mean time of a job's work in the slot t it completes in can lie, for a job
    of `length` slots at its best speed: its share y there takes at least y * length of the slot, so the mean
    is at least t + y * length / 2, short by y (1 - y * length) / 2 at most over y in [0, min(1, 1/length)]:
    1 / (8 length), or (1 - length) / 2 when length < 1/2."""
    return np.where(length >= 0.5, 1.0 / (8.0 * np.maximum(length, 0.5)), (1.0 - length) / 2.0)


@lru_cache(maxsize=64)
def useful_configs(scenario: Scenario, model: int) -> Configs:
    """The configs of `model` (1..max_tasks PS and workers, fitting the empty cluster, training at all) that
    no mix of its others beats: a mix (weights summing to at most 1) with no more CPU and GPU slots and at
    least the speed would serve every schedule as well, in the LP. Kept: the extreme points of the points
    (CPU, GPU, speed) with the origin, each shifted by more of either resource or less speed (`_extreme`)."""
    p, c = scenario.preset, scenario.catalog
    table = scenario.true_table
    ps, workers, speed = [], [], []
    for n_ps in range(1, p.max_tasks + 1):
        for n_w in range(1, p.max_tasks + 1):
            s = float(table[model, n_ps, n_w])
            if s > 0.0 and _fits_alone(p.num_nodes, (p.node_cpu, p.node_gpu), c.worker_demand[model], c.ps_demand[model], n_ps, n_w):
                ps.append(n_ps)
                workers.append(n_w)
                speed.append(s)
    if not speed:
        raise Dl2Error(f"capacity bound: no config of model {c.names[model]!r} fits an empty cluster of preset {p.name!r} and trains")
    ps_a, w_a, s_a = np.array(ps), np.array(workers), np.array(speed)
    d = (ps_a[:, None] * c.ps_demand[model][None, :] + w_a[:, None] * c.worker_demand[model][None, :]).astype(float)
    keep = _extreme(np.column_stack([d, s_a]))
    return Configs(ps=ps_a[keep], workers=w_a[keep], speed=s_a[keep], demand=d[keep])


def _extreme(points: np.ndarray) -> np.ndarray:
    """Which rows (CPU, GPU, speed) no mix of the others and the origin beats. The convex hull of the points, the
    origin, and each of them with far more CPU, far more GPU or far less speed holds exactly what mixes of the
    points beat or equal; a point strictly inside it (by more than qhull's rounding, `HULL_MARGIN` of the
    coordinates' scale) is a mix of the others and is dropped; a vertex, or a point on the surface, is kept."""
    used = points.max(axis=0) > 0  # a resource no config holds (GPUs of a CPU-only model) is left out
    unit = points[:, used] / points[:, used].max(axis=0)
    dims = unit.shape[1]
    far = np.eye(dims) * 4.0
    far[-1] *= -1.0  # the last coordinate is speed: less of it
    base = np.vstack([unit, np.zeros((1, dims))])
    hull = ConvexHull(np.vstack([base, *(base + f for f in far)]))
    inside = (unit @ hull.equations[:, :dims].T + hull.equations[:, dims]).max(axis=1)  # <= 0 inside, 0 on a facet
    return inside > -HULL_MARGIN


def _solve(trace: Trace, scenario: Scenario, configs: list[Configs], floor: np.ndarray, horizon: int,
           name: str, tail: bool = True, rounds: int = MAX_CUT_ROUNDS) -> tuple[np.ndarray | None, float, int, float]:
    """Build and solve the LP with `horizon` single slots (and the tail, unless `tail` is False), adding
    tangent cuts of the per-config completion bound (`_tangent`) while some job violates it, at most
    `rounds` times; returns per-job JCT bounds (None if, without the tail, the LP is infeasible),
    the largest share of a job left to the tail, the number of variables and the solves' wall-clock seconds."""
    n = len(trace)
    epochs = trace.num_epochs.astype(float)
    arrival = trace.arrival.astype(np.int64)
    length = epochs / best_speeds(scenario)[trace.model]
    slack = _last_slot_slack(length)
    p = scenario.preset
    capacity = np.array([p.num_nodes * p.node_cpu, p.num_nodes * p.node_gpu], dtype=float)
    first = int(arrival.min())
    # columns: every job's x[t, k] for t in [a_j, horizon), then tails (n), then JCTs u_j = c_j - a_j (n)
    share_rows, cap_rows, cap_cols, cap_vals = [], [], [], []
    work_cols, work_vals, offsets, share_cols = [], [], [], []
    offset, row = 0, 0
    for j in range(n):
        cf = configs[int(trace.model[j])]
        k = len(cf.speed)
        slots = np.arange(arrival[j], horizon)
        cols = offset + np.arange(len(slots) * k)
        t = np.repeat(slots, k)
        work_cols.append(cols)
        work_vals.append(np.tile(cf.speed, len(slots)) / epochs[j])
        offsets.append(t + 0.5 - arrival[j])
        share_rows.append(row + np.repeat(np.arange(len(slots)), k))
        share_cols.append(cols)
        for r in range(2):
            cap_rows.append(2 * (t - first) + r)
            cap_cols.append(cols)
            cap_vals.append(np.tile(cf.demand[:, r], len(slots)))
        offset += len(cols)
        row += len(slots)
    num_x, num_share_rows = offset, row
    tails, jct = num_x + np.arange(n), num_x + n + np.arange(n)
    num_vars = num_x + 2 * n
    job_of = np.concatenate([np.full(len(c), j) for j, c in enumerate(work_cols)])
    x_cols = np.concatenate(work_cols)
    # equalities: each job's shares sum to 1
    a_eq = sparse.csr_array((np.concatenate([np.concatenate(work_vals), np.ones(n)]),
                             (np.concatenate([job_of, np.arange(n)]), np.concatenate([x_cols, tails]))), shape=(n, num_vars))
    # inequalities: a slot's shares <= 1; capacity per slot and resource; then the completion cuts
    num_cap_rows = 2 * (horizon - first)
    fixed = sparse.csr_array((np.concatenate([np.ones(num_x), np.concatenate(cap_vals)]),
                              (np.concatenate([np.concatenate(share_rows), num_share_rows + np.concatenate(cap_rows)]),
                               np.concatenate([np.concatenate(share_cols), np.concatenate(cap_cols)]))),
                             shape=(num_share_rows + num_cap_rows, num_vars))
    fixed_b = np.concatenate([np.ones(num_share_rows), np.tile(capacity, horizon - first)])
    bounds = np.zeros((num_vars, 2))
    bounds[:, 1] = np.inf
    bounds[tails, 1] = 1.0 if tail else 0.0
    bounds[jct, 0] = floor
    objective = np.zeros(num_vars)
    objective[jct] = 1.0 / n
    # each job's config lengths (slots to do all of it in that config), the tail's at the best config's
    lengths = [np.append(epochs[j] / configs[int(trace.model[j])].speed, length[j]) for j in range(n)]
    cuts = [(j, _tangent(lengths[j], np.eye(len(lengths[j]))[-1])) for j in range(n)]  # all at the best speed
    took, rows, cols, vals, b_cut = 0.0, [], [], [], []
    for _ in range(rounds + 1):
        for j, (gradient, value) in cuts:
            k = len(lengths[j]) - 1
            r = len(b_cut)
            mine = job_of == j
            rows += [np.full(int(mine.sum()) + 2, r)]
            cols += [x_cols[mine], [tails[j], jct[j]]]
            vals += [work_vals[j] * (offsets[j] + np.tile(gradient[:k], len(offsets[j]) // k)),
                     [horizon - arrival[j] + gradient[k], -1.0]]
            b_cut.append(value + slack[j])
        a_ub = sparse.vstack([fixed, sparse.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                                      shape=(len(b_cut), num_vars))], format="csr")
        start = time.perf_counter()
        res = linprog(objective, A_ub=a_ub, b_ub=np.concatenate([fixed_b, b_cut]), A_eq=a_eq, b_eq=np.ones(n), bounds=bounds,
                      method="highs", options=HIGHS_OPTIONS)
        took += time.perf_counter() - start
        if res.status == 2 and not tail:  # infeasible: the jobs need slots past the horizon
            return None, 1.0, num_vars, took
        if res.status != 0:
            raise Dl2Error(f"capacity bound: HiGHS failed on trace {name} (preset {p.name!r}, horizon {horizon}): {res.message}")
        cuts = []
        for j in range(n):
            k = len(lengths[j]) - 1
            mine = res.x[work_cols[j]] * work_vals[j]
            share = np.append(mine.reshape(-1, k).sum(axis=0), res.x[tails[j]])
            mean = float(mine @ offsets[j]) + res.x[tails[j]] * (horizon - arrival[j])
            gradient, value = _tangent(lengths[j], share)
            if res.x[jct[j]] < mean + float(gradient @ share) - value - slack[j] - CUT_TOLERANCE:
                cuts.append((j, (gradient, value)))
        if not cuts:
            break
    return res.x[jct].copy(), float(res.x[tails].max()), num_vars, took


def _tangent(lengths: np.ndarray, share: np.ndarray) -> tuple[np.ndarray, float]:
    """The tangent at `share` of Q(w) = 1/2 w^T A w, A[k, l] = min(lengths[k], lengths[l]): (A share, Q(share)),
    so that Q(w) >= (A share) . w - Q(share) for every w (Q is convex: A is a min kernel).

    Q(w) bounds C_j minus the mean time of the job's work when it does the share w[k] of itself at the speed
    of config k (`lengths[k]`: slots to do all of it there): that difference is least with the slowest
    work first and no gaps, where the work done in config k waits on average w[k] lengths[k] / 2 plus the
    time of all faster work after it; summed, Q(w)."""
    kernel = np.minimum.outer(lengths, lengths)
    gradient = kernel @ share
    return gradient, float(share @ gradient) / 2.0
