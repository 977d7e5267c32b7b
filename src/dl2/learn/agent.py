"""The DL2 policy as a scheduler: a policy network choosing actions in DL2's action space.

`DL2Policy` acts on batches of raw window states; `DL2Scheduler` wraps it in the scheduler protocol so
it runs wherever a heuristic does (`dl2 simulate --policy model.pt`, `compare`, Kubernetes).

A model file is data: the architecture, `max_tasks`, whether every job gets one bundle before the policy
acts (`assign_bundle`, as it was trained), and the weights. It loads with `torch.load(weights_only=True)`,
so a shared file cannot run code. Loaded as a scheduler it acts as `evaluate` reports it: greedily.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from dl2.errors import Dl2Error
from dl2.learn.architecture import NetConfig
from dl2.learn.compiled import FrozenPolicy, schedule_slot
from dl2.learn.features import encode
from dl2.learn.nets import MLP, masked_log_probs, policy_net
from dl2.paths import atomic_path
from dl2.schedulers.base import Allocation, Observation
from dl2.sim.engine import assign_bundles
from dl2.sim.state import NUM_FEATURES


def masks_from_states(states: np.ndarray, max_tasks: int) -> np.ndarray:
    """The legal-action masks of raw window states (batch, window, 6)."""
    filled = states[..., 0] > 0
    worker_ok = filled & (states[..., 4] < max_tasks)
    ps_ok = filled & (states[..., 5] < max_tasks)
    per_job = np.stack([worker_ok, ps_ok, worker_ok & ps_ok], axis=-1).reshape(*states.shape[:-2], -1)
    void = np.ones((*states.shape[:-2], 1), dtype=bool)
    return np.concatenate([per_job, void], axis=-1)


class DL2Policy:
    """A policy network plus what it needs to act: its architecture, the preset's max_tasks, and whether
    every job gets one bundle before it acts (the slots it learnt from began so)."""

    def __init__(self, config: NetConfig, max_tasks: int, assign_bundle: bool, net: MLP | None = None):
        self.config, self.max_tasks, self.assign_bundle = config, max_tasks, assign_bundle
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
        """Architecture, options and weights in one file of plain data (`extra`: strings and numbers), atomically."""
        payload = {"config": self.config.to_dict(), "max_tasks": self.max_tasks, "assign_bundle": self.assign_bundle,
                   "state_dict": self.net.state_dict(), "extra": extra or {}}
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)

    @classmethod
    def load_state(cls, other: DL2Policy) -> DL2Policy:
        """An independent copy of `other` (same architecture, options and weights)."""
        policy = cls(other.config, other.max_tasks, other.assign_bundle)
        policy.net.load_state_dict(other.net.state_dict())
        return policy

    @classmethod
    def load(cls, path: str | Path) -> DL2Policy:
        """A saved model; a file that holds anything but data (code to run, say) is refused unopened."""
        path = Path(path)
        if not path.is_file():
            raise Dl2Error(f"{path}: model file not found")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's notes on pickle protocols, for files that are no model
                payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch reports a file it cannot read with many exception types
            code = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
            if code:
                raise Dl2Error(f"{path}: refused: a dl2 model holds only weights and settings, this file also holds "
                               f"Python code ({code.group(1)}), which dl2 never runs") from None
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise Dl2Error(f"{path}: not a dl2 model ({reason})") from None
        if not isinstance(payload, dict):
            raise Dl2Error(f"{path}: not a dl2 model (expected a mapping of settings and weights)")
        try:
            config = NetConfig(**{**payload["config"], "hidden": tuple(payload["config"]["hidden"])})
            policy = cls(config, int(payload["max_tasks"]), bool(payload["assign_bundle"]))
            policy.net.load_state_dict(payload["state_dict"])
        except KeyError as exc:
            raise Dl2Error(f"{path}: not a dl2 model (no {exc} entry; a model from an older dl2 is retrained by the "
                           "pipeline)") from None
        except (RuntimeError, TypeError, ValueError) as exc:
            raise Dl2Error(f"{path}: not a dl2 model ({exc})") from None
        return policy


def weights_digest(policy: DL2Policy) -> str:
    """Identifies a policy's weights: the SHA-256 of its network's tensors in state-dict order."""
    digest = hashlib.sha256()
    for tensor in policy.net.state_dict().values():
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


class DL2Scheduler:
    """DL2 behind the scheduler protocol: decisions one at a time until void, failure or nothing legal.

    Greedy (its most likely action) unless `greedy=False`, which samples from the softmax with `seed`. A
    policy trained with a bundle per job before it acts gives those bundles itself, unless the backend
    already did (`--assign-bundle`), so it acts as it learnt wherever it runs.
    """

    def __init__(self, policy: DL2Policy, greedy: bool = True, seed: int = 0, name: str = "dl2"):
        self.policy, self.greedy, self.name = policy, greedy, name
        self.rng = np.random.default_rng(seed)
        self.frozen = FrozenPolicy(policy)
        window = policy.config.window
        self._state = np.zeros((window, NUM_FEATURES), dtype=np.float32)
        self._window_jobs = np.full(window, -1, dtype=np.int64)
        self._mask = np.zeros(3 * window + 1, dtype=np.bool_)
        self.decisions = 0  # made in the last slot scheduled

    @classmethod
    def load(cls, path: str | Path, **kwargs) -> DL2Scheduler:
        return cls(DL2Policy.load(path), **kwargs)

    def schedule(self, obs: Observation) -> Allocation:
        if obs.max_tasks != self.policy.max_tasks:
            raise Dl2Error(f"model was trained for max_tasks={self.policy.max_tasks}, the preset has {obs.max_tasks}")
        alloc = obs.allocation()
        if self.policy.assign_bundle and alloc.cluster.num_tasks[0] == 0:
            assign_bundles(alloc.jobs, alloc.cluster)
        seed = 0 if self.greedy else int(self.rng.integers(2**31))
        self.decisions = schedule_slot(self.frozen.frozen, alloc.jobs, alloc.cluster, obs.slot, self.greedy, seed,
                                       self._state, self._window_jobs, self._mask)
        return alloc
