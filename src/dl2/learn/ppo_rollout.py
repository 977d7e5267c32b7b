"""PPO's rollouts: `rollout_length` decisions in each of a trainer's environments, as time-major arrays,
collected in the trainer's process or on the Ray actors that hold its environments
(`dl2.learn.cluster_actors`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dl2.learn.agent import DL2Policy
from dl2.learn.env import DecisionEnv
from dl2.learn.nets import masked_log_probs
from dl2.learn.settings import LearnerSettings
from dl2.learn.trainer import sample_actions
from dl2.sim.state import NUM_FEATURES


@dataclass
class Rollout:
    """`steps` decisions of `n` environments, time-major."""

    states: np.ndarray  # float32 (steps, n, window, 6)
    masks: np.ndarray  # bool (steps, n, actions)
    actions: np.ndarray  # int64 (steps, n)
    log_probs: np.ndarray  # float32 (steps, n), under the policy that acted
    values: np.ndarray  # float32 (steps + 1, n), the last row bootstraps
    rewards: np.ndarray  # float32 (steps, n)
    discounts: np.ndarray  # float32 (steps, n): 1 inside a slot, gamma where the slot ended
    dones: np.ndarray  # bool (steps, n): the episode ended here

    @classmethod
    def empty(cls, steps: int, n: int, window: int, features: int) -> Rollout:
        return cls(np.zeros((steps, n, window, features), np.float32), np.zeros((steps, n, 3 * window + 1), np.bool_),
                   np.zeros((steps, n), np.int64), np.zeros((steps, n), np.float32),
                   np.zeros((steps + 1, n), np.float32), np.zeros((steps, n), np.float32),
                   np.ones((steps, n), np.float32), np.zeros((steps, n), np.bool_))


@torch.no_grad()
def policy_log_probs(policy: DL2Policy, states: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """The policy's masked log-probabilities of a batch of states, as the rollout acts on them."""
    policy.net.eval()
    return masked_log_probs(policy.net(policy.inputs(states)), torch.from_numpy(masks)).numpy()


def slot_discount(config: LearnerSettings) -> float:
    """The discount where a slot ends (none with the slot critic, as in the authors' code)."""
    return 0.0 if config.critic == "slot" else config.gamma


Events = list[tuple[float | None, float | None]]  # per decision, time-major: (the reward of a slot that ended, an episode's JCT)


def collect(envs: Sequence[DecisionEnv], evaluate: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
            uniforms: Callable[[int], np.ndarray], steps: int, potential_table: np.ndarray | None, slot_discount: float,
            window: int) -> tuple[Rollout, Events]:
    """`steps` decisions in each of `envs`: `evaluate(states, masks)` gives the log-probabilities and values,
    `uniforms(t)` the random draws (one per environment) that pick step t's actions."""
    n = len(envs)
    out = Rollout.empty(steps, n, window, NUM_FEATURES)
    events: Events = []
    for t in range(steps):
        states = np.stack([e.state for e in envs])
        masks = np.stack([e.mask for e in envs])
        log_probs, values = evaluate(states, masks)
        actions = sample_actions(np.exp(log_probs.astype(np.float64)), uniforms(t))
        out.states[t], out.masks[t], out.actions[t], out.values[t] = states, masks, actions, values
        out.log_probs[t] = log_probs[np.arange(n), actions]
        for k, env in enumerate(envs):
            before = env.potential(potential_table) if potential_table is not None else 0.0
            _, reward, terminated, truncated, info = env.step(int(actions[k]))
            discount = slot_discount if info["slot_end"] else 1.0
            ended = terminated or truncated
            after = env.potential(potential_table) if potential_table is not None and not ended else 0.0
            out.rewards[t, k], out.discounts[t, k], out.dones[t, k] = reward + discount * after - before, discount, ended
            events.append((reward if info["slot_end"] else None, float(np.mean(info["jct"])) if terminated else None))
            if ended:
                env.reset()
    states = np.stack([e.state for e in envs])
    out.values[-1] = evaluate(states, np.stack([e.mask for e in envs]))[1]
    return out, events
