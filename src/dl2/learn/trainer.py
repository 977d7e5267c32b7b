"""Online RL fine-tuning over parallel clusters (DESIGN §5): what every learner shares.

`Trainer` holds a run: the policy and a value network, `num_envs` training environments ("clusters")
stepped in lockstep, the validation and selection traces, and the loop that alternates the learner's
`step()` with validation and checkpoints. The learners are subclasses: `ActorCriticTrainer`
(`dl2.learn.actor_critic`, the paper's) and `PPOTrainer` (`dl2.learn.ppo`), each reading its own settings
(`dl2.learn.settings`); `make_trainer` picks one by the settings' `algorithm`.

With selection traces (held out from training, and from validation), every validation also runs the
policy greedily on them, in the training world (OfflineRL never sees measured speeds), and the trainer
keeps the weights that did best there; `chosen_policy()` returns those (early stopping by held-out JCT:
fine-tuning is not monotone).

The trainer's whole state (networks, optimizers, environments, replay, random generators, the best
weights) is checkpointed, so a killed run resumes and, with the same seed, ends where an uninterrupted
run ends. A checkpoint is a pickle: load only your own.
"""

from __future__ import annotations

import copy
import pickle
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy
from dl2.learn.env import DecisionEnv
from dl2.learn.nets import value_net
from dl2.learn.rollout import run_policy
from dl2.learn.settings import LearnerSettings
from dl2.paths import atomic_path
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace


def sample_actions(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """One action per row of `probs` (unnormalised), picked by that row's uniform draw in [0, 1)."""
    cumulative = np.cumsum(probs, axis=-1)
    draws = uniforms * cumulative[:, -1:]
    return np.minimum((cumulative <= draws).sum(axis=-1), probs.shape[-1] - 1)


class Trainer:
    """One fine-tuning run; `train()` runs until `config.updates` updates are done. Subclasses implement
    `step()` (collect experience and update) and list their optimizers in `optimizers`."""

    def __init__(self, policy: DL2Policy, train: Sequence[Trace], validation: Sequence[Trace], scenario: Scenario,
                 config: LearnerSettings, seed: int, validation_scenario: Scenario | None = None, tag: str = "",
                 make_env: Callable[..., DecisionEnv] = DecisionEnv, selection: Sequence[Trace] = ()):
        """`config`: the learner's settings, as `params.yaml` gives them; `seed`: the run's. `validation_scenario`
        defaults to `scenario` (OfflineRL trains on analytical speeds, validates on measured ones); `tag`
        identifies the run, so a checkpoint of another run is never resumed;
        `make_env(traces, scenario, window, seed=...)` builds each training cluster (another backend's
        environment with `DecisionEnv`'s interface plugs in here); `selection`: the traces the kept weights
        are chosen on (none: keep the last)."""
        self.config, self.seed, self.policy, self.validation, self.scenario = config, seed, policy, list(validation), scenario
        self.selection = list(selection)
        self.best: tuple[float, int, dict] | None = None  # (selection JCT, update, policy weights)
        self.validation_scenario = validation_scenario or scenario
        self.tag = tag
        torch.manual_seed(seed)
        self.value = value_net(policy.config)
        self.optimizers: list[torch.optim.Optimizer] = []
        seeds = np.random.SeedSequence(seed).spawn(config.num_envs + 1)
        self.envs = [make_env(train, scenario, policy.config.window, seed=int(s.generate_state(1)[0])) for s in seeds[1:]]
        self.rng = np.random.default_rng(seeds[0])
        self.updates = 0
        self.decisions = 0
        self.slots_done = 0
        self.baseline = 0.0  # stands in for the critic when `critic: off`
        self.history: list[dict] = []
        self.episode_jcts: list[float] = []
        self.last_update: dict[str, float] = {}  # the latest update's losses, logged with the next validation
        for env in self.envs:
            env.reset()

    def step(self) -> bool:
        """Collect experience and (when enough is collected) update; True when the loop should then validate
        and checkpoint as due."""
        raise NotImplementedError

    def train(self, checkpoint: str | Path | None = None, on_row: Callable[[dict], None] | None = None,
              stop_after: int | None = None) -> pd.DataFrame:
        """Train to `config.updates` (or stop after `stop_after` more updates); checkpoint as configured."""
        torch.set_num_threads(1)
        target = self.config.updates if stop_after is None else min(self.config.updates, self.updates + stop_after)
        start = time.perf_counter()
        while self.updates < target:
            self._set_learning_rate()
            if not self.step():
                continue
            if self.updates % self.config.validate_every == 0 or self.updates == self.config.updates:
                row = self._validate(time.perf_counter() - start)
                if on_row is not None:
                    on_row(row)
            if checkpoint is not None and (self.updates % self.config.checkpoint_every == 0 or self.updates == target):
                self.save(checkpoint)
        return pd.DataFrame(self.history)

    def use_cluster_actors(self, executor) -> None:
        """Hold the training environments on Ray actors (`executor.cluster_actors`); only PPO can."""
        raise Dl2Error(f"executor.cluster_actors: algorithm {self.config.algorithm} updates between the decisions of a slot, "
                       "so its clusters step in the learner's process; set executor.cluster_actors: 0 or finetune.algorithm: ppo")

    def close(self) -> None:
        """Free what the training environments hold outside this process (a cluster's pods); a checkpoint
        written before still resumes, its environments starting their next trace."""
        for env in self.envs:
            env.close()

    def _set_learning_rate(self) -> None:
        c = self.config
        lr = c.lr * (1 - self.updates / c.updates) if c.lr_schedule == "linear" else c.lr
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr

    def _sample(self, probs: np.ndarray) -> np.ndarray:
        """One action per row of `probs`, drawn with the trainer's generator."""
        return sample_actions(probs, self._sample_uniforms(len(probs)))

    def _sample_uniforms(self, rows: int) -> np.ndarray:
        """The draws `_sample` takes for `rows` actions."""
        return self.rng.random((rows, 1))

    def _validate(self, seconds: float) -> dict:
        sampled = run_policy(self.policy, self.validation, self.validation_scenario, greedy=False, seed=self.seed)
        greedy = run_policy(self.policy, self.validation, self.validation_scenario, greedy=True)
        row = {"update": self.updates, "decisions": self.decisions, "val_jct_sampled": float(np.mean(sampled.avg_jct)),
               "val_jct_greedy": float(np.mean(greedy.avg_jct)),
               "train_jct_recent": float(np.mean(self.episode_jcts[-20:])) if self.episode_jcts else float("nan"),
               **self.last_update, "seconds": seconds}
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
    def load(path: str | Path) -> Trainer:
        """A checkpoint written by `save` (a pickle: load only your own)."""
        path = Path(path)
        if not path.is_file():
            raise Dl2Error(f"{path}: checkpoint not found")
        try:
            with open(path, "rb") as f:
                trainer = pickle.load(f)
        except (EOFError, OSError, pickle.UnpicklingError, AttributeError, ImportError) as exc:
            raise Dl2Error(f"{path}: not a dl2 training checkpoint of this version ({exc})") from None
        if not isinstance(trainer, Trainer):
            raise Dl2Error(f"{path}: not a dl2 training checkpoint")
        return trainer
