"""Experience replay: uniform, or prioritized as in the authors' code (DESIGN §5)."""

from __future__ import annotations

import numpy as np

from dl2.errors import Dl2Error

KINDS = ("off", "uniform", "prioritized")
BETA_START, BETA_STEP = 0.1, 1e-4  # the authors' code: importance-sampling exponent 0.1, grown by 1e-4 per batch drawn


def importance_beta(update: int) -> float:
    """The importance-sampling exponent of update `update` (0-based), as in the authors' prioritized replay:
    0.1 grown by 1e-4 per batch drawn, capped at 1 (0.12 at update 200; 1 only after 9000 updates). Corrections
    this mild keep the mean weight near 1, where a schedule reaching 1 within a short run shrinks it to about
    0.02 and the policy gradient with it."""
    return min(1.0, BETA_START + BETA_STEP * (update + 1))


class Replay:
    """A ring buffer of decisions: raw state, mask, action, slot reward, next slot's first state, done, and
    whether an exploration rule chose the action (`by_rule`) rather than the policy.

    Prioritized: priority max(1, r - mean r) on insert, min(|advantage| + 0.01, 4)^0.9 on update;
    sampling proportional to priority; importance weights (p / p_min)^-beta, beta from `importance_beta`.
    `off` keeps only what was added since the last sample (on-policy updates).
    """

    def __init__(self, kind: str, capacity: int, window: int, num_features: int, num_actions: int):
        if kind not in KINDS:
            raise Dl2Error(f"replay: expected one of {', '.join(KINDS)}, got {kind!r}")
        self.kind, self.capacity = kind, capacity
        self.states = np.zeros((capacity, window, num_features), dtype=np.float32)
        self.next_states = np.zeros_like(self.states)
        self.masks = np.zeros((capacity, num_actions), dtype=np.bool_)
        self.next_masks = np.zeros_like(self.masks)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity)
        self.done = np.zeros(capacity, dtype=np.bool_)
        self.by_rule = np.zeros(capacity, dtype=np.bool_)
        self.priority = np.ones(capacity)
        self.size = 0
        self.cursor = 0
        self.fresh: list[int] = []

    def add(self, state, mask, action, reward, next_state, next_mask, done, by_rule: bool = False) -> None:
        i = self.cursor
        self.states[i], self.masks[i], self.actions[i], self.rewards[i] = state, mask, action, reward
        self.next_states[i], self.next_masks[i], self.done[i], self.by_rule[i] = next_state, next_mask, done, by_rule
        mean = self.rewards[: self.size].mean() if self.size else reward
        self.priority[i] = max(1.0, reward - mean)
        self.cursor = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        self.fresh.append(i)

    def sample(self, batch_size: int, rng: np.random.Generator, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """(indices, importance weights) of a batch."""
        if self.kind == "off":
            idx = np.asarray(self.fresh[-batch_size:], dtype=np.int64)
            self.fresh.clear()
            return idx, np.ones(len(idx))
        self.fresh.clear()
        if self.kind == "uniform":
            return rng.integers(0, self.size, batch_size), np.ones(batch_size)
        p = self.priority[: self.size] / self.priority[: self.size].sum()
        idx = rng.choice(self.size, size=batch_size, p=p)
        weights = (p[idx] / p.min()) ** (-beta)
        return idx, weights

    def update(self, idx: np.ndarray, advantages: np.ndarray) -> None:
        if self.kind == "prioritized":
            self.priority[idx] = np.minimum(np.abs(advantages) + 0.01, 4.0) ** 0.9
