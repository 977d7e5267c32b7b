"""dl2's own learner (`algorithm: ppo`): per-decision credit for DL2's action space, learned on-policy.

DL2 makes many decisions per slot, and the paper pays every one of them the slot's reward. Here each
decision is a step of its own: a decision inside a slot earns nothing (or, with potential shaping, the
change in what the slot would pay if it ended now), the decision that ends the slot earns the slot's
reward, and discounting applies between slots only (`critic: slot`: none, as in the authors' code).
Generalized advantage estimation then credits each decision with its own effect, and a clipped surrogate
learns from each rollout (`rollout_length` decisions in every environment, then `ppo_epochs` passes).
Potential-based shaping (Ng, Harada & Russell, ICML 1999) leaves the optimal policy unchanged whichever
speed model supplies the potential.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from dl2.learn.nets import masked_log_probs
from dl2.learn.ppo_rollout import Rollout, collect, policy_log_probs, slot_discount
from dl2.learn.settings import PPOSettings
from dl2.learn.trainer import Trainer
from dl2.sim.scenario import Scenario


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


class PPOTrainer(Trainer):
    config: PPOSettings

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        c = self.config
        self.joint_opt = torch.optim.Adam([*self.policy.net.parameters(), *self.value.parameters()], lr=c.lr)
        self.optimizers = [self.joint_opt]
        self.potential_table = _potential_table(c.shaping, self.scenario)
        self.slot_rewards: deque[float] = deque(maxlen=200)  # the latest slots' (unshaped) rewards
        # Before the learners were split, one trainer drew the actor-critic's exploration ratios for every
        # run; PPO draws them too, so that a seed's random stream, and so its published results, stay the same.
        self.rng.integers(3, 8, len(self.envs))
        self.cluster_actors = None  # RemoteClusters, when the environments live on Ray actors

    def step(self) -> bool:
        """One rollout, one update."""
        self._update(self._collect())
        return True

    def _collect(self) -> Rollout:
        """`rollout_length` decisions in every environment under the current policy: here, or on the Ray
        actors that hold the environments (`use_cluster_actors`), with the same random draws."""
        c = self.config
        if self.cluster_actors is not None:
            uniforms = self.rng.random((c.rollout_length, len(self.envs), 1))  # as `_sample` draws them, step by step
            out, events = self.cluster_actors.collect(self.policy, self._values, uniforms)
        else:
            out, events = collect(self.envs, self._evaluate, lambda t: self._sample_uniforms(len(self.envs)),
                                  c.rollout_length, self.potential_table, slot_discount(c), self.policy.config.window)
        self.decisions += out.actions.size
        for slot_reward, jct in events:
            if slot_reward is not None:
                self.slots_done += 1
                self.slot_rewards.append(slot_reward)
            if jct is not None:
                self.episode_jcts.append(jct)
        return out

    def use_cluster_actors(self, executor) -> None:
        """Hold the training clusters on `executor.cluster_actors` Ray actors from now on."""
        from dl2.learn.cluster_actors import RemoteClusters

        self.cluster_actors = RemoteClusters(self.envs, executor, self.policy, self.potential_table, self.config)

    def __getstate__(self) -> dict:
        """A checkpoint holds the environments themselves, fetched back from their actors."""
        state = dict(self.__dict__)
        if self.cluster_actors is not None:
            state["envs"] = self.cluster_actors.environments()
        state["cluster_actors"] = None
        return state

    def close(self) -> None:
        if self.cluster_actors is not None:
            from dl2.learn.cluster_actors import ClustersLost

            try:
                self.envs = self.cluster_actors.environments()
            except ClustersLost:  # the environments are gone with an actor: the checkpoint holds the last ones
                pass
            self.cluster_actors.close()
            self.cluster_actors = None
        super().close()

    def _update(self, rollout: Rollout) -> None:
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
        self.last_update = {"policy_loss": stats.policy_loss, "value_loss": stats.value_loss, "entropy": stats.entropy,
                            "mean_reward": float(np.mean(self.slot_rewards)) if self.slot_rewards else float("nan")}

    def _evaluate(self, states: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Masked log-probabilities and value estimates (the moving baseline without a critic)."""
        return policy_log_probs(self.policy, states, masks), self._values(states)

    @torch.no_grad()
    def _values(self, states: np.ndarray) -> np.ndarray:
        """Value estimates of a batch of states (the moving baseline without a critic)."""
        if self.config.critic == "off":
            return np.full(len(states), self.baseline, np.float32)
        self.value.eval()
        return self.value(self.policy.inputs(states)).squeeze(-1).numpy()


def _potential_table(shaping: str, scenario: Scenario) -> np.ndarray | None:
    """Epochs per slot of the speed model that shapes rewards, or None without shaping."""
    if shaping == "off":
        return None
    if shaping == "env":
        return scenario.table
    return Scenario(scenario.preset, replace(scenario.options, speed_model="analytical")).table
