"""DL2's decision environment in the Pollux world (issue 35): masks, rewards, determinism, the same runs as
the world's own `simulate`, teachers reproduced through it, batched stepping, bad settings."""

from __future__ import annotations

import numpy as np
import pytest

from dl2.errors import Dl2Error
from dl2.learn.pollux.decisions import IntervalDecisions
from dl2.learn.pollux.demonstrations import learner_labelled, next_of_round_robin, round_robin, teacher_decisions, teacher_forced
from dl2.learn.pollux.env import VARIANTS, PolluxDecisionEnv
from dl2.learn.pollux.features import JOB_FEATURES, encode, encoded_size
from dl2.learn.pollux.policy import DL2PolluxPolicy
from dl2.learn.pollux.vec import PolluxVecEnv
from dl2.pollux import grid
from dl2.pollux.apps import APP_NAMES, load_applications
from dl2.pollux.cluster import simulate
from dl2.pollux.policies import make_policy
from dl2.pollux.workload import read_workload
from dl2.workload.presets import PolluxPreset
from dl2.worlds import WORLDS

PRESET = PolluxPreset("pollux", 16, 4, 60, 30)
APPS = load_applications()
NCF = APP_NAMES.index("ncf")


def _workload(jobs: int, load: str = "", number: int = 3):
    folder = f"workloads-{load}" if load else "workloads"
    return read_workload(grid.POLLUX_DATA / folder / f"workload-{number}.csv").first(jobs)


def _random_decide(seed: int):
    rng = np.random.default_rng(seed)
    return lambda state, mask: int(rng.choice(np.flatnonzero(mask)))


