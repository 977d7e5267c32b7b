"""The DL2 decision environment: legal masks, faithful replays of the heuristics, Gymnasium shape, determinism."""

import functools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_preset

from dl2.backends.sim import SimulatedCluster, simulate
from dl2.learn.agent import masks_from_states
from dl2.learn.env import BackendEnv, DecisionEnv, VecEnv
from dl2.schedulers.builtin import simulate_builtin
from dl2.sim.scenario import Scenario, SimOptions
from dl2.workload.presets import get_preset
from dl2.workload.traces import generate_trace


def _traces(scenario, n, seed=0):
    return [generate_trace(scenario.preset, scenario.catalog, s) for s in np.random.SeedSequence(seed).spawn(n)]


def _random_legal(mask, rng):
    return int(rng.choice(np.flatnonzero(mask)))


def _expected_window(env):
    """The window computed independently: the first `window` active jobs that can still grow."""
    j, m = env.jobs, env.max_tasks
    growable = [i for i in range(len(j.model)) if j.active[i] and not (j.workers[i] >= m and j.ps[i] >= m)]
    return growable[: env.window]


def _check_decision_point(env, state, info):
    jobs, m, window = env.jobs, env.max_tasks, env.window
    mask = info["mask"]
    assert mask.shape == (3 * window + 1,) and mask.dtype == np.bool_
    assert mask[3 * window], "void must always be legal"
    # the mask is the one the learner recomputes from the state alone
    np.testing.assert_array_equal(mask, masks_from_states(state[None], m)[0])
    # the window is what it claims to be
    expected = _expected_window(env)
    np.testing.assert_array_equal(env.window_jobs[: len(expected)], expected)
    assert (env.window_jobs[len(expected):] == -1).all()
    assert (state[len(expected):] == 0).all()
    for pos, i in enumerate(expected):
        assert state[pos, 0] == jobs.model[i] + 1
        assert state[pos, 1] == env.slot - jobs.arrival[i]
        assert state[pos, 2] == np.float32(1.0 - jobs.progress[i] / jobs.epochs[i])
        assert state[pos, 4] == jobs.workers[i] and state[pos, 5] == jobs.ps[i]
    # every allowed non-void action is feasible by the max_tasks rule, and every feasible one is allowed
    for action in range(3 * window):
        pos, role = divmod(action, 3)
        i = env.window_jobs[pos]
        if i < 0:
            ok = False
        else:
            worker_ok, ps_ok = jobs.workers[i] < m, jobs.ps[i] < m
            ok = (worker_ok, ps_ok, worker_ok and ps_ok)[role]
        assert mask[action] == ok, (action, i)
    assert mask[:-1].any(), "the environment only asks when there is a decision to make"


def _check_resources(env):
    jobs, cl, m = env.jobs, env.cluster, env.max_tasks
    assert (jobs.workers <= m).all() and (jobs.ps <= m).all()
    assert (jobs.workers >= 0).all() and (jobs.ps >= 0).all()
    assert (cl.used >= 0).all()
    assert (cl.used <= cl.capacity).all(), "a node is over capacity"
    placed = (jobs.workers[:, None] * jobs.worker_demand + jobs.ps[:, None] * jobs.ps_demand).sum(axis=0)
    np.testing.assert_array_equal(cl.used.sum(axis=0), placed)


SMALL = [tiny_preset(2, 2, 6), tiny_preset(3, 3, 10), tiny_preset(1, 4, 8)]


@pytest.mark.parametrize("assign_bundle", [False, True])
@pytest.mark.parametrize("preset", SMALL, ids=["2n2t6j", "3n3t10j", "1n4t8j"])
@pytest.mark.parametrize("window", [3, 20])
def test_masks_never_allow_an_infeasible_action(preset, assign_bundle, window):
    scenario = Scenario(preset, SimOptions(assign_bundle=assign_bundle, max_slots=5000))
    traces = _traces(scenario, 3, seed=7)
    env = DecisionEnv(traces, scenario, window=window, seed=1, shuffle=False)
    rng = np.random.default_rng(5)
    for _ in traces:
        state, info = env.reset()
        _check_decision_point(env, state, info)
        _check_resources(env)
        for _ in range(100_000):
            action = _random_legal(info["mask"], rng)
            if rng.random() < 0.1 and not info["mask"].all():
                # an illegal action (a buggy agent) must not break the rules either
                action = int(rng.choice(np.flatnonzero(~info["mask"])))
            state, reward, terminated, truncated, info = env.step(action)
            _check_resources(env)
            assert reward >= 0
            if terminated or truncated:
                break
            _check_decision_point(env, state, info)
        assert terminated and not truncated
        assert np.isfinite(info["jct"]).all()


