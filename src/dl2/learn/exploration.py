"""Job-aware exploration (DESIGN §5): override a sampled action when the state calls for it.

- `paper`: with probability epsilon, in a "poor" state (a window job with workers but no PS, PS but no
  workers, or a worker/PS ratio beyond 10) take the action that repairs the first such job;
- `code`: the authors' code's rules, applied at every training decision;
- `epsilon`: the authors' "no exploration" variant: a random legal action with probability
  2 / (1 + e^(step / 500));
- `off`: the sampled action as it is.
"""

from __future__ import annotations

import numpy as np

from dl2.errors import Dl2Error

MODES = ("off", "paper", "code", "epsilon")
WORKER, PS, BUNDLE = 0, 1, 2
NEGLIGIBLE = 1e-20


class Explorer:
    """Stateful across a training run: the code rules count how often each action type was taken."""

    def __init__(self, mode: str, epsilon: float = 0.4, temperature: float = 500.0):
        if mode not in MODES:
            raise Dl2Error(f"exploration: expected one of {', '.join(MODES)}, got {mode!r}")
        self.mode, self.epsilon, self.temperature = mode, epsilon, temperature
        self.type_counts = np.zeros(3, dtype=np.int64)

    def choose(self, action: int, state: np.ndarray, mask: np.ndarray, probs: np.ndarray, step: int,
               rng: np.random.Generator, ratio: int) -> int:
        """The action to take instead of `action` (or `action`); `ratio` is the code rule's per-slot PS/worker ratio."""
        window = state.shape[0]
        if self.mode == "paper" and rng.random() < self.epsilon:
            action = _repair(state, mask, action)
        elif self.mode == "code":
            action = self._code_rules(action, state, mask, probs, rng, ratio)
        elif self.mode == "epsilon" and rng.random() < 2.0 / (1.0 + np.exp(step / self.temperature)):
            action = int(rng.choice(np.flatnonzero(mask)))
        if action < 3 * window:
            self.type_counts[action % 3] += 1
        return action

    def _code_rules(self, action: int, state: np.ndarray, mask: np.ndarray, probs: np.ndarray,
                    rng: np.random.Generator, ratio: int) -> int:
        ok = lambda a: bool(mask[a]) and probs[a] > NEGLIGIBLE  # noqa: E731
        filled = np.flatnonzero(state[:, 0] > 0)
        if len(filled) == 0:
            return action
        tasks = state[filled, 4] + state[filled, 5]
        fewest = int(filled[np.argmin(tasks)])
        if tasks.min() > 0 and tasks.max() / tasks.min() > rng.integers(3, 6):
            pick = 3 * fewest + (BUNDLE if rng.random() < 0.5 else WORKER)
            if ok(3 * fewest + BUNDLE) and ok(3 * fewest + WORKER):
                return pick
        total = self.type_counts.sum()
        for pos in filled:
            workers, ps = state[pos, 4], state[pos, 5]
            if total > 0 and self.type_counts.min() > 0 and self.type_counts.min() / total < 0.001:
                rare = 3 * pos + int(np.argmin(self.type_counts))
                if ok(rare):
                    return rare
            if workers == 0 or ps == 0:
                if workers == 0 and ok(3 * pos + WORKER):
                    return 3 * pos + WORKER
                if ps == 0 and ok(3 * pos + PS):
                    return 3 * pos + PS
                return action
            if ps > workers * ratio and rng.random() < 0.5:
                if ok(3 * pos + BUNDLE) and ok(3 * pos + WORKER):
                    return 3 * pos + (BUNDLE if rng.random() < 0.5 else WORKER)
                return action
            if workers >= 0.5 * ps and rng.random() < 0.5:
                pick = 3 * pos + (PS if rng.random() < 0.99 else BUNDLE)
                return pick if ok(pick) else action
        return action


def _repair(state: np.ndarray, mask: np.ndarray, action: int) -> int:
    """The action that repairs the first poor job of the window, if any and legal."""
    for pos in np.flatnonzero(state[:, 0] > 0):
        workers, ps = state[pos, 4], state[pos, 5]
        if (workers > 0 and ps == 0) or (ps > 0 and workers > 10 * ps):
            fix = 3 * pos + PS
        elif (ps > 0 and workers == 0) or (workers > 0 and ps > 10 * workers):
            fix = 3 * pos + WORKER
        else:
            continue
        return int(fix) if mask[fix] else action
    return action
