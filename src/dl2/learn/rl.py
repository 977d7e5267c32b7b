"""Online RL fine-tuning over parallel simulated clusters (DESIGN §5), with two learners.

`algorithm: dl2` is the paper's: several environments ("clusters") step in lockstep, one decision each
per round, batched through the policy. Every decision of a slot gets that slot's reward; the critic
target is the slot reward (the authors' code) or the discounted TD target r + gamma * V(next slot's first
state) (the paper); without a critic a moving-average baseline stands in. After every `num_envs`
completed slots, one update: a batch from the replay, advantage = target - V(s) (scaled by importance
weights when prioritized), policy gradient with an entropy bonus averaged over the `3W+1` actions (the
authors' code: beta = 0.1 weighs it as theirs does), value regression.

`algorithm: ppo` is dl2's own: the same environments, network, slot reward and critic targets (`critic:
slot` means no discounting across slots, as in the authors' code), but each decision is credited with its
own effect (GAE over decisions, optional potential shaping; see `dl2.learn.ppo`), learned on-policy with
a clipped surrogate. One update = `rollout_length` decisions in every environment, then `ppo_epochs`
passes over them.

With selection traces (held out from training, and from validation), every validation also runs the
policy greedily on them, in the training world (OfflineRL never sees measured speeds), and the trainer
keeps the weights that did best there; `chosen_policy()` returns those (early stopping by held-out JCT:
fine-tuning is not monotone).

The trainer's whole state (networks, optimizers, environments, replay, random generators, the best
weights) is checkpointed, so a killed run resumes and, with the same seed, ends where an uninterrupted
run ends.
"""

from __future__ import annotations

import copy
import pickle
from collections import deque
import time
from dataclasses import dataclass, replace
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
from dl2.learn.ppo import Rollout, advantages, clipped_update
from dl2.learn.replay import Replay
from dl2.learn.rollout import run_policy
from dl2.paths import atomic_path
from dl2.sim.state import NUM_FEATURES
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace

CRITICS = ("slot", "td", "off")
REWARDS = ("slot", "job")
ALGORITHMS = ("dl2", "ppo")
SHAPING = ("off", "env", "analytical")
LR_SCHEDULES = ("constant", "linear")


@dataclass(frozen=True)
class RLConfig:
    algorithm: str = "dl2"  # dl2 (the paper's learner) | ppo (per-decision credit, on-policy)
    updates: int = 1000  # learner updates: dl2, one per `num_envs` completed slots; ppo, one per rollout
    num_envs: int = 8  # parallel clusters feeding one learner
    lr: float = 1e-4
    entropy: float = 0.1
    batch_size: int = 256
    replay: str = "prioritized"  # off | uniform | prioritized
    replay_size: int = 8192
    learn_start: int = 1024  # decisions buffered before the first update
    critic: str = "slot"  # slot (authors' code) | td (paper) | off (moving-average baseline)
    reward: str = "slot"  # dl2: every decision gets the slot's reward | job: its job's share (void: the mean share)
    gamma: float = 0.9
    exploration: str = "code"  # off | paper | code | epsilon
    epsilon: float = 0.4
    shaping: str = "off"  # ppo: potential from no model | the training environment's speeds | the analytical model
    gae_lambda: float = 0.95  # ppo
    clip: float = 0.2  # ppo
    ppo_epochs: int = 4  # ppo: passes over each rollout
    rollout_length: int = 128  # ppo: decisions per environment per update
    lr_schedule: str = "constant"  # constant | linear (decays to 0 at the last update)
    validate_every: int = 100
    checkpoint_every: int = 100
    select_traces: int = 0  # held-out traces to keep the best validated weights on (0: keep the last weights)
    seed: int = 0

    def __post_init__(self):
        for key, known in (("algorithm", ALGORITHMS), ("critic", CRITICS), ("shaping", SHAPING),
                           ("lr_schedule", LR_SCHEDULES), ("reward", REWARDS)):
            if getattr(self, key) not in known:
                raise Dl2Error(f"{key}: expected one of {', '.join(known)}, got {getattr(self, key)!r}")
        if self.algorithm == "ppo":
            for key in ("exploration", "replay"):
                if getattr(self, key) != "off":
                    raise Dl2Error(f"{key}: algorithm ppo learns on-policy, set {key}: off (got {getattr(self, key)!r})")
            if self.reward != "slot":
                raise Dl2Error(f"reward: algorithm ppo credits each decision itself, set reward: slot (got {self.reward!r})")
        elif self.shaping != "off":
            raise Dl2Error(f"shaping: only algorithm ppo shapes rewards, set shaping: off (got {self.shaping!r})")
        for key in ("updates", "num_envs", "batch_size", "replay_size", "validate_every", "checkpoint_every",
                    "ppo_epochs", "rollout_length"):
            if getattr(self, key) <= 0:
                raise Dl2Error(f"finetune.{key}: expected a positive integer, got {getattr(self, key)}")