def test_masks_on_the_paper_preset_with_random_actions():
    scenario = Scenario(get_preset("paper"), SimOptions(assign_bundle=True))
    env = DecisionEnv(_traces(scenario, 1, seed=3), scenario, window=20, seed=0)
    rng = np.random.default_rng(0)
    state, info = env.reset()
    terminated = truncated = False
    while not (terminated or truncated):
        _check_decision_point(env, state, info)
        state, _, terminated, truncated, info = env.step(_random_legal(info["mask"], rng))
        _check_resources(env)
    assert terminated


def _replay(trace, teacher, scenario, window):
    """Feed the teacher's recorded decisions to a DecisionEnv; returns (env JCTs, teacher JCTs)."""
    sim = simulate_builtin(trace, teacher, scenario, record_window=window)
    d = sim.decisions
    assert d.outside_window == 0
    env = DecisionEnv([trace], scenario, window=window)
    state, info = env.reset(trace=trace)
    void = 3 * window
    done, fed = False, 0
    for k in range(len(d.actions)):
        if done or d.slots[k] < env.slot:
            # the heuristics also record the void that ends a slot in which nothing was left to decide
            # (no job, or every job at the maximum); the environment does not ask then
            assert d.actions[k] == void, (k, d.slots[k], env.slot)
            assert not masks_from_states(d.states[k][None], scenario.preset.max_tasks)[0, :-1].any()
            continue
        assert d.slots[k] == env.slot, (k, d.slots[k], env.slot)
        np.testing.assert_array_equal(state, d.states[k])
        assert info["mask"][d.actions[k]]
        state, _, terminated, truncated, info = env.step(int(d.actions[k]))
        fed += 1
        assert not truncated
        done = terminated
    assert done, "the recorded decisions did not finish the trace in the environment"
    assert fed > 0
    return info["jct"], sim.jct


@pytest.mark.parametrize("teacher", ["drf", "fifo"])
@pytest.mark.parametrize("preset", [tiny_preset(2, 2, 6), tiny_preset(3, 3, 12), get_preset("paper")],
                         ids=["tiny", "small", "paper"])
def test_replaying_a_teachers_decisions_reproduces_its_jcts(teacher, preset):
    scenario = Scenario(preset, SimOptions(assign_bundle=False))
    for trace in _traces(scenario, 2, seed=21):
        window = len(trace)  # every job fits in the window: nothing is outside it
        env_jct, sim_jct = _replay(trace, teacher, scenario, window)
        np.testing.assert_array_equal(env_jct, sim_jct)


class _DoNothing:
    name = "nothing"

    def schedule(self, obs):
        return obs.allocation()


@pytest.mark.parametrize("preset", [tiny_preset(2, 2, 6), tiny_preset(1, 3, 10), get_preset("paper")],
                         ids=["tiny", "crowded", "paper"])
def test_void_only_with_assign_bundle_equals_the_pre_assigned_bundles(preset):
    scenario = Scenario(preset, SimOptions(assign_bundle=True))
    for trace in _traces(scenario, 2, seed=4):
        env = DecisionEnv([trace], scenario, window=20)
        env.reset(trace=trace)
        void = env.num_actions - 1
        terminated = truncated = False
        while not (terminated or truncated):
            _, _, terminated, truncated, info = env.step(void)
        assert terminated
        expected = simulate(trace, _DoNothing(), scenario)
        np.testing.assert_array_equal(info["jct"], expected.jct)
        # and doing nothing more is worse than DRF on top of the same bundles
        assert info["jct"].mean() >= simulate(trace, "drf", scenario).jct.mean()


