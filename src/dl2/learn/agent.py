"""The DL2 policy as a scheduler: a policy network choosing actions in DL2's action space.

`DL2Policy` acts on batches of raw window states; `DL2Scheduler` wraps it in the scheduler protocol so
it runs wherever a heuristic does (`dl2 simulate --policy model.pt`, `compare`, Kubernetes).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from numba import njit
from numba.typed import List

from dl2.errors import Dl2Error
from dl2.learn.features import encode, encode_one
from dl2.learn.nets import MLP, NetConfig, masked_log_probs, policy_net
from dl2.paths import atomic_path
from dl2.schedulers.base import Allocation, Observation
from dl2.sim.placement import place_least_loaded
from dl2.sim.state import NUM_FEATURES
from dl2.sim.window import action_mask, observe_window


def masks_from_states(states: np.ndarray, max_tasks: int) -> np.ndarray:
    """The legal-action masks of raw window states (batch, window, 6)."""
    filled = states[..., 0] > 0
    worker_ok = filled & (states[..., 4] < max_tasks)
    ps_ok = filled & (states[..., 5] < max_tasks)
    per_job = np.stack([worker_ok, ps_ok, worker_ok & ps_ok], axis=-1).reshape(*states.shape[:-2], -1)
    void = np.ones((*states.shape[:-2], 1), dtype=bool)
    return np.concatenate([per_job, void], axis=-1)


class DL2Policy:
    """A policy network plus what it needs to read states: its architecture and the preset's max_tasks."""

    def __init__(self, config: NetConfig, max_tasks: int, net: MLP | None = None):
        self.config, self.max_tasks = config, max_tasks
        self.net = net if net is not None else policy_net(config)

    def inputs(self, states: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(encode(states, self.max_tasks, self.config.one_hot))

    @torch.no_grad()
    def act(self, states: np.ndarray, masks: np.ndarray, greedy: bool = False,
            rng: np.random.Generator | None = None) -> np.ndarray:
        """One action per state: the most likely legal one, or a sample from the masked softmax."""
        self.net.eval()
        log_probs = masked_log_probs(self.net(self.inputs(states)), torch.from_numpy(masks)).numpy()
        if greedy:
            return log_probs.argmax(axis=-1)
        probs = np.exp(log_probs.astype(np.float64))
        cumulative = np.cumsum(probs, axis=-1)
        u = (rng or np.random.default_rng()).random((len(probs), 1)) * cumulative[:, -1:]
        return np.minimum((cumulative <= u).sum(axis=-1), probs.shape[-1] - 1)

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        """Weights and architecture in one file (`torch.load`able), written atomically."""
        payload = {"config": self.config.to_dict(), "max_tasks": self.max_tasks, "state_dict": self.net.state_dict(),
                   "extra": extra or {}}
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)

    @classmethod
    def load_state(cls, other: "DL2Policy") -> "DL2Policy":
        """An independent copy of `other` (same architecture and weights)."""
        policy = cls(other.config, other.max_tasks)
        policy.net.load_state_dict(other.net.state_dict())
        return policy

    @classmethod
    def load(cls, path: str | Path) -> "DL2Policy":
        path = Path(path)
        if not path.is_file():
            raise Dl2Error(f"{path}: model file not found")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=False)
            config = NetConfig(**{**payload["config"], "hidden": tuple(payload["config"]["hidden"])})
            policy = cls(config, int(payload["max_tasks"]))
            policy.net.load_state_dict(payload["state_dict"])
        except (KeyError, RuntimeError, TypeError, ValueError, EOFError, OSError, pickle.UnpicklingError) as exc:
            raise Dl2Error(f"{path}: not a dl2 model ({exc})") from None
        return policy


ACTIVATION_CODES = {"relu": 0, "tanh": 1, "leaky_relu": 2, "elu": 3}


@njit(cache=True)
def _log_probs_one(x: np.ndarray, weights, biases, activation: int, mask: np.ndarray) -> np.ndarray:
    """Masked log-softmax of the MLP on one input vector (float32 throughout)."""
    last = len(weights) - 1
    for k in range(len(weights)):
        x = np.dot(x, weights[k]) + biases[k]
        if k < last:
            if activation == 0:
                x = np.maximum(x, np.float32(0.0))
            elif activation == 1:
                x = np.tanh(x)
            elif activation == 2:
                x = np.where(x > 0, x, np.float32(0.01) * x)
            else:
                x = np.where(x > 0, x, np.expm1(np.minimum(x, np.float32(0.0))))
    top = -np.inf
    for a in range(x.shape[0]):
        if mask[a] and x[a] > top:
            top = x[a]
    total = 0.0
    for a in range(x.shape[0]):
        if mask[a]:
            total += np.exp(x[a] - top)
    out = np.full(x.shape[0], -np.inf)
    for a in range(x.shape[0]):
        if mask[a]:
            out[a] = x[a] - top - np.log(total)
    return out