class Trainer:
    """Holds everything a run needs; `train()` runs until `config.updates` updates are done."""

    def __init__(self, policy: DL2Policy, train: Sequence[Trace], validation: Sequence[Trace], scenario: Scenario,
                 config: RLConfig, validation_scenario: Scenario | None = None, tag: str = "",
                 make_env: Callable[..., DecisionEnv] = DecisionEnv, selection: Sequence[Trace] = ()):
        """`validation_scenario` defaults to `scenario` (OfflineRL trains on analytical speeds, validates on
        measured ones); `tag` identifies the run, so a checkpoint of another run is never resumed;
        `make_env(traces, scenario, window, seed=...)` builds each training cluster (another backend's
        environment with `DecisionEnv`'s interface plugs in here); `selection`: the traces the kept weights
        are chosen on (none: keep the last)."""
        self.config, self.policy, self.validation, self.scenario = config, policy, list(validation), scenario
        self.selection = list(selection)
        self.best: tuple[float, int, dict] | None = None  # (selection JCT, update, policy weights)
        self.validation_scenario = validation_scenario or scenario
        self.tag = tag
        torch.manual_seed(config.seed)
        self.value = value_net(policy.config)
        self.policy_opt = torch.optim.Adam(policy.net.parameters(), lr=config.lr)
        self.value_opt = torch.optim.Adam(self.value.parameters(), lr=config.lr)
        self.joint_opt = torch.optim.Adam([*policy.net.parameters(), *self.value.parameters()], lr=config.lr)
        self.potential_table = _potential_table(config.shaping, scenario)
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
        self.slot_rewards: deque[float] = deque(maxlen=200)  # the latest slots' (unshaped) rewards
        self.pending: list[list[tuple[np.ndarray, np.ndarray, int, int]]] = [[] for _ in self.envs]
        self.ratios = self.rng.integers(3, 8, len(self.envs))
        for env in self.envs:
            env.reset()
        if config.reward == "job" and not all(hasattr(env, "job_reward") for env in self.envs):
            raise Dl2Error("finetune.reward: job needs the simulator's environments (backend: sim)")

    def train(self, checkpoint: str | Path | None = None, on_row: Callable[[dict], None] | None = None,
              stop_after: int | None = None) -> pd.DataFrame:
        """Train to `config.updates` (or stop after `stop_after` more updates); checkpoint as configured."""
        torch.set_num_threads(1)
        target = self.config.updates if stop_after is None else min(self.config.updates, self.updates + stop_after)
        start = time.perf_counter()
        while self.updates < target:
            self._set_learning_rate()
            if self.config.algorithm == "ppo":
                self._ppo_update(self._collect())
            elif self._round():
                self._update()
            else:
                continue
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
        actions = self._sample(probs)
        ready = False
        for k, env in enumerate(self.envs):
            action = self.explorer.choose(int(actions[k]), states[k], masks[k], probs[k], self.updates, self.rng,
                                          int(self.ratios[k]))
            job = int(env.window_jobs[action // 3]) if action < len(masks[k]) - 1 else -1
            self.pending[k].append((states[k].copy(), masks[k].copy(), action, job))
            _, reward, terminated, truncated, info = env.step(action)
            self.decisions += 1
            if not info["slot_end"]:
                continue
            for state, mask, act, job in self.pending[k]:
                paid = reward if self.config.reward == "slot" else _job_reward(env, job)
                self.replay.add(state, mask, act, paid, env.state, env.mask, terminated or truncated)
            self.pending[k].clear()
            self.ratios[k] = self.rng.integers(3, 8)
            self.slots_done += 1
            ready = ready or self.slots_done % len(self.envs) == 0
            if terminated:
                self.episode_jcts.append(float(np.mean(info["jct"])))
            if terminated or truncated:
                env.reset()
        return ready and self.replay.size >= self.config.learn_start

    def _set_learning_rate(self) -> None:
        c = self.config
        lr = c.lr * (1 - self.updates / c.updates) if c.lr_schedule == "linear" else c.lr
        for optimizer in (self.policy_opt, self.value_opt, self.joint_opt):
            for group in optimizer.param_groups:
                group["lr"] = lr

    def _collect(self) -> Rollout:
        """`rollout_length` decisions in every environment under the current policy (ppo)."""
        c, n = self.config, len(self.envs)
        slot_discount = 0.0 if c.critic == "slot" else c.gamma
        out = Rollout.empty(c.rollout_length, n, self.policy.config.window, NUM_FEATURES)
        for t in range(c.rollout_length):
            states = np.stack([e.state for e in self.envs])
            masks = np.stack([e.mask for e in self.envs])
            log_probs, values = self._evaluate(states, masks)
            actions = self._sample(np.exp(log_probs.astype(np.float64)))
            out.states[t], out.masks[t], out.actions[t], out.values[t] = states, masks, actions, values
            out.log_probs[t] = log_probs[np.arange(n), actions]
            for k, env in enumerate(self.envs):
                before = env.potential(self.potential_table) if self.potential_table is not None else 0.0
                _, reward, terminated, truncated, info = env.step(int(actions[k]))
                self.decisions += 1
                discount = slot_discount if info["slot_end"] else 1.0
                ended = terminated or truncated
                after = env.potential(self.potential_table) if self.potential_table is not None and not ended else 0.0
                out.rewards[t, k], out.discounts[t, k], out.dones[t, k] = reward + discount * after - before, discount, ended
                if info["slot_end"]:
                    self.slots_done += 1
                    self.slot_rewards.append(reward)
                if terminated:
                    self.episode_jcts.append(float(np.mean(info["jct"])))
                if ended:
                    env.reset()
        states = np.stack([e.state for e in self.envs])
        out.values[-1] = self._evaluate(states, np.stack([e.mask for e in self.envs]))[1]
        return out

    def _ppo_update(self, rollout: Rollout) -> None:
        c = self.config
        adv = advantages(rollout, c.gae_lambda)
        returns = adv + rollout.values[:-1]
        flat = rollout.states.reshape(-1, *rollout.states.shape[2:])
        stats = clipped_update(
            self.policy.net, self.value if c.critic != "off" else None, self.joint_opt, self.policy.inputs(flat),
            torch.from_numpy(rollout.masks.reshape(len(flat), -1)), torch.from_numpy(rollout.actions.reshape(-1)),
            torch.from_numpy(rollout.log_probs.reshape(-1)), torch.from_numpy(adv.reshape(-1)),
            torch.from_numpy(returns.reshape(-1)), c.ppo_epochs, c.batch_size, c.clip, c.entropy, self.rng)
        if c.critic == "off":
            self.baseline = 0.9 * self.baseline + 0.1 * float(returns.mean())
        self.updates += 1
        self._last = {"policy_loss": stats.policy_loss, "value_loss": stats.value_loss, "entropy": stats.entropy,
                      "mean_reward": float(np.mean(self.slot_rewards)) if self.slot_rewards else float("nan")}

    @torch.no_grad()
    def _evaluate(self, states: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Masked log-probabilities and value estimates (the moving baseline without a critic)."""
        self.policy.net.eval()
        self.value.eval()
        x = self.policy.inputs(states)
        log_probs = masked_log_probs(self.policy.net(x), torch.from_numpy(masks)).numpy()
        values = self.value(x).squeeze(-1).numpy() if self.config.critic != "off" else np.full(len(x), self.baseline, np.float32)
        return log_probs, values

    def _sample(self, probs: np.ndarray) -> np.ndarray:
        """One action per row of `probs`, drawn with the trainer's generator."""
        cumulative = np.cumsum(probs, axis=-1)
        draws = self.rng.random((len(probs), 1)) * cumulative[:, -1:]
        return np.minimum((cumulative <= draws).sum(axis=-1), probs.shape[-1] - 1)

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
        # as in the authors' code, the entropy term averages over the actions as well as the samples
        loss = -(weighted * chosen).mean() - c.entropy * entropy.mean() / masks.shape[-1]
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
        if self.selection:
            row["select_jct"] = float(np.mean(run_policy(self.policy, self.selection, self.scenario, greedy=True).avg_jct))
            if self.best is None or row["select_jct"] < self.best[0]:
                self.best = (row["select_jct"], self.updates, copy.deepcopy(self.policy.net.state_dict()))
        self.history.append(row)
        return row

    def chosen_policy(self) -> DL2Policy:
        """The weights that did best on the selection traces, or the current ones without selection."""
        if self.best is None:
            return self.policy
        chosen = DL2Policy.load_state(self.policy)
        chosen.net.load_state_dict(self.best[2])
        return chosen

    @property
    def chosen_update(self) -> int:
        """The update whose weights `chosen_policy()` returns."""
        return self.updates if self.best is None else self.best[1]

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


def _job_reward(env: DecisionEnv, job: int) -> float:
    """A decision's per-action reward: its job's share of the slot just ended; void's, the mean share."""
    if job >= 0:
        return float(env.job_reward[job])
    trained = env.job_reward[env.job_reward > 0]
    return float(trained.mean()) if len(trained) else 0.0


def _potential_table(shaping: str, scenario: Scenario) -> np.ndarray | None:
    """Epochs per slot of the speed model that shapes rewards, or None without shaping."""
    if shaping == "off":
        return None
    if shaping == "env":
        return scenario.table
    return Scenario(scenario.preset, replace(scenario.options, speed_model="analytical")).table
