"""The throughput model a Pollux job fits to what it measured (Qiao et al., OSDI 2021, §3.1), as the
artifact fits it: compute time linear in the local batch size, network time a constant plus a term
growing with the replicas (inter-node or intra-node), combined as a gamma-norm; fitted by L-BFGS-B to the
root mean squared log errors of both times, with the artifact's starting point, bounds, regularisers and
priors. The gradient is written out, not taken by automatic differentiation."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import scipy.optimize

_START = np.array([1e-1, 1e-2] * 3 + [1.0 + 1e-3])
_LOWER = np.array([1e-8, 1e-8] * 3 + [1.0])
_UPPER = np.array([np.inf, np.inf] * 3 + [10.0])


class _Measurements:
    """What one job measured, and which parameters of the model each measurement's network time uses."""

    def __init__(self, nodes: np.ndarray, replicas: np.ndarray, atomic_bsz: np.ndarray, accum_time: np.ndarray,
                 optim_time: np.ndarray):
        self.atomic_bsz = atomic_bsz
        self.log_accum = np.log(accum_time)
        self.log_optim = np.log(optim_time)
        self.inter = nodes > 1
        self.intra = ~self.inter & (replicas > 1)
        self.rounds = np.maximum(replicas - 2, 1e-8)

    def objective(self, p: np.ndarray) -> tuple[float, np.ndarray]:
        """The artifact's loss and its gradient at parameters `p`."""
        alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma = p
        accum = alpha_c + beta_c * self.atomic_bsz
        bottleneck = np.where(self.inter, alpha_n, np.where(self.intra, alpha_r, 1e-8))
        retrogress = np.where(self.inter, beta_n, np.where(self.intra, beta_r, 1e-8))
        network = bottleneck + retrogress * self.rounds
        a_g, n_g = accum ** gamma, network ** gamma
        total = a_g + n_g
        log_optim = np.log(total) / gamma
        e1 = np.log(accum) - self.log_accum
        e2 = log_optim - self.log_optim
        err1, err2 = np.sqrt(np.mean(e1 ** 2)), np.sqrt(np.mean(e2 ** 2))
        loss = err1 + err2 + 1e-3 * (gamma - 1) ** 2 + 1e-2 * ((beta_n / alpha_n) ** 2 + (beta_r / alpha_r) ** 2)
        # d err / d x = mean(e * d e / d x) / err
        w1 = e1 / (err1 * len(e1)) if err1 > 0 else np.zeros_like(e1)
        w2 = e2 / (err2 * len(e2)) if err2 > 0 else np.zeros_like(e2)
        d_accum = w1 / accum + w2 * accum ** (gamma - 1) / total  # d loss / d predicted accum time
        d_network = w2 * network ** (gamma - 1) / total
        grad = np.array([
            d_accum.sum(),
            (d_accum * self.atomic_bsz).sum(),
            d_network[self.inter].sum() - 2e-2 * beta_n ** 2 / alpha_n ** 3,
            (d_network * self.rounds)[self.inter].sum() + 2e-2 * beta_n / alpha_n ** 2,
            d_network[self.intra].sum() - 2e-2 * beta_r ** 2 / alpha_r ** 3,
            (d_network * self.rounds)[self.intra].sum() + 2e-2 * beta_r / alpha_r ** 2,
            (w2 * (-np.log(total) / gamma ** 2 + (a_g * np.log(accum) + n_g * np.log(network)) / (gamma * total))).sum()
            + 2e-3 * (gamma - 1),
        ])
        return float(loss), grad


def fit_perf_params(nodes: np.ndarray, replicas: np.ndarray, atomic_bsz: np.ndarray, step_time: np.ndarray,
                    sync_time: np.ndarray) -> np.ndarray:
    """The 7 parameters (alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma) that best explain a
    job's measured step and sync times. Parameters the measurements cannot tell apart are held where the
    artifact holds them: alpha_c at half the mean compute time when one batch size was measured, the
    inter-node terms when no measurement spans nodes, the intra-node ones when none has several replicas
    on one node, both retrogressions when none has more than two replicas."""
    nodes, replicas = np.asarray(nodes, dtype=np.float64), np.asarray(replicas, dtype=np.float64)
    atomic_bsz = np.asarray(atomic_bsz, dtype=np.float64)
    accum_time = np.asarray(step_time) - np.asarray(sync_time)
    start, lower, upper = _START.copy(), _LOWER.copy(), _UPPER.copy()
    held = []
    if len(np.unique(atomic_bsz)) == 1:
        start[0] = lower[0] = upper[0] = np.mean(accum_time) / 2
    if not np.any(nodes > 1):
        held += [2, 3]
    if not np.any((nodes == 1) & (replicas > 1)):
        held += [4, 5]
    if not np.any(replicas > 2):
        held += [3, 5]
    for k in held:
        start[k] = upper[k] = lower[k]
    data = _Measurements(nodes, replicas, atomic_bsz, accum_time, np.asarray(step_time, dtype=np.float64))
    result = scipy.optimize.minimize(data.objective, start, jac=True,
                                     bounds=scipy.optimize.Bounds(lower, upper, keep_feasible=True))
    params = result.x.copy()
    if not np.any(nodes > 1):  # the artifact's prior: inter-node is no faster than intra-node
        params[2] = max(params[2], params[4] * 1.1)
        params[3] = max(params[3], params[5] * 1.1)
    return params


@lru_cache(maxsize=1 << 14)
def _fit_profile(rows: bytes) -> np.ndarray:
    profile = np.frombuffer(rows).reshape(-1, 5)
    return fit_perf_params(profile[:, 0], profile[:, 1], profile[:, 2], profile[:, 3], profile[:, 4])


def fit_profile(profile: np.ndarray) -> np.ndarray:
    """`fit_perf_params` of a job's measured rows (nodes, replicas, local batch size, step time, sync time),
    remembered by the rows' bytes: jobs of one application that measured the same configurations alike, in
    one run or across runs, share one fit (the same numbers: the fit is a function of the rows alone)."""
    return _fit_profile(np.ascontiguousarray(profile, dtype=np.float64).tobytes()).copy()
