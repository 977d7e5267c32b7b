"""Greedy decisions without a torch call per decision, identical to `PolluxNets.greedy`'s.

A greedy evaluation asks for one decision at a time, and a per-job network's forward pass in torch costs
~25 small operator calls (~150-300 us on this host) for a window of 20 jobs. Here the same pass runs
compiled (numba), in float64 from the same float32 weights, so its logits lie within a small error of
torch's float32 ones. Where the most likely legal action leads the runner-up by more than the margin
(`MARGIN` times the largest logit's size, at least 1) torch's float32 pass picks the same action: torch's
error is far below the margin (at most 2.6e-6 of the largest logit over 5,000 states of a trained 2x128
network's evaluation, measured 2026-12-07; the tests hold their 2x32 one to a hundredth of the margin),
and the masked log-softmax subtracts one constant from every logit, keeping their order. Otherwise, a near
tie, the decision is asked of torch itself (`PolluxNets.greedy`), so every decision is the one torch
makes. Networks other than the per-job one with ReLU or tanh are asked of torch every time.

The pass runs up to the window's last filled slot: empty slots take no part in a filled job's logits, and
their own are always masked. It keeps, per slot, the raw row it saw last, the row's first layer and the
row's own share of the second layer's input (the second layer sees [the job's own, the pooled]): within an
interval a decision changes one row (the job's GPUs given), so the next pass recomputes that row's parts
and the pooled ones only.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from dl2.learn.nets import PerJobNet
from dl2.learn.pollux.features import APP, NUM_JOB_FEATURES, encode_row
from dl2.learn.pollux.model import PolluxNets

MARGIN = 1e-3  # relative to the largest logit's size (at least 1)
ACTIVATIONS = ("relu", "tanh")


def _float64(layer) -> tuple[np.ndarray, np.ndarray]:
    """A linear layer's (weight transposed, bias) in float64, copies (training on cannot change them)."""
    return layer.weight.detach().double().numpy().T.copy(), layer.bias.detach().double().numpy().copy()


class FastGreedy:
    """decide(state, mask) -> the action `nets.greedy()` decides; `asked_torch` counts the near ties."""

    def __init__(self, nets: PolluxNets):
        self.torch_decide = nets.greedy()
        self.asked_torch = 0
        self.decisions = 0
        policy = nets.policy
        self.supported = isinstance(policy, PerJobNet) and nets.config.activation in ACTIVATIONS
        if not self.supported:
            return
        self.relu = nets.config.activation == "relu"
        self.window, self.kinds = policy.window, policy.kinds
        self.roles = policy.job_head.out_features
        (first_weight, first_bias), *later = [_float64(layer) for layer in policy.layers]
        self.first = first_weight, first_bias
        # a later layer's input is [the job's own, the pooled]: its weight in those two halves
        self.own_weights = List([np.ascontiguousarray(w[: len(w) // 2]) for w, _ in later] or [np.zeros((1, 1))])
        self.pooled_weights = List([np.ascontiguousarray(w[len(w) // 2:]) for w, _ in later] or [np.zeros((1, 1))])
        self.biases = List([b for _, b in later] or [np.zeros(1)])
        self.num_later = len(later)
        self.job_head, self.pool_head = _float64(policy.job_head), _float64(policy.pool_head)
        # per window slot, the raw row last seen and what was computed of it alone
        self.seen = np.full((self.window, NUM_JOB_FEATURES), np.nan)
        self.filled = np.zeros(self.window)
        self.first_out = np.zeros((self.window, first_bias.size))
        self.own_out = np.zeros((self.window, later[0][1].size if later else 1))
        self.inputs = np.zeros(policy.features)

    def logits(self, state: np.ndarray) -> np.ndarray:
        """The policy's logits of one raw window state, in float64 (PerJobNet.forward, one state), run up to
        the last filled slot only: the logits of the empty slots after it are left NaN (always masked)."""
        out = np.full(self.window * self.roles + 1, np.nan)
        _logits(np.ascontiguousarray(state, dtype=np.float64), self.kinds, self.relu, self.seen, self.filled,
                self.first_out, self.own_out, self.inputs, self.first[0], self.first[1],
                self.own_weights, self.pooled_weights, self.biases, self.num_later, self.job_head[0],
                self.job_head[1], self.pool_head[0], self.pool_head[1], out)
        return out

    def __call__(self, state: np.ndarray, mask: np.ndarray) -> int:
        self.decisions += 1
        if self.supported:
            best = _clear_best(self.logits(state), np.asarray(mask, dtype=np.bool_), MARGIN)
            if best >= 0:
                return best
        self.asked_torch += 1
        return self.torch_decide(state, mask)


@njit(cache=True)
def _clear_best(raw: np.ndarray, mask: np.ndarray, margin: float) -> int:
    """The most likely legal action where it leads the runner-up by more than `margin` times the largest
    logit's size (at least 1); -1 on a near tie."""
    best, best_logit, runner_up, scale = -1, -np.inf, -np.inf, 1.0
    for k in range(len(raw)):
        if np.isnan(raw[k]):
            continue
        scale = max(scale, abs(raw[k]))
        if not mask[k]:
            continue
        if raw[k] > best_logit:
            best, best_logit, runner_up = k, raw[k], best_logit
        elif raw[k] > runner_up:
            runner_up = raw[k]
    return best if best_logit - runner_up > margin * scale else -1


@njit(cache=True)
def _activate(values: np.ndarray, relu: bool) -> np.ndarray:
    return np.maximum(values, 0.0) if relu else np.tanh(values)


@njit(cache=True)
def _logits(state, kinds, relu, seen, filled, first_out, own_out, inputs, first_weight, first_bias,
            own_weights, pooled_weights, biases, num_later, job_weight, job_bias, pool_weight, pool_bias, out):
    """`FastGreedy.logits` into `out`, recomputing the per-row parts of the rows that differ from `seen`."""
    slots = 0
    for j in range(state.shape[0]):
        if state[j, APP] > 0:
            slots = j + 1
    for j in range(slots):
        if (state[j] == seen[j]).all():
            continue
        seen[j] = state[j]
        encode_row(state[j], kinds, inputs)
        filled[j] = 1.0 if np.abs(inputs[:kinds]).sum() > 0 else 0.0
        first_out[j] = _activate(inputs @ first_weight + first_bias, relu)
        if num_later > 0:
            own_out[j] = first_out[j] @ own_weights[0]
    count = max(filled[:slots].sum(), 1.0)
    h = first_out[:slots]
    for k in range(num_later):
        pooled = (h * filled[:slots, None]).sum(0) / count
        own = own_out[:slots] if k == 0 else h @ own_weights[k]
        h = _activate(own + (pooled @ pooled_weights[k] + biases[k]), relu)
    pooled = (h * filled[:slots, None]).sum(0) / count
    out[: slots * job_bias.size] = (h @ job_weight + job_bias).ravel()
    out[-1] = (pooled @ pool_weight + pool_bias)[0]
