"""An RL practitioner's route: RLlib's PPO, unchanged, trains on dl2's Gymnasium environment with its env
runners spread over the two-node Ray cluster, and its return moves."""

from __future__ import annotations

import numpy as np

from dl2.distributed.executor import Executor
from dl2.distributed.ray_tasks import connect


def test_rllib_ppo_trains_on_the_gymnasium_environment_across_the_cluster(two_nodes):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.connectors.env_to_module import FlattenObservations

    connect(Executor("ray", two_nodes.address, 1.0, 0, 0))
    config = (PPOConfig()
              .environment("dl2.gym_env:dl2/Cluster-v0", env_config={"preset": "testbed", "window": 4, "traces": 4})
              .env_runners(num_env_runners=2, num_cpus_per_env_runner=1, rollout_fragment_length=250,  # one per node
                           env_to_module_connector=lambda env, spaces=None, device=None: FlattenObservations())
              .training(train_batch_size_per_learner=500, minibatch_size=100, num_epochs=4, lr=3e-4)
              .debugging(seed=0))
    algo = config.build_algo()
    try:
        returns = [algo.train()["env_runners"]["episode_return_mean"] for _ in range(10)]
    finally:
        algo.stop()
    assert all(np.isfinite(returns)) and all(r < 0 for r in returns)  # minus the episodes' average JCT
    assert np.mean(returns[-3:]) > returns[0] + 0.03, returns  # fewer illegal (void) actions: jobs finish sooner