class NumpyForward:
    """The policy network frozen into contiguous float32 arrays (batch norm folded in), run compiled for
    one decision at a time: at batch size one a torch call's fixed overhead dominates a live scheduler."""

    def __init__(self, policy: DL2Policy):
        self.max_tasks, self.one_hot = policy.max_tasks, policy.config.one_hot
        self.activation = ACTIVATION_CODES[policy.config.activation]
        weights: list[np.ndarray] = []
        biases: list[np.ndarray] = []
        for module in policy.net.body:
            if isinstance(module, torch.nn.Linear):
                weights.append(module.weight.detach().double().numpy().T.copy())
                biases.append(module.bias.detach().double().numpy().copy())
            elif isinstance(module, torch.nn.BatchNorm1d):
                scale = (module.weight / torch.sqrt(module.running_var + module.eps)).detach().double().numpy()
                weights[-1] = weights[-1] * scale
                biases[-1] = (biases[-1] - module.running_mean.detach().double().numpy()) * scale + \
                    module.bias.detach().double().numpy()
        self.weights = List([np.ascontiguousarray(w, dtype=np.float32) for w in weights])
        self.biases = List([b.astype(np.float32) for b in biases])
        self.inputs = np.zeros(policy.config.num_inputs, dtype=np.float32)

    def log_probs(self, state: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Masked log-probabilities of one raw window state (window, 6)."""
        encode_one(state, self.max_tasks, self.one_hot, self.inputs)
        return _log_probs_one(self.inputs, self.weights, self.biases, self.activation, mask)


class TorchForward:
    """`NumpyForward`'s interface over the torch network itself (for networks it cannot freeze)."""

    def __init__(self, policy: DL2Policy):
        self.policy = policy

    @torch.no_grad()
    def log_probs(self, state: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.policy.net.eval()
        logits = self.policy.net(self.policy.inputs(state[None]))
        return masked_log_probs(logits, torch.from_numpy(mask[None])).double().numpy()[0]


class DL2Scheduler:
    """DL2 behind the scheduler protocol: decisions one at a time until void, failure or nothing legal."""

    def __init__(self, policy: DL2Policy, greedy: bool = False, seed: int = 0, name: str = "dl2"):
        self.policy, self.greedy, self.name = policy, greedy, name
        self.rng = np.random.default_rng(seed)
        self.forward = TorchForward(policy) if policy.config.per_job else NumpyForward(policy)
        self.decisions = 0  # made in the last slot scheduled

    @classmethod
    def load(cls, path: str | Path, **kwargs) -> "DL2Scheduler":
        return cls(DL2Policy.load(path), **kwargs)

    def schedule(self, obs: Observation) -> Allocation:
        if obs.max_tasks != self.policy.max_tasks:
            raise Dl2Error(f"model was trained for max_tasks={self.policy.max_tasks}, the preset has {obs.max_tasks}")
        alloc = obs.allocation()
        window = self.policy.config.window
        state = np.zeros((window, NUM_FEATURES), dtype=np.float32)
        window_jobs = np.full(window, -1, dtype=np.int64)
        mask = np.zeros(3 * window + 1, dtype=np.bool_)
        self.decisions = 0
        while True:
            observe_window(alloc.jobs, alloc.cluster, obs.slot, obs.max_tasks, state, window_jobs)
            if action_mask(alloc.jobs, window_jobs, obs.max_tasks, mask) == 0:
                break
            action = self._choose(self.forward.log_probs(state, mask))
            self.decisions += 1
            if action == 3 * window or not place_least_loaded(alloc.jobs, alloc.cluster, int(window_jobs[action // 3]), action % 3):
                break
        return alloc

    def _choose(self, log_probs: np.ndarray) -> int:
        if self.greedy:
            return int(log_probs.argmax())
        cumulative = np.cumsum(np.exp(log_probs.astype(np.float64)))
        return min(int((cumulative <= self.rng.random() * cumulative[-1]).sum()), len(cumulative) - 1)

