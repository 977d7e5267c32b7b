"""Online RL fine-tuning: actor-critic over parallel simulated clusters (DESIGN §5).

Several environments ("clusters") step in lockstep, one decision each per round, batched through the
policy. Every decision of a slot gets that slot's reward; the critic target is the slot reward (the
authors' code) or the discounted TD target r + gamma * V(next slot's first state) (the paper); without a
critic a moving-average baseline stands in. After every `num_envs` completed slots, one update: a batch
from the replay, advantage = target - V(s) (scaled by importance weights when prioritized), policy
gradient with an entropy bonus, value regression.

The trainer's whole state (networks, optimizers, environments, replay, random generators) is
checkpointed, so a killed run resumes and, with the same seed, ends where an uninterrupted run ends.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy
from dl2.learn.env import DecisionEnv
from dl2.learn.exploration import Explorer
from dl2.learn.nets import masked_log_probs, value_net
from dl2.learn.replay import Replay
from dl2.learn.rollout import run_policy
from dl2.paths import atomic_path
from dl2.sim.state import NUM_FEATURES
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace

CRITICS = ("slot", "td", "off")


@dataclass(frozen=True)
class RLConfig:
    updates: int = 1000  # learner updates; one per `num_envs` completed slots
    num_envs: int = 8  # parallel clusters feeding one learner
    lr: float = 1e-4
    entropy: float = 0.1
    batch_size: int = 256
    replay: str = "prioritized"  # off | uniform | prioritized
    replay_size: int = 8192
    learn_start: int = 1024  # decisions buffered before the first update
    critic: str = "slot"  # slot (authors' code) | td (paper) | off (moving-average baseline)
    gamma: float = 0.9
    exploration: str = "code"  # off | paper | code | epsilon
    epsilon: float = 0.4
    validate_every: int = 100
    checkpoint_every: int = 100
    seed: int = 0

    def __post_init__(self):
        if self.critic not in CRITICS:
            raise Dl2Error(f"critic: expected one of {', '.join(CRITICS)}, got {self.critic!r}")
        for key in ("updates", "num_envs", "batch_size", "replay_size", "validate_every", "checkpoint_every"):
            if getattr(self, key) <= 0:
                raise Dl2Error(f"finetune.{key}: expected a positive integer, got {getattr(self, key)}")


class Trainer:
    """Holds everything a run needs; `train()` runs until `config.updates` updates are done."""

    def __init__(self, policy: DL2Policy, train: Sequence[Trace], validation: Sequence[Trace], scenario: Scenario,
                 config: RLConfig, validation_scenario: Scenario | None = None, tag: str = "",
                 make_env: Callable[..., DecisionEnv] = DecisionEnv):
        """`validation_scenario` defaults to `scenario` (OfflineRL trains on analytical speeds, validates on
        measured ones); `tag` identifies the run, so a checkpoint of another run is never resumed;
        `make_env(traces, scenario, window, seed=...)` builds each training cluster (another backend's
        environment with `DecisionEnv`'s interface plugs in here)."""
        self.config, self.policy, self.validation, self.scenario = config, policy, list(validation), scenario
        self.validation_scenario = validation_scenario or scenario
        self.tag = tag
        torch.manual_seed(config.seed)
        self.value = value_net(policy.config)
        self.policy_opt = torch.optim.Adam(policy.net.parameters(), lr=config.lr)
        self.value_opt = torch.optim.Adam(self.value.parameters(), lr=config.lr)
        window = policy.config.window
        seeds = np.random.SeedSequence(config.seed).spawn(config.num_envs + 1)
        self.envs = [make_env(train, scenario, window, seed=int(s.generate_state(1)[0])) for s in seeds[1:]]
        self.rng = np.random.default_rng(seeds[0])
        self.replay = Replay(config.replay, config.replay_size, window, NUM_FEATURES, 3 * window + 1)
        self.explorer = Explorer(config.exploration, config.epsilon)
        self.updates = 0
        self.decisions = 0
        self.slots_done = 0
        self.baseline = 0.0
        self.history: list[dict] = []
        self.episode_jcts: list[float] = []
        self.pending: list[list[tuple[np.ndarray, np.ndarray, int]]] = [[] for _ in self.envs]
        self.ratios = self.rng.integers(3, 8, len(self.envs))
        for env in self.envs:
            env.reset()

    def train(self, checkpoint: str | Path | None = None, on_row: Callable[[dict], None] | None = None,
              stop_after: int | None = None) -> pd.DataFrame:
        """Train to `config.updates` (or stop after `stop_after` more updates); checkpoint as configured."""
        torch.set_num_threads(1)
        target = self.config.updates if stop_after is None else min(self.config.updates, self.updates + stop_after)
        start = time.perf_counter()
        while self.updates < target:
            if self._round():
                self._update()
                if self.updates % self.config.validate_every == 0 or self.updates == self.config.updates:
                    row = self._validate(time.perf_counter() - start)
                    if on_row is not None:
                        on_row(row)
                if checkpoint is not None and (self.updates % self.config.checkpoint_every == 0 or self.updates == target):
                    self.save(checkpoint)
        return pd.DataFrame(self.history)

    def _round(self) -> bool:
        """One decision in every environment; True when enough slots completed for an update."""
        states = np.stack([e.state for e in self.envs])
        masks = np.stack([e.mask for e in self.envs])
        probs = self._probs(states, masks)
        cumulative = np.cumsum(probs, axis=-1)
        draws = self.rng.random((len(self.envs), 1)) * cumulative[:, -1:]
        actions = np.minimum((cumulative <= draws).sum(axis=-1), probs.shape[-1] - 1)
        ready = False
        for k, env in enumerate(self.envs):
            action = self.explorer.choose(int(actions[k]), states[k], masks[k], probs[k], self.updates, self.rng,
                                          int(self.ratios[k]))
            self.pending[k].append((states[k].copy(), masks[k].copy(), action))
            _, reward, terminated, truncated, info = env.step(action)
            self.decisions += 1
            if not info["slot_end"]:
                continue
            for state, mask, act in self.pending[k]:
                self.replay.add(state, mask, act, reward, env.state, env.mask, terminated or truncated)
            self.pending[k].clear()
            self.ratios[k] = self.rng.integers(3, 8)
            self.slots_done += 1
            ready = ready or self.slots_done % len(self.envs) == 0
            if terminated:
                self.episode_jcts.append(float(np.mean(info["jct"])))
            if terminated or truncated:
                env.reset()
        return ready and self.replay.size >= self.config.learn_start

    @torch.no_grad()
    def _probs(self, states: np.ndarray, masks: np.ndarray) -> np.ndarray:
        self.policy.net.eval()
        logits = self.policy.net(self.policy.inputs(states))
        return torch.exp(masked_log_probs(logits, torch.from_numpy(masks))).double().numpy()

    def _update(self) -> None:
        c = self.config
        beta = min(1.0, 0.1 + 0.9 * self.updates / max(1, c.updates))
        idx, weights = self.replay.sample(c.batch_size, self.rng, beta)
        if len(idx) == 0:
            return
        r = self.replay
        x = self.policy.inputs(r.states[idx])
        masks = torch.from_numpy(r.masks[idx])
        actions = torch.from_numpy(r.actions[idx])
        targets = torch.from_numpy(r.rewards[idx]).float()
        self.value.train()
        values = self.value(x).squeeze(-1)
        if c.critic == "td":
            with torch.no_grad():
                self.value.eval()
                following = self.value(self.policy.inputs(r.next_states[idx])).squeeze(-1)
                self.value.train()
            targets = targets + c.gamma * following * torch.from_numpy(~r.done[idx]).float()
        if c.critic == "off":
            advantages = targets - self.baseline
            self.baseline = 0.99 * self.baseline + 0.01 * float(targets.mean())
        else:
            advantages = targets - values.detach()
            value_loss = ((targets - values) ** 2).mean()
            self.value_opt.zero_grad()
            value_loss.backward()
            self.value_opt.step()
        self.replay.update(idx, advantages.numpy())
        self.policy.net.train()
        log_probs = masked_log_probs(self.policy.net(x), masks)
        chosen = log_probs.gather(1, actions[:, None]).squeeze(1)
        probs = log_probs.exp()
        entropy = -(probs * log_probs.masked_fill(~masks, 0.0)).sum(-1)
        weighted = advantages * torch.from_numpy(weights).float()
        loss = -(weighted * chosen).mean() - c.entropy * entropy.mean()
        self.policy_opt.zero_grad()
        loss.backward()
        self.policy_opt.step()
        self.updates += 1
        self._last = {"policy_loss": float(loss.detach()), "entropy": float(entropy.mean().detach()),
                      "mean_reward": float(r.rewards[idx].mean())}

    def _validate(self, seconds: float) -> dict:
        sampled = run_policy(self.policy, self.validation, self.validation_scenario, greedy=False, seed=self.config.seed)
        greedy = run_policy(self.policy, self.validation, self.validation_scenario, greedy=True)
        row = {"update": self.updates, "decisions": self.decisions, "val_jct_sampled": float(np.mean(sampled.avg_jct)),
               "val_jct_greedy": float(np.mean(greedy.avg_jct)),
               "train_jct_recent": float(np.mean(self.episode_jcts[-20:])) if self.episode_jcts else float("nan"),
               **self._last, "seconds": seconds}
        self.history.append(row)
        return row

    def save(self, path: str | Path) -> None:
        """Checkpoint the whole trainer, atomically."""
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load(path: str | Path) -> "Trainer":
        path = Path(path)
        if not path.is_file():
            raise Dl2Error(f"{path}: checkpoint not found")
        try:
            with open(path, "rb") as f:
                trainer = pickle.load(f)
        except (EOFError, OSError, pickle.UnpicklingError, AttributeError, ImportError) as exc:
            raise Dl2Error(f"{path}: not a dl2 training checkpoint ({exc})") from None
        if not isinstance(trainer, Trainer):
            raise Dl2Error(f"{path}: not a dl2 training checkpoint")
        return trainer
