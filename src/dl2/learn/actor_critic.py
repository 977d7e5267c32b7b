"""The paper's learner (DESIGN §5): actor-critic with the slot's reward, experience replay and job-aware
exploration (`algorithm: actor-critic`).

Several environments step in lockstep, one decision each per round, batched through the policy; the
exploration rule may replace each sampled action. Every decision of a slot gets that slot's reward (or,
with `reward: job`, its job's share of it); the critic target is the slot reward (the authors' code) or
the discounted TD target r + gamma * V(next slot's first state) (the paper); without a critic a
moving-average baseline stands in. After every `num_envs` completed slots, one update: a batch from the
replay, advantage = target - V(s) (scaled by importance weights when prioritized), policy gradient (with
`learn_rule_actions: false`, over the actions the policy chose itself only; the rules' are off-policy) with
an entropy bonus averaged over the `3W+1` actions (the authors' code: beta = 0.1 weighs it as theirs
does), value regression.
"""

from __future__ import annotations

import numpy as np
import torch

from dl2.errors import Dl2Error
from dl2.learn.env import DecisionEnv
from dl2.learn.exploration import Explorer
from dl2.learn.nets import masked_log_probs
from dl2.learn.replay import Replay, importance_beta
from dl2.learn.settings import ActorCriticSettings
from dl2.learn.trainer import Trainer
from dl2.sim.state import NUM_FEATURES


class ActorCriticTrainer(Trainer):
    config: ActorCriticSettings

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        c, window = self.config, self.policy.config.window
        self.policy_opt = torch.optim.Adam(self.policy.net.parameters(), lr=c.lr)
        self.value_opt = torch.optim.Adam(self.value.parameters(), lr=c.lr)
        self.optimizers = [self.policy_opt, self.value_opt]
        self.replay = Replay(c.replay, c.replay_size, window, NUM_FEATURES, 3 * window + 1)
        self.explorer = Explorer(c.exploration, c.epsilon)
        self.pending: list[list[tuple[np.ndarray, np.ndarray, int, int, bool]]] = [[] for _ in self.envs]
        self.ratios = self.rng.integers(3, 8, len(self.envs))  # the code rules' PS/worker ratio, redrawn each slot
        if c.reward == "job" and not all(hasattr(env, "job_reward") for env in self.envs):
            raise Dl2Error("finetune.reward: job needs the simulator's environments (backend: sim)")

    def step(self) -> bool:
        """One round of decisions; an update once enough slots completed and the replay holds `learn_start`."""
        if not self._round():
            return False
        self._update()
        return True

    def _round(self) -> bool:
        """One decision in every environment; True when enough slots completed for an update."""
        states = np.stack([e.state for e in self.envs])
        masks = np.stack([e.mask for e in self.envs])
        probs = self._probs(states, masks)
        actions = self._sample(probs)
        ready = False
        for k, env in enumerate(self.envs):
            sampled = int(actions[k])
            action = self.explorer.choose(sampled, states[k], masks[k], probs[k], self.updates, self.rng, int(self.ratios[k]))
            job = int(env.window_jobs[action // 3]) if action < len(masks[k]) - 1 else -1
            self.pending[k].append((states[k].copy(), masks[k].copy(), action, job, action != sampled))
            _, reward, terminated, truncated, info = env.step(action)
            self.decisions += 1
            if not info["slot_end"]:
                continue
            for state, mask, act, job, by_rule in self.pending[k]:
                paid = reward if self.config.reward == "slot" else _job_reward(env, job)
                self.replay.add(state, mask, act, paid, env.state, env.mask, terminated or truncated, by_rule)
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
        idx, weights = self.replay.sample(c.batch_size, self.rng, importance_beta(self.updates))
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
        if not c.learn_rule_actions:  # the rules' actions teach the critic only; the policy, its own actions
            weighted = weighted * torch.from_numpy(~r.by_rule[idx]).float()
        # as in the authors' code, the entropy term averages over the actions as well as the samples
        loss = -(weighted * chosen).mean() - c.entropy * entropy.mean() / masks.shape[-1]
        self.policy_opt.zero_grad()
        loss.backward()
        self.policy_opt.step()
        self.updates += 1
        self.last_update = {"policy_loss": float(loss.detach()), "entropy": float(entropy.mean().detach()),
                            "mean_reward": float(r.rewards[idx].mean())}


def _job_reward(env: DecisionEnv, job: int) -> float:
    """A decision's per-action reward: its job's share of the slot just ended; void's, the mean share."""
    if job >= 0:
        return float(env.job_reward[job])
    trained = env.job_reward[env.job_reward > 0]
    return float(trained.mean()) if len(trained) else 0.0