def test_gymnasium_style_reset_and_step():
    scenario = Scenario(tiny_preset(2, 2, 6))
    trace = _traces(scenario, 1)[0]
    env = DecisionEnv([trace], scenario, window=5)
    out = env.reset()
    assert isinstance(out, tuple) and len(out) == 2
    state, info = out
    assert state.shape == (5, 6) and state.dtype == np.float32
    assert set(info) >= {"mask"} and info["mask"].shape == (env.num_actions,) == (16,)
    rng = np.random.default_rng(0)
    rewards, slot_ends = [], 0
    while True:
        out = env.step(_random_legal(info["mask"], rng))
        assert isinstance(out, tuple) and len(out) == 5
        state, reward, terminated, truncated, info = out
        assert isinstance(reward, float) and isinstance(terminated, bool) and isinstance(truncated, bool)
        assert state.shape == (5, 6) and "mask" in info and "slot_end" in info
        rewards.append(reward)
        slot_ends += info["slot_end"]
        if not info["slot_end"]:
            assert reward == 0.0 and "jct" not in info
        if terminated or truncated:
            break
        assert "jct" not in info
    assert terminated and not truncated and info["slot_end"]
    jct = info["jct"]
    assert jct.shape == (len(trace),) and np.isfinite(jct).all() and (jct > 0).all()
    # every job is trained to completion: slot rewards (fractions of each job trained) add up to the job count
    assert sum(rewards) == pytest.approx(len(trace), rel=1e-9)
    assert slot_ends >= 1


def test_an_episode_that_cannot_finish_is_truncated_at_max_slots():
    scenario = Scenario(tiny_preset(2, 2, 6), SimOptions(assign_bundle=False, max_slots=40))
    env = DecisionEnv(_traces(scenario, 1), scenario, window=5)
    _, info = env.reset()
    for _ in range(10_000):  # void only: nothing ever trains
        _, _, terminated, truncated, info = env.step(env.num_actions - 1)
        if terminated or truncated:
            break
    assert truncated and not terminated
    assert env.slot == 40


def _env_rollout(traces, scenario, env_seed, policy_seed, episodes=4):
    env = DecisionEnv(traces, scenario, window=6, seed=env_seed)
    rng = np.random.default_rng(policy_seed)
    log = []
    for _ in range(episodes):
        state, info = env.reset()
        log.append(("reset", state.copy(), info["mask"].copy()))
        while True:
            action = _random_legal(info["mask"], rng)
            state, reward, terminated, truncated, info = env.step(action)
            log.append((action, reward, state.copy(), info["mask"].copy()))
            if terminated or truncated:
                log.append(("end", info.get("jct")))
                break
    return log


