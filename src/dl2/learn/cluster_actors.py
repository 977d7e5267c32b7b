"""PPO's parallel training clusters on Ray actors (`executor.cluster_actors`), so that their number can
exceed one machine's cores.

Each actor holds a contiguous group of the trainer's environments and a frozen copy of the policy. Every
rollout, the learner broadcasts its current policy weights (one object in Ray's store) and the random
draws that pick each decision's action; each actor plays `rollout_length` decisions in its environments
and sends back its part of the rollout, which the learner joins in environment order and scores with its
value network, one time step at a time over every environment, as the in-process trainer does.

The algorithm is the in-process trainer's, synchronous, with the same draws, but not bit for bit: a
network scores a batch through matrix products whose rounding depends on the batch's size, and each actor
scores its own group's states, so log-probabilities differ from the in-process trainer's in the last bits
(about 1e-8). A run on actors therefore takes the in-process run's decisions (a draw would have to fall
within 1e-8 of a boundary to change one) and ends with weights equal to rounding. On the same number of
actors a run is the same bit for bit, resumed from its checkpoint or not. An actor lost with its node
raises `ClustersLost`; `workflow.finetune_run` then resumes the run from its checkpoint on new actors,
so it ends with the numbers it would have had.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch

from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy
from dl2.learn.env import DecisionEnv
from dl2.learn.ppo_rollout import Events, Rollout, collect, policy_log_probs, slot_discount
from dl2.learn.settings import PPOSettings


class ClustersLost(Dl2Error):
    """An actor holding training clusters died (its node, or its process)."""


class ClusterGroup:
    """Some of a run's training clusters, stepped by a frozen copy of the policy (the body of a Ray actor)."""

    def __init__(self, envs: list[DecisionEnv], policy: DL2Policy, potential_table: np.ndarray | None, config: PPOSettings):
        torch.set_num_threads(1)  # as `Trainer.train`
        self.envs = copy.deepcopy(envs)  # Ray hands arrays over read-only, from its object store; these step in place
        self.policy, self.potential_table, self.config = policy, potential_table, config

    def collect(self, weights: dict, uniforms: np.ndarray) -> tuple[Rollout, Events, np.ndarray]:
        """`rollout_length` decisions in each environment under the policy `weights`; the rollout (its
        values left for the learner), its events, and the states it ends in (which the values bootstrap)."""
        self.policy.net.load_state_dict(weights)
        c = self.config
        rollout, events = collect(self.envs, self._evaluate, lambda t: uniforms[t], c.rollout_length, self.potential_table,
                                  slot_discount(c), self.policy.config.window)
        return rollout, events, np.stack([e.state for e in self.envs])

    def environments(self) -> list[DecisionEnv]:
        return self.envs

    def _evaluate(self, states: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The policy's masked log-probabilities, no values (the learner scores those)."""
        return policy_log_probs(self.policy, states, masks), np.zeros(len(states), np.float32)


class RemoteClusters:
    """A trainer's environments split over `executor.cluster_actors` Ray actors (at most one per environment)."""

    def __init__(self, envs: list[DecisionEnv], executor, policy: DL2Policy, potential_table: np.ndarray | None,
                 config: PPOSettings):
        import ray

        from dl2.distributed.ray_tasks import connect, driver_threads

        connect(executor)
        count = min(executor.cluster_actors, len(envs))
        bounds = np.linspace(0, len(envs), count + 1).round().astype(int)
        self.groups = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        actor = ray.remote(num_cpus=executor.cpus_per_job, max_restarts=0, runtime_env=driver_threads(),
                           scheduling_strategy="SPREAD")(ClusterGroup)  # over as many nodes as there are
        self.actors = [actor.remote(envs[g], policy, potential_table, config) for g in self.groups]

    def collect(self, policy: DL2Policy, values: Callable[[np.ndarray], np.ndarray],
                uniforms: np.ndarray) -> tuple[Rollout, Events]:
        """One rollout over every actor, joined in environment order (events time-major, as `collect`'s),
        its values scored here by `values(states)`, step by step."""
        import ray

        weights = ray.put(policy.net.state_dict())
        parts = self._get([a.collect.remote(weights, uniforms[:, g]) for a, g in zip(self.actors, self.groups)])
        rollouts = [rollout for rollout, _, _ in parts]
        joined = Rollout(*(np.concatenate([getattr(r, f) for r in rollouts], axis=1) for f in Rollout.__dataclass_fields__))
        steps = joined.actions.shape[0]
        for t in range(steps):
            joined.values[t] = values(joined.states[t])
        joined.values[steps] = values(np.concatenate([last for _, _, last in parts]))
        sizes = [g.stop - g.start for g in self.groups]
        events = [parts[i][1][t * size + k] for t in range(steps) for i, size in enumerate(sizes) for k in range(size)]
        return joined, events

    def environments(self) -> list[DecisionEnv]:
        """The environments as they stand, fetched from the actors."""
        return [env for group in self._get([a.environments.remote() for a in self.actors]) for env in group]

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)

    @staticmethod
    def _get(refs: list) -> list:
        import ray

        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            raise ClustersLost(f"a Ray actor holding training clusters died ({type(exc).__name__})") from None
