"""The policy network frozen into flat float32 arrays and run compiled, one decision at a time.

A live scheduler decides one action at a time, so it runs at batch size one, where a torch call's fixed
cost dominates. `FrozenPolicy` copies the weights out of the torch network (batch norm folded in) and
numba runs whole slots (`schedule_slot`) or whole traces (`run_episode`) without returning to Python.

Within a slot a decision changes one job's features, so the per-job part of the first layers is cached
per window position and recomputed only for rows whose raw features changed: for the fully connected
network, each position's share of the first layer's pre-activation; for the per-job network, each job's
first layer and its own share of the second. The cache is keyed by the raw row itself, so it stays valid
across slots and traces for as long as the weights are those frozen.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from numba import njit

from dl2.learn.architecture import NetConfig
from dl2.learn.env import CONTINUE, SLOT_END, env_reset, env_step
from dl2.learn.features import NUM_MODELS, SHARE_SCALE, STAY_SCALE
from dl2.sim.placement import place_least_loaded
from dl2.sim.state import NUM_FEATURES, Cluster, Jobs
from dl2.sim.window import action_mask, observe_window

MLP_KIND, PER_JOB_KIND = 0, 1
ACTIVATION_CODES = {"relu": 0, "tanh": 1, "leaky_relu": 2, "elu": 3}


class Frozen(NamedTuple):
    """Weights (flat) and the row cache of one frozen network."""

    kind: int  # MLP_KIND | PER_JOB_KIND
    activation: int  # ACTIVATION_CODES
    one_hot: bool
    max_tasks: int
    params: np.ndarray  # float32, every matrix (inputs, outputs) then its bias
    layout: np.ndarray  # int64 (matrices, 3): offset, inputs, outputs; hidden layers first, then the heads
    rows: np.ndarray  # float32 (window, 6): the raw rows the cache holds (nan: none yet)
    first: np.ndarray  # float32 (window, hidden[0]): MLP: the row's share of layer 1; per-job: the row's layer 1
    own: np.ndarray  # float32 (window, hidden[1]): per-job: the row's own share of layer 2 (unused otherwise)


class FrozenPolicy:
    """A `DL2Policy`'s network as flat arrays, for compiled scheduling (see the module docstring)."""

    def __init__(self, policy):
        config: NetConfig = policy.config
        self.config = config
        matrices = _per_job_matrices(policy.net) if config.per_job else _mlp_matrices(policy.net)
        layout, chunks, offset = [], [], 0
        for weight, bias in matrices:
            layout.append((offset, weight.shape[0], weight.shape[1]))
            chunks += [weight.ravel(), bias.ravel()]
            offset += weight.size + bias.size
        hidden = config.hidden
        self.frozen = Frozen(
            kind=PER_JOB_KIND if config.per_job else MLP_KIND, activation=ACTIVATION_CODES[config.activation],
            one_hot=config.one_hot, max_tasks=policy.max_tasks,
            params=np.concatenate(chunks).astype(np.float32), layout=np.array(layout, dtype=np.int64),
            rows=np.full((config.window, NUM_FEATURES), np.nan, dtype=np.float32),
            first=np.zeros((config.window, hidden[0]), dtype=np.float32),
            own=np.zeros((config.window, hidden[1] if len(hidden) > 1 else 1), dtype=np.float32))

    def log_probs(self, state: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Masked log-probabilities of one raw window state (window, 6)."""
        out = np.empty(self.config.num_actions, dtype=np.float32)
        _forward(self.frozen, np.ascontiguousarray(state, dtype=np.float32), mask, out)
        return out.astype(np.float64)


def _mlp_matrices(net: torch.nn.Module) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight as inputs x outputs, bias) per linear layer, with any batch norm after it folded in."""
    matrices: list[tuple[np.ndarray, np.ndarray]] = []
    for module in net.body:
        if isinstance(module, torch.nn.Linear):
            matrices.append((module.weight.detach().double().numpy().T.copy(), module.bias.detach().double().numpy().copy()))
        elif isinstance(module, torch.nn.BatchNorm1d):
            weight, bias = matrices[-1]
            scale = (module.weight / torch.sqrt(module.running_var + module.eps)).detach().double().numpy()
            shift = module.bias.detach().double().numpy() - module.running_mean.detach().double().numpy() * scale
            matrices[-1] = (weight * scale, bias * scale + shift)
    return matrices


def _per_job_matrices(net: torch.nn.Module) -> list[tuple[np.ndarray, np.ndarray]]:
    linear = [*net.layers, net.job_head, net.pool_head]
    return [(m.weight.detach().double().numpy().T.copy(), m.bias.detach().double().numpy().copy()) for m in linear]


@njit(cache=True, inline="always")
def _matrix(params: np.ndarray, layout: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    offset, rows, cols = layout[k, 0], layout[k, 1], layout[k, 2]
    return params[offset: offset + rows * cols].reshape(rows, cols), params[offset + rows * cols: offset + rows * cols + cols]


@njit(cache=True, inline="always")
def _act(v: np.float32, code: int) -> np.float32:
    if code == 0:
        return max(v, np.float32(0.0))
    if code == 1:
        return np.tanh(v)
    if code == 2:
        return v if v > 0 else np.float32(0.01) * v
    return v if v > 0 else np.expm1(v)


@njit(cache=True)
def _activate(x: np.ndarray, code: int) -> None:
    for i in range(x.shape[0]):
        x[i] = _act(x[i], code)


@njit(cache=True)
def _encode_row(row: np.ndarray, max_tasks: int, one_hot: bool, out: np.ndarray) -> None:
    """One job's network inputs (`dl2.learn.features.encode` for one row)."""
    out[:] = 0.0
    kinds = NUM_MODELS if one_hot else 1
    if one_hot:
        model = int(row[0])
        if 1 <= model <= NUM_MODELS:
            out[model - 1] = 1.0
    else:
        out[0] = row[0] / np.float32(NUM_MODELS)
    out[kinds] = row[1] / np.float32(STAY_SCALE)
    out[kinds + 1] = row[2]
    out[kinds + 2] = row[3] * np.float32(SHARE_SCALE)
    out[kinds + 3] = row[4] / np.float32(max_tasks)
    out[kinds + 4] = row[5] / np.float32(max_tasks)


@njit(cache=True)
def _refresh_rows(f: Frozen, state: np.ndarray) -> None:
    """Recompute the cached per-row parts of every row that differs from the one cached."""
    per_job = f.kind == PER_JOB_KIND
    w1, b1 = _matrix(f.params, f.layout, 0)
    width = w1.shape[0] if per_job else w1.shape[0] // state.shape[0]
    x = np.empty(width, dtype=np.float32)
    for pos in range(state.shape[0]):
        same = True
        for k in range(state.shape[1]):
            if state[pos, k] != f.rows[pos, k]:
                same = False
                break
        if same:
            continue
        f.rows[pos] = state[pos]
        _encode_row(state[pos], f.max_tasks, f.one_hot, x)
        if per_job:
            h = np.dot(x, w1) + b1
            _activate(h, f.activation)
            f.first[pos] = h
            if f.layout.shape[0] > 3:
                w2, _ = _matrix(f.params, f.layout, 1)
                f.own[pos] = np.dot(h, w2[: h.shape[0]])
        else:
            f.first[pos] = np.dot(x, w1[pos * width: (pos + 1) * width])


@njit(cache=True)
def _masked_log_softmax(logits: np.ndarray, mask: np.ndarray) -> None:
    top = -np.inf
    for a in range(logits.shape[0]):
        if mask[a] and logits[a] > top:
            top = logits[a]
    total = 0.0
    for a in range(logits.shape[0]):
        if mask[a]:
            total += np.exp(logits[a] - top)
    norm = top + np.log(total)
    for a in range(logits.shape[0]):
        logits[a] = logits[a] - norm if mask[a] else -np.inf


@njit(cache=True)
def _filled_mean(h: np.ndarray, filled: np.ndarray) -> np.ndarray:
    total = np.zeros(h.shape[1], dtype=np.float32)
    count = 0
    for pos in range(h.shape[0]):
        if filled[pos]:
            total += h[pos]
            count += 1
    return total / np.float32(max(count, 1))


@njit(cache=True)
def _forward(f: Frozen, state: np.ndarray, mask: np.ndarray, out: np.ndarray) -> None:
    """Masked log-probabilities of `state` into `out`, refreshing the row cache first."""
    _refresh_rows(f, state)
    window = state.shape[0]
    if f.kind == MLP_KIND:
        _, b1 = _matrix(f.params, f.layout, 0)
        h = b1.copy()
        for pos in range(window):
            h += f.first[pos]
        for k in range(1, f.layout.shape[0]):
            _activate(h, f.activation)
            w, b = _matrix(f.params, f.layout, k)
            h = np.dot(h, w) + b
        out[:] = h
    else:
        hidden = f.layout.shape[0] - 2
        filled = state[:, 0] > 0
        h = f.first
        for k in range(1, hidden):
            w, b = _matrix(f.params, f.layout, k)
            width = h.shape[1]
            shared = np.dot(_filled_mean(h, filled), w[width:]) + b
            h = (f.own if k == 1 else np.dot(h, w[:width].copy())) + shared
            for pos in range(window):
                if filled[pos]:
                    _activate(h[pos], f.activation)
        wj, bj = _matrix(f.params, f.layout, hidden)
        wp, bp = _matrix(f.params, f.layout, hidden + 1)
        logits = np.dot(h, wj)
        for pos in range(window):
            for r in range(3):
                out[3 * pos + r] = logits[pos, r] + bj[r] if filled[pos] else bj[r]
        out[3 * window] = np.dot(_filled_mean(h, filled), wp)[0] + bp[0]
    _masked_log_softmax(out, mask)


@njit(cache=True)
def _choose(log_probs: np.ndarray, greedy: bool) -> int:
    """The most likely action, or one drawn from numba's generator (seeded by the caller)."""
    if greedy:
        return int(np.argmax(log_probs))
    u = np.random.random()
    total = 0.0
    for a in range(log_probs.shape[0]):
        total += np.exp(np.float64(log_probs[a]))
    u *= total
    running = 0.0
    for a in range(log_probs.shape[0]):
        running += np.exp(np.float64(log_probs[a]))
        if running > u:
            return a
    return log_probs.shape[0] - 1


@njit(cache=True)
def schedule_slot(f: Frozen, jobs: Jobs, cl: Cluster, slot: int, greedy: bool, seed: int, state: np.ndarray,
                  window_jobs: np.ndarray, mask: np.ndarray) -> int:
    """One slot's decisions until void, a failed placement or nothing legal; returns how many were made."""
    if not greedy:
        np.random.seed(seed)
    log_probs = np.empty(mask.shape[0], dtype=np.float32)
    void = 3 * state.shape[0]
    decisions = 0
    while True:
        observe_window(jobs, cl, slot, f.max_tasks, state, window_jobs)
        if action_mask(jobs, window_jobs, f.max_tasks, mask) == 0:
            return decisions
        _forward(f, state, mask, log_probs)
        action = _choose(log_probs, greedy)
        decisions += 1
        if action == void or not place_least_loaded(jobs, cl, window_jobs[action // 3], action % 3):
            return decisions


@njit(cache=True)
def run_episode(f: Frozen, jobs: Jobs, cl: Cluster, table: np.ndarray, ctl: np.ndarray, fine_grained: bool,
                lost: tuple[float, float], trained: np.ndarray, assign_bundle: bool, max_slots: int, greedy: bool, seed: int,
                state: np.ndarray, window_jobs: np.ndarray, mask: np.ndarray) -> tuple[int, int]:
    """A whole trace in the decision environment (`dl2.learn.env`); returns (final status, decisions)."""
    if not greedy:
        np.random.seed(seed)
    log_probs = np.empty(mask.shape[0], dtype=np.float32)
    job_reward = np.zeros(jobs.model.shape[0])
    decisions = 0
    status = env_reset(jobs, cl, table, ctl, f.max_tasks, fine_grained, lost, trained, assign_bundle, max_slots, state, window_jobs, mask)
    while status == CONTINUE or status == SLOT_END:
        _forward(f, state, mask, log_probs)
        action = _choose(log_probs, greedy)
        decisions += 1
        status, _ = env_step(jobs, cl, table, ctl, action, f.max_tasks, fine_grained, lost, trained, assign_bundle, max_slots, state,
                             window_jobs, mask, job_reward)
    return status, decisions
