"""Per-decision credit for DL2's action space: a rollout buffer, GAE over decisions, a clipped update.

DL2 makes many decisions per slot, and the paper pays every one of them the slot's reward. Here each
decision is a step of its own: a decision inside a slot earns nothing (or, with potential shaping, the
change in what the slot would pay if it ended now), the decision that ends the slot earns the slot's
reward, and discounting applies between slots only. Generalized advantage estimation then credits each
decision with its own effect. Potential-based shaping (Ng, Harada & Russell, ICML 1999) leaves the
optimal policy unchanged whichever speed model supplies the potential.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dl2.learn.nets import masked_log_probs


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
    def empty(cls, steps: int, n: int, window: int, features: int) -> "Rollout":
        return cls(np.zeros((steps, n, window, features), np.float32), np.zeros((steps, n, 3 * window + 1), np.bool_),
                   np.zeros((steps, n), np.int64), np.zeros((steps, n), np.float32),
                   np.zeros((steps + 1, n), np.float32), np.zeros((steps, n), np.float32),
                   np.ones((steps, n), np.float32), np.zeros((steps, n), np.bool_))


def advantages(rollout: Rollout, lam: float) -> np.ndarray:
    """GAE(lambda) per decision; an ended episode neither bootstraps nor passes credit back."""
    steps = rollout.rewards.shape[0]
    out = np.zeros_like(rollout.rewards)
    running = np.zeros(rollout.rewards.shape[1], np.float32)
    for t in reversed(range(steps)):
        carry = rollout.discounts[t] * ~rollout.dones[t]
        delta = rollout.rewards[t] + carry * rollout.values[t + 1] - rollout.values[t]
        running = delta + carry * lam * running
        out[t] = running
    return out


@dataclass(frozen=True)
class UpdateStats:
    policy_loss: float
    value_loss: float
    entropy: float


def clipped_update(policy_net: nn.Module, value_net: nn.Module | None, optimizer: torch.optim.Optimizer,
                   inputs: torch.Tensor, masks: torch.Tensor, actions: torch.Tensor, old_log_probs: torch.Tensor,
                   advantage: torch.Tensor, returns: torch.Tensor, epochs: int, batch_size: int, clip: float,
                   entropy_weight: float, rng: np.random.Generator, max_grad_norm: float = 0.5) -> UpdateStats:
    """Several epochs of minibatch steps on the clipped surrogate, the value loss and an entropy bonus."""
    advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    params = list(policy_net.parameters()) + (list(value_net.parameters()) if value_net is not None else [])
    policy_net.train()
    if value_net is not None:
        value_net.train()
    total = len(actions)
    sums = np.zeros(3)
    count = 0
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(total))
        for start in range(0, total, batch_size):
            idx = order[start:start + batch_size]
            log_probs = masked_log_probs(policy_net(inputs[idx]), masks[idx])
            chosen = log_probs.gather(1, actions[idx, None]).squeeze(1)
            ratio = torch.exp(chosen - old_log_probs[idx])
            surrogate = torch.min(ratio * advantage[idx], ratio.clamp(1 - clip, 1 + clip) * advantage[idx])
            entropy = -(log_probs.exp() * log_probs.masked_fill(~masks[idx], 0.0)).sum(-1).mean()
            policy_loss = -surrogate.mean()
            value_loss = ((value_net(inputs[idx]).squeeze(-1) - returns[idx]) ** 2).mean() if value_net is not None \
                else torch.zeros(())
            loss = policy_loss + 0.5 * value_loss - entropy_weight * entropy
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            sums += (float(policy_loss.detach()), float(value_loss.detach()), float(entropy.detach()))
            count += 1
    return UpdateStats(*(float(x) for x in sums / max(count, 1)))