def _logs_equal(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if len(x) != len(y):
            return False
        for u, v in zip(x, y):
            if isinstance(u, np.ndarray) or isinstance(v, np.ndarray):
                if not np.array_equal(u, v, equal_nan=True):
                    return False
            elif u != v and not (isinstance(u, float) and math.isnan(u) and math.isnan(v)):
                return False
    return True


def test_same_seed_same_rollout():
    scenario = Scenario(tiny_preset(3, 3, 8), SimOptions(assign_bundle=True))
    traces = _traces(scenario, 5, seed=2)
    first = _env_rollout(traces, scenario, env_seed=3, policy_seed=9)
    second = _env_rollout(traces, scenario, env_seed=3, policy_seed=9)
    assert _logs_equal(first, second)
    # the seeds matter: the trace order (env seed) and the actions (policy seed) change the rollout
    assert not _logs_equal(first, _env_rollout(traces, scenario, env_seed=4, policy_seed=9))
    assert not _logs_equal(first, _env_rollout(traces, scenario, env_seed=3, policy_seed=10))


def _vec_rollout(traces, scenario, seeds, policy_seed, rounds=600):
    vec = VecEnv([DecisionEnv(traces, scenario, window=6, seed=s) for s in seeds])
    states, masks = vec.reset()
    rng = np.random.default_rng(policy_seed)
    log = []
    for _ in range(rounds):
        actions = np.array([_random_legal(m, rng) for m in masks])
        rewards, ended, states, masks = vec.step(actions)
        log.append((actions, rewards, ended, states.copy(), masks.copy()))
    return log, list(vec.finished)


def test_same_seeds_same_vecenv_rollout():
    scenario = Scenario(tiny_preset(2, 2, 6), SimOptions(assign_bundle=False))
    traces = _traces(scenario, 4, seed=8)
    log_a, finished_a = _vec_rollout(traces, scenario, [1, 2, 3], policy_seed=0)
    log_b, finished_b = _vec_rollout(traces, scenario, [1, 2, 3], policy_seed=0)
    assert finished_a, "no episode finished: the rollout is too short to compare episodes"
    assert finished_a == finished_b
    assert _logs_equal(log_a, log_b)
    log_c, finished_c = _vec_rollout(traces, scenario, [1, 2, 4], policy_seed=0)
    assert not _logs_equal(log_a, log_c)


def test_the_jobs_shares_of_a_slots_reward_add_up_to_it_and_follow_their_progress():
    scenario = Scenario(get_preset("paper"), SimOptions(assign_bundle=True))
    env = DecisionEnv(_traces(scenario, 1, seed=5), scenario, window=10, seed=0)
    _, info = env.reset()
    rng = np.random.default_rng(0)
    slots = 0
    while slots < 30:
        progress = env.jobs.progress.copy()
        _, reward, terminated, truncated, info = env.step(_random_legal(info["mask"], rng))
        if not info["slot_end"]:
            continue
        slots += 1
        assert env.job_reward.sum() == pytest.approx(reward)
        if env.slot == slots:  # no slot ran by itself after this one: the shares are what each job trained
            trained = (env.jobs.progress - progress) / env.jobs.epochs
            np.testing.assert_allclose(env.job_reward, trained, atol=1e-12)
        assert not (terminated or truncated)


def _over_the_simulator(traces, scenario, window, seed=0):
    """`BackendEnv` on the simulator backend: what `DecisionEnv` computes compiled, slot by slot in Python."""
    return BackendEnv(traces, scenario, window, seed, open_backend=functools.partial(SimulatedCluster, scenario=scenario))


@pytest.mark.parametrize("preset, assign_bundle", [("paper", True), ("paper", False), ("dev", True)])
def test_the_compiled_environment_is_the_backend_environment_on_the_simulator(preset, assign_bundle):
    scenario = Scenario(get_preset(preset), SimOptions(assign_bundle=assign_bundle, max_slots=2000))
    trace = _traces(scenario, 1, seed=21)[0]
    fast, generic = DecisionEnv([trace], scenario, window=12), _over_the_simulator([trace], scenario, 12)
    (fs, fi), (gs, gi) = fast.reset(), generic.reset()
    rng = np.random.default_rng(5)
    for _ in range(100_000):
        np.testing.assert_array_equal(fs, gs)
        np.testing.assert_array_equal(fi["mask"], gi["mask"])
        assert fi["slot"] == gi["slot"] and fast.potential(scenario.table) == generic.potential(scenario.table)
        action = _random_legal(fi["mask"], rng) if rng.random() < 0.9 else 3 * fast.window  # now and then void
        fs, fr, ft, ftr, fi = fast.step(action)
        gs, gr, gt, gtr, gi = generic.step(action)
        assert (ft, ftr, fi["slot_end"], fr) == (gt, gtr, gi["slot_end"], gr)
        if ft:
            np.testing.assert_array_equal(fi["jct"], gi["jct"])
            break
    else:
        pytest.fail("the trace did not finish")


def test_a_learner_trains_alike_on_either_environment():
    """PPO with potential shaping, a few updates: every decision, reward and update the same on the compiled
    environment and on the backend environment over the simulator."""
    from conftest import PPO, rl_config

    from dl2.learn.agent import DL2Policy
    from dl2.learn.architecture import net_config
    from dl2.learn.learners import make_trainer

    scenario = Scenario(tiny_preset(3, 3, 10), SimOptions(assign_bundle=True, max_slots=2000))
    train, validation = _traces(scenario, 3, seed=4), _traces(scenario, 1, seed=5)
    config = rl_config(**PPO, shaping="env", updates=3, num_envs=2, rollout_length=24, batch_size=16, validate_every=3)
    histories = []
    for make_env in (DecisionEnv, _over_the_simulator):
        torch.manual_seed(0)
        policy = DL2Policy(net_config("per-job", hidden=(16, 16), window=6), 3, assign_bundle=True)
        trainer = make_trainer(policy, train, validation, scenario, config, 0, make_env=make_env)
        histories.append(trainer.train().drop(columns="seconds"))
        assert all(isinstance(env, make_env if make_env is DecisionEnv else BackendEnv) for env in trainer.envs)
    pd.testing.assert_frame_equal(*histories, check_exact=True)
