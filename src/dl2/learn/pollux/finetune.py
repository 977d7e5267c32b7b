"""PPO fine-tuning in the Pollux world: rollouts of `rollout_length` decisions in each environment of a
`PolluxVecEnv` under the current policy, then dl2's clipped update (`dl2.learn.ppo`).

Credit as dl2's PPO gives it in the PS/worker world: the reward (the interval's progress) is paid on the
decision that ends the interval's decisions, decisions inside an interval are not discounted, `gamma`
discounts from one interval to the next, and GAE(lambda) spreads the credit back over the decisions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from dl2.learn.pollux.env import PolluxDecisionEnv
from dl2.learn.pollux.features import GIVEN
from dl2.learn.pollux.model import PolluxNets
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.learn.pollux.vec import PolluxVecEnv
from dl2.learn.ppo import advantages, clipped_update
from dl2.learn.ppo_rollout import Rollout
from dl2.learn.trainer import sample_actions
from dl2.pollux.workload import Workload
from dl2.workload.presets import PolluxPreset


def interval_ended(next_states: np.ndarray, assign_one: bool = False) -> np.ndarray:
    """Whether each environment's last decision ended an interval's decisions: the state it leads to has
    given no job more than the interval starts with (none; one each with `assign_one`), a new interval or
    episode, where any decision inside an interval gives a job one more (with `assign_one`, a second: an
    interval asks only while a GPU is free, so every window job that may have one has it)."""
    return next_states[..., GIVEN].max(-1) <= int(assign_one)


def collect(vec: PolluxVecEnv, nets: PolluxNets, states: np.ndarray, masks: np.ndarray, steps: int, gamma: float,
            rng: np.random.Generator, assign_one: bool = False) -> tuple[Rollout, np.ndarray, np.ndarray, list[float]]:
    """`steps` decisions in each environment from (states, masks): the rollout (network inputs as its
    states), the states and masks it ends on, and the reward of every interval that ended."""
    n = len(states)
    out = Rollout(np.zeros((steps, n, nets.config.num_inputs), np.float32), np.zeros((steps, *masks.shape), np.bool_),
                  np.zeros((steps, n), np.int64), np.zeros((steps, n), np.float32), np.zeros((steps + 1, n), np.float32),
                  np.zeros((steps, n), np.float32), np.ones((steps, n), np.float32), np.zeros((steps, n), np.bool_))
    interval_rewards: list[float] = []
    for t in range(steps):
        inputs = nets.inputs(states)
        log_probs, values = nets.log_probs(inputs, masks), nets.values(inputs)
        actions = sample_actions(np.exp(log_probs.astype(np.float64)), rng.random((n, 1)))
        out.states[t], out.masks[t], out.actions[t], out.values[t] = inputs.numpy(), masks, actions, values
        out.log_probs[t] = log_probs[np.arange(n), actions]
        states, masks, rewards, dones = vec.step(actions)
        ended = interval_ended(states, assign_one) | dones
        out.rewards[t], out.dones[t] = rewards, dones
        out.discounts[t] = np.where(ended, gamma, 1.0)
        interval_rewards += rewards[ended].tolist()
    out.values[-1] = nets.values(nets.inputs(states))
    return out, states, masks, interval_rewards


def finetune(nets: PolluxNets, workloads: Sequence[Workload], preset: PolluxPreset, settings: PolluxTrainSettings,
             rng: np.random.Generator, progress: bool = False) -> pd.DataFrame:
    """`settings.ppo_updates` rollouts and clipped updates; one history row per update."""
    envs = [PolluxDecisionEnv(workloads[k % len(workloads)], preset, settings.variant, settings.window,
                              assign_one=settings.assign_one) for k in range(settings.num_envs)]
    vec = PolluxVecEnv(envs, workloads)
    states, masks = vec.reset()
    optimizer = torch.optim.Adam(nets.parameters(), lr=settings.lr)
    history, episodes = [], 0
    for update in tqdm(range(1, settings.ppo_updates + 1), desc="PPO", unit="update", disable=not progress):
        rollout, states, masks, interval_rewards = collect(vec, nets, states, masks, settings.rollout_length,
                                                           settings.gamma, rng, settings.assign_one)
        adv = advantages(rollout, settings.gae_lambda)
        returns = adv + rollout.values[:-1]
        count = rollout.actions.size
        stats = clipped_update(
            nets.policy, nets.value, optimizer, torch.from_numpy(rollout.states.reshape(count, -1)),
            torch.from_numpy(rollout.masks.reshape(count, -1)), torch.from_numpy(rollout.actions.reshape(-1)),
            torch.from_numpy(rollout.log_probs.reshape(-1)), torch.from_numpy(adv.reshape(-1)),
            torch.from_numpy(returns.reshape(-1)), settings.ppo_epochs, settings.ppo_batch_size, settings.clip,
            settings.entropy, rng)
        finished = [run.jct.mean() for _, run in vec.finished[episodes:]]
        episodes = len(vec.finished)
        history.append({"update": update, "decisions": update * count, "intervals": len(interval_rewards),
                        "episodes_finished": len(finished),
                        "episode_avg_jct": float(np.mean(finished)) if finished else float("nan"),
                        "mean_interval_reward": float(np.mean(interval_rewards)) if interval_rewards else float("nan"),
                        "policy_loss": stats.policy_loss, "value_loss": stats.value_loss, "entropy": stats.entropy})
    return pd.DataFrame(history)
