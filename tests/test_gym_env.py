"""dl2's clusters as a Gymnasium environment: registered, declared, checked by Gymnasium's own checker,
masked where masking agents look, and paying minus the average JCT over an episode."""

from __future__ import annotations

import copy
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import dl2.gym_env  # noqa: F401  (registers dl2/Cluster-v0)
from dl2.errors import Dl2Error
from dl2.gym_env import ENV_ID, ClusterEnv


def _random_episode(env: gymnasium.Env, seed: int) -> tuple[list[float], dict, list[np.ndarray]]:
    """An episode of uniformly random legal actions: its rewards, last info and observations."""
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    rewards, observations = [], [obs]
    while True:
        obs, reward, terminated, truncated, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
        rewards.append(reward)
        observations.append(obs)
        if terminated or truncated:
            return rewards, info, observations


def test_the_environment_passes_gymnasiums_checker_without_a_warning():
    env = gymnasium.make(ENV_ID, preset="testbed", traces=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=True)
    assert isinstance(env.action_space, gymnasium.spaces.Discrete) and env.action_space.n == 3 * 20 + 1
    assert env.observation_space.shape == (20, 6)


def test_the_module_path_form_registers_by_itself():
    env = gymnasium.make("dl2.gym_env:dl2/Cluster-v0", preset="testbed", window=4, traces=1)
    assert env.action_space.n == 13


def test_an_episodes_return_is_minus_its_average_jct_and_every_observation_is_in_the_space():
    env = gymnasium.make(ENV_ID, preset="paper", traces=3)
    rewards, info, observations = _random_episode(env, seed=1)
    assert sum(rewards) == pytest.approx(-info["jct"], rel=1e-9)
    assert all(r <= 0 for r in rewards) and min(rewards) < 0
    assert all(env.observation_space.contains(obs) for obs in observations)


def test_the_mask_is_in_the_info_and_behind_action_masks_and_an_illegal_action_is_void():
    env = ClusterEnv(preset="paper", window=10, traces=2)
    obs, info = env.reset(seed=0)
    assert np.array_equal(info["action_mask"].astype(bool), env.action_masks()) and env.action_masks()[-1]
    illegal = int(np.flatnonzero(~env.action_masks())[0])
    twin = copy.deepcopy(env)
    after_illegal = env.step(illegal)
    after_void = twin.step(30)
    assert np.array_equal(after_illegal[0], after_void[0]) and after_illegal[1:4] == after_void[1:4]
    assert after_void[4]["slot_end"] and after_illegal[4]["slot"] == after_void[4]["slot"] == info["slot"] + 1


def test_same_seed_same_episode_and_dl2_reward_pays_slots():
    one = _random_episode(gymnasium.make(ENV_ID, preset="testbed", traces=4), seed=3)
    two = _random_episode(gymnasium.make(ENV_ID, preset="testbed", traces=4), seed=3)
    assert one[0] == two[0] and all(np.array_equal(a, b) for a, b in zip(one[2], two[2]))
    rewards, info, _ = _random_episode(gymnasium.make(ENV_ID, preset="testbed", traces=4, reward="dl2"), seed=3)
    assert all(r >= 0 for r in rewards) and sum(r > 0 for r in rewards) <= info["slot"]  # paid when a slot ends


@pytest.mark.parametrize("kwargs, key", [({"preset": "nope"}, "unknown preset 'nope'"), ({"reward": "speed"}, "reward:"),
                                         ({"window": 0}, "window")])
def test_bad_arguments_name_what_to_fix(kwargs, key):
    with pytest.raises(Dl2Error, match=key):
        gymnasium.make(ENV_ID, **kwargs)