def _expected_caps(workload, variant: str) -> np.ndarray:
    """From the definition: a batch size over the smallest measured per-GPU batch (the workload's batch,
    or the application's largest under pollux-batch); ncf on one GPU; at most 64."""
    caps = []
    for app, batch in zip(workload.app, workload.batch_size):
        a = APPS[app]
        size = a.max_batch_size if variant == "pollux-batch" else int(batch)
        caps.append(1 if app == NCF else min(size // a.min_local_bsz, 64))
    return np.array(caps)


def _epochs_done(jobs) -> np.ndarray:
    """Each job's epochs (the current one's fraction included) over its epochs, job by job."""
    out = np.empty(len(jobs.app))
    for j in range(len(jobs.app)):
        t = APPS[jobs.app[j]].tables
        e = int(jobs.epoch[j])
        if e >= t.max_epochs:
            out[j] = 1.0
        else:
            lo, hi = t.progress_at[e], t.progress_at[e + 1]
            out[j] = (e + (jobs.progress[j] - lo) / (hi - lo)) / t.max_epochs
    return out


@pytest.mark.parametrize("assign_one", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_masks_follow_the_caps_the_free_gpus_and_the_window(variant, assign_one):
    workload = _workload(10)
    window = 4
    env = PolluxDecisionEnv(workload, PRESET, variant, window, assign_one=assign_one)
    caps = _expected_caps(workload, variant)
    rng = np.random.default_rng(1)
    state, mask = env.reset()
    intervals, before = 0, None
    while not env.done and intervals < 40:
        jobs = env.cluster.jobs
        active = [j for j in range(len(workload)) if jobs.submit[j] <= env.cluster.time and jobs.completion[j] < 0]
        in_window = active[:window]
        given = state[:, JOB_FEATURES.index("GPUs given")].astype(int)
        free = 64 - given.sum()
        assert mask.shape == (window + 1,) and mask[window], "void is always legal"
        for k in range(window):
            if k < len(in_window):
                j = in_window[k]
                assert state[k, 0] == workload.app[j] + 1
                assert state[k, 1] == env.cluster.time - workload.time[j]
                assert state[k, JOB_FEATURES.index("GPUs held")] == len(env.view.allocations.get(j, []))
                assert mask[k] == (given[k] < caps[j] and free > 0)
            else:
                assert not state[k].any() and not mask[k], "an empty slot is all zero and masked"
        if env.decisions is not before:  # an interval's first question: what it gave before asking
            starts = [int(assign_one and caps[j] > 0) for j in in_window] + [0] * (window - len(in_window))
            assert given.tolist() == starts, "one GPU to each window job first (64 GPUs suffice), or none"
        # mostly "+1" to the first legal job, so that jobs reach their caps
        legal = np.flatnonzero(mask[:window])
        action = int(legal[0]) if rng.random() < 0.9 and len(legal) else window
        before = env.decisions
        state, mask, _, _ = env.step(action)
        intervals += env.decisions is not before
    assert intervals == 40, "the loop ran its intervals"


def test_no_free_gpu_ends_the_interval():
    small = PolluxPreset("small", 1, 2, 60, 30)  # one node of two GPUs
    workload = _workload(6)
    caps = _expected_caps(workload, "tuned")
    env = PolluxDecisionEnv(workload, small, "tuned", 3)
    state, mask = env.reset()
    full = 0
    for _ in range(30):
        interval, wanted = env.decisions, min(2, caps[env.view.active[:3]].sum())
        given, applied_at = 0, len(env.cluster.gpus_used)
        while env.decisions is interval and not env.done:  # "+1" to the first legal job until the env stops asking
            assert given < wanted and mask[:3].any()
            state, mask, _, _ = env.step(int(np.flatnonzero(mask[:3])[0]))
            given += 1
        assert given == wanted == env.cluster.gpus_used[applied_at]
        full += given == 2
        if env.done:
            break
    assert full > 0, "some interval filled the cluster"


@pytest.mark.parametrize("variant", VARIANTS)
def test_reward_is_the_progress_the_interval_gained(variant):
    workload = _workload(8)
    env = PolluxDecisionEnv(workload, PRESET, variant, 8)
    decide = _random_decide(5)
    state, mask = env.reset()
    total, done = 0.0, False
    while not done:
        before_interval = env.decisions
        before = _epochs_done(env.cluster.jobs).sum()
        state, mask, reward, done = env.step(decide(state, mask))
        if not done and env.decisions is before_interval:
            assert reward == 0.0
        else:
            assert reward == pytest.approx(_epochs_done(env.cluster.jobs).sum() - before, abs=1e-9)
            assert reward >= -1e-12
        total += reward
    assert total == pytest.approx(len(workload)), "every job's progress goes from 0 to 1"


@pytest.mark.parametrize("assign_one", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_an_episode_is_the_worlds_own_run_of_the_same_decisions(variant, assign_one):
    workload = _workload(12)
    env = PolluxDecisionEnv(workload, PRESET, variant, 6, assign_one=assign_one)
    decide = _random_decide(7)
    state, mask = env.reset()
    done = False
    while not done:
        state, mask, _, done = env.step(decide(state, mask))
    ours = env.result()
    world = simulate(workload, DL2PolluxPolicy(_random_decide(7), variant, 6, assign_one=assign_one), PRESET)
    assert np.array_equal(ours.completion, world.completion) and (ours.completion > workload.time).all()
    assert np.array_equal(ours.restarts, world.restarts)
    assert np.array_equal(ours.gpus_used, world.gpus_used) and np.array_equal(ours.running, world.running)
    if variant == "pollux-batch":
        assert ours.model_seconds > 0, "jobs fitted their throughput models and picked their batch sizes"


def test_same_actions_same_episode_bit_for_bit():
    workload = _workload(6)
    runs = []
    for _ in range(2):
        env = PolluxDecisionEnv(workload, PRESET, "pollux-batch", 5)
        decide = _random_decide(11)
        state, mask = env.reset()
        trace, done = [state.copy()], False
        while not done:
            state, mask, reward, done = env.step(decide(state, mask))
            trace.append(np.append(state.ravel(), reward))
        runs.append((np.concatenate([t.ravel() for t in trace]), env.result().completion))
    assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("teacher, load, number, assign_one", [
    ("optimus", "", 3, False), ("optimus", "2.0", 7, False), ("tiresias", "", 3, False),
    ("optimus", "", 3, True), ("optimus", "2.0", 7, True)])  # Optimus+Oracle's own first step is assign_one's
def test_a_teacher_forced_episode_reproduces_the_teachers_run(teacher, load, number, assign_one):
    workload = _workload(20, load, number)
    states, masks, actions, run = teacher_forced(workload, PRESET, teacher, "tuned", window=20, assign_one=assign_one)
    own = simulate(workload, make_policy(teacher), PRESET)
    assert np.array_equal(run.completion, own.completion) and np.array_equal(run.restarts, own.restarts)
    assert masks[np.arange(len(actions)), actions].all(), "every demonstrated action is legal"
    assert len(states) == len(masks) == len(actions) and states.shape[1:] == (20, len(JOB_FEATURES))


def test_a_window_of_the_clusters_gpus_keeps_the_teachers_run_on_a_shipped_workload():
    workload = read_workload(grid.Cell("optimus", "2.0", 7, 0).path)  # 320 jobs: far more active than any window
    own = simulate(workload, make_policy("optimus"), PRESET)
    forced = teacher_forced(workload, PRESET, "optimus", "tuned", window=64, assign_one=True)[3]
    assert np.array_equal(forced.completion, own.completion) and np.array_equal(forced.restarts, own.restarts)
    narrow = teacher_forced(workload, PRESET, "optimus", "tuned", window=20, assign_one=True)[3]
    assert narrow.jct.mean() > 2 * own.jct.mean(), "a window of 20 keeps later jobs waiting"


def test_the_next_of_the_round_robin_follows_it_from_any_point():
    rng = np.random.default_rng(3)
    for _ in range(50):
        start = rng.integers(0, 2, 6)
        target = start + rng.integers(0, 4, 6)
        given, followed = start.copy(), []
        while (action := next_of_round_robin(given, start, target, 10)) != 10:
            followed.append(action)
            given[action] += 1
        assert followed + [10] == list(round_robin(target - start, 10))


@pytest.mark.parametrize("assign_one", [True, False])
def test_a_learner_that_decides_as_the_teacher_is_labelled_with_the_teachers_decisions(assign_one):
    workload = _workload(20, "2.0", 7)
    states, masks, actions, run = teacher_forced(workload, PRESET, "optimus", "tuned", window=8, assign_one=assign_one)
    replay = iter(actions.tolist())
    seen, labelled, labels, learner = learner_labelled(workload, PRESET, "optimus", "tuned", 8,
                                                       lambda state, mask: next(replay), assign_one)
    assert np.array_equal(labels, actions) and np.array_equal(seen, states) and np.array_equal(labelled, masks)
    assert np.array_equal(learner.completion, run.completion)


def test_a_learner_that_stops_early_is_labelled_where_it_drifts():
    workload = _workload(20, "2.0", 7)
    states, masks, labels, run = learner_labelled(workload, PRESET, "optimus", "tuned", 8, lambda state, mask: 8, True)
    assert masks[np.arange(len(labels)), labels].all(), "every label is legal where it is asked"
    own = simulate(workload, make_policy("optimus"), PRESET)
    assert (labels < 8).any() and run.jct.mean() > own.jct.mean(), "the teacher would give more than one GPU each"


def test_with_assign_one_the_teacher_gives_only_the_gpus_beyond_one_each():
    workload = _workload(20, "2.0", 7)
    plain = teacher_forced(workload, PRESET, "optimus", "tuned", window=20)
    states, masks, actions, run = teacher_forced(workload, PRESET, "optimus", "tuned", window=20, assign_one=True)
    assert np.array_equal(run.completion, plain[3].completion), "the same allocations"
    given = JOB_FEATURES.index("GPUs given")
    assert (states[:, :, given][states[:, :, 0] > 0] >= 1).all(), "every window job holds one before any decision"
    assert masks[np.arange(len(actions)), actions].all()
    assert (actions < 20).sum() < (plain[2] < 20).sum(), "the decisions leave out the GPUs given first"


def test_assign_one_gives_one_gpu_each_in_window_order_while_gpus_last():
    two_gpus = PolluxPreset("small", 1, 2, 60, 30)
    env = PolluxDecisionEnv(_workload(8), two_gpus, "tuned", 4)
    env.reset()
    while len(env.view.active) < 4:
        env.step(4)
    view = env.view
    interval = IntervalDecisions(view, np.array([0, 3, 1, 2, 2, 2, 2, 2]), 4, assign_one=True)
    assert interval.given.tolist() == [0, 1, 1, 0], "cap 0 excepted; two GPUs, so the fourth gets none"
    assert not interval.open and not interval.mask[:4].any(), "no GPU left: nothing to ask"
    assert sorted(len(n) for n in interval.allocations().values()) == [1, 1]
    one_left = IntervalDecisions(view, np.array([0, 0, 3, 2, 2, 2, 2, 2]), 3, assign_one=True)
    assert one_left.given.tolist() == [0, 0, 1] and one_left.mask.tolist() == [False, False, True, True]
    assert one_left.state[:3, JOB_FEATURES.index("GPUs given")].tolist() == [0, 0, 1] and one_left.open


def test_teacher_decisions_concatenate_workloads_and_stop_with_void():
    first, second = _workload(6), _workload(6, "0.5", 5)
    states, masks, actions = teacher_decisions([first, second], PRESET, "optimus", "tuned", 4)
    one = teacher_forced(first, PRESET, "optimus", "tuned", 4)
    assert len(actions) == len(one[2]) + len(teacher_forced(second, PRESET, "optimus", "tuned", 4)[2])
    assert np.array_equal(actions[: len(one[2])], one[2])
    assert (actions == 4).any() and (actions < 4).any()


def test_vec_env_restarts_finished_episodes_on_the_next_workload():
    workloads = [_workload(3), _workload(3, "0.5", 5)]
    envs = [PolluxDecisionEnv(workloads[0], PRESET, "tuned", 3) for _ in range(2)]
    vec = PolluxVecEnv(envs, workloads)
    states, masks = vec.reset()
    assert states.shape == (2, 3, len(JOB_FEATURES)) and masks.shape == (2, 4)
    rng = np.random.default_rng(0)
    assigned, total = [], np.zeros(2)
    while len(vec.finished) < 4:
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
        states, masks, rewards, dones = vec.step(actions)
        total += rewards
        assigned += [vec.envs[k].workload for k in np.flatnonzero(dones)]
        assert masks[:, 3].all() and (states[:, :, 0] > 0).any(axis=1).all(), "every env is at a decision"
    assert all(w is workloads[i % 2] for i, w in enumerate(assigned)), "round robin over the workloads"
    assert len(vec.finished) == len(assigned) and all((run.completion > run.workload.time).all() for _, run in vec.finished)
    assert total.sum() >= sum(len(run.workload) for _, run in vec.finished) - 1e-9, "each finished job's progress was paid"


def test_features_are_the_worlds_learning_shape_and_encode_to_their_size():
    shape = WORLDS["pollux"].learning
    assert shape.job_features == JOB_FEATURES and shape.job_types == APP_NAMES
    env = PolluxDecisionEnv(_workload(5), PRESET, "tuned", 7)
    state, mask = env.reset()
    assert state.shape == (7, len(shape.job_features)) and len(mask) == env.num_actions == shape.num_actions(7)
    encoded = encode(np.stack([state, state]))
    assert encoded.shape == (2, encoded_size(7)) and encoded.dtype == np.float32
    per_job = encoded[0].reshape(7, -1)
    for k in range(7):
        app = int(state[k, 0])
        assert per_job[k, : len(APP_NAMES)].sum() == (app > 0) and (app == 0 or per_job[k, app - 1] == 1)
        assert app > 0 or not per_job[k].any()
    assert np.abs(encoded).max() < 10


@pytest.mark.parametrize("variant, window, key", [("pollux", 4, "variant"), ("tuned", 0, "window"), ("tuned", 2.5, "window")])
def test_bad_settings_raise_naming_the_key(variant, window, key):
    with pytest.raises(Dl2Error, match=f"^{key}: "):
        PolluxDecisionEnv(_workload(3), PRESET, variant, window)
    with pytest.raises(Dl2Error, match=f"^{key}: "):
        DL2PolluxPolicy(_random_decide(0), variant, window)


def test_an_unknown_teacher_raises_naming_the_key():
    with pytest.raises(Dl2Error, match="^teacher: "):
        teacher_decisions([_workload(3)], PRESET, "pollux", "tuned", 3)


def test_the_speed_benchmark_counts_decisions_intervals_and_the_worlds_share():
    from dl2.bench_pollux_env import measure

    row = measure("tuned", "fill", steps=640, num_envs=2)
    assert row["decisions"] == 640 and row["decisions_per_second"] > 0
    assert 1 <= row["decisions_per_interval"] <= 65, "at most a GPU each of 64, then void"
    assert 0 < row["world_share"] < 1


def test_a_returned_state_is_the_callers_own():
    env = PolluxDecisionEnv(_workload(5), PRESET, "tuned", 5)
    state, mask = env.reset()
    kept_state, kept_mask = state.copy(), mask.copy()
    env.step(int(np.flatnonzero(mask[:5])[0]))
    assert np.array_equal(state, kept_state) and np.array_equal(mask, kept_mask)


def test_the_greedy_benchmark_times_both_passes_on_the_same_decisions():
    from dl2.bench_pollux_env import greedy_decisions

    row = greedy_decisions(jobs=12)
    assert row["decisions"] > 50 and 0 <= row["asked_torch"] < row["decisions"]
    assert row["torch_us_per_decision"] > 0 and row["compiled_us_per_decision"] > 0
    assert row["speedup"] == pytest.approx(row["torch_us_per_decision"] / row["compiled_us_per_decision"])
