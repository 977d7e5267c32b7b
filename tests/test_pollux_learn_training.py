"""DL2's learning in the Pollux world (issue 35): networks that take the world's shape, SL pretraining on a
teacher's decisions, PPO fine-tuning on the vectorised environment, checkpoints."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from dl2.errors import Dl2Error
from dl2.learn.architecture import NET_PRESETS, NetConfig, net_config
from dl2.learn.features import feature_size
from dl2.learn.nets import masked_log_probs, policy_net, value_net
from dl2.learn.pollux import runs
from dl2.learn.pollux.checkpoint import load_checkpoint, save_checkpoint
from dl2.learn.pollux.demonstrations import teacher_decisions
from dl2.learn.pollux.env import PolluxDecisionEnv
from dl2.learn.pollux.evaluate import PUBLISHED_SUMMARY, evaluate_greedy, published_baselines
from dl2.learn.pollux.features import NUM_JOB_FEATURES, encoded_size
from dl2.learn.pollux.finetune import finetune, interval_ended
from dl2.learn.pollux.model import PolluxNets, filled_slots, pollux_net_config, prefix_log_probs
from dl2.learn.pollux.pretrain import SLOT_BUCKET, Demonstrations, dagger, minibatches, pretrain
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.learn.pollux.train import finished_run, train_dl2_pollux
from dl2.pollux.grid import Cell
from dl2.pollux.workload import read_workload
from dl2.workload.presets import PolluxPreset
from dl2.worlds import WORLDS


class _Reference(nn.Module):
    """The PS/worker networks as they were built before the world's shape was a setting: the layers, in
    the order they were created, written out here from the PS/worker features' size."""

    def __init__(self, config: NetConfig, outputs: int):
        super().__init__()
        per_job = feature_size(1, config.one_hot)
        if config.per_job:
            sizes = [per_job, *config.hidden]
            self.layers = nn.ModuleList(nn.Linear(sizes[0] if k == 0 else 2 * sizes[k], sizes[k + 1])
                                        for k in range(len(config.hidden)))
            self.job_head = nn.Linear(sizes[-1], 3)
            self.pool_head = nn.Linear(sizes[-1], 1)
            return
        layers: list[nn.Module] = []
        width = config.window * per_job
        for size in config.hidden:
            layers.append(nn.Linear(width, size))
            if config.batch_norm:
                layers.append(nn.BatchNorm1d(size))
            layers.append(nn.ReLU())
            width = size
        layers.append(nn.Linear(width, outputs))
        self.body = nn.Sequential(*layers)


@pytest.mark.parametrize("preset", sorted(NET_PRESETS))
@pytest.mark.parametrize("window", [20, 7])
def test_ps_worker_networks_keep_their_weights_bit_for_bit(preset, window):
    config = net_config(preset, window=window)
    assert (config.num_inputs, config.num_actions) == (feature_size(window, config.one_hot), 3 * window + 1)
    for build, outputs in ((policy_net, 3 * window + 1), (value_net, 1)):
        torch.manual_seed(11)
        ours = build(config).state_dict()
        after_ours = torch.rand(3)
        torch.manual_seed(11)
        reference = _Reference(config, outputs).state_dict()
        after_reference = torch.rand(3)
        assert list(ours) == list(reference)
        for name in ours:
            assert torch.equal(ours[name], reference[name]), name
        assert torch.equal(after_ours, after_reference)  # the same random draws, so what follows is the same too


def test_a_ps_worker_config_saves_the_fields_it_always_saved():
    assert set(net_config("per-job").to_dict()) == {"window", "hidden", "activation", "batch_norm", "one_hot", "per_job"}
    shaped = net_config("per-job", roles=1, job_inputs=14, kinds=8)
    assert NetConfig(**{**shaped.to_dict(), "hidden": tuple(shaped.hidden)}) == shaped


@pytest.mark.parametrize("preset", ["per-job", "paper"])
def test_a_world_with_one_role_gets_window_plus_one_actions(preset):
    config = net_config(preset, window=5, roles=1, job_inputs=9, kinds=4)
    assert (config.num_inputs, config.num_actions) == (45, 6)
    x = torch.zeros(2, 45)
    x[:, 0] = 1.0  # the first window job is of kind 0; the others are empty
    assert policy_net(config)(x).shape == (2, 6)
    assert value_net(config)(x).shape == (2, 1)


# --- training in the Pollux world -------------------------------------------------------------------------

PRESET = PolluxPreset("pollux", 16, 4, 60, 30)
TINY = PolluxTrainSettings(window=4, hidden=(32, 32), train_seeds=(101,), sl_epochs=12, sl_batch_size=32, sl_lr=1e-2,
                           ppo_updates=2, num_envs=2, rollout_length=32, ppo_epochs=2, ppo_batch_size=32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: weights depend on the thread count


@pytest.fixture(scope="module")
def tiny_workload():
    """Six jobs (any workload does; a shipped one reads faster than the generator draws one)."""
    return read_workload(Cell("optimus", "1.0", 1, 0).path).first(6)


@pytest.fixture(scope="module")
def demonstrations(tiny_workload):
    return teacher_decisions([tiny_workload], PRESET, TINY.teacher, TINY.variant, TINY.window)


def test_the_pollux_network_has_the_worlds_shape():
    config = pollux_net_config(TINY)
    shape = WORLDS["pollux"].learning
    assert config.num_actions == shape.num_actions(TINY.window) == TINY.window + 1
    assert config.kinds == len(shape.job_types)
    assert config.num_inputs == encoded_size(TINY.window)
    assert len(shape.job_features) == NUM_JOB_FEATURES


def test_sl_pretraining_lowers_the_loss_and_imitates_the_teacher(demonstrations):
    states, masks, actions = demonstrations
    torch.manual_seed(0)
    nets = PolluxNets(pollux_net_config(TINY))
    history = pretrain(nets, states, masks, actions, TINY, torch.Generator().manual_seed(0))
    assert len(history) == TINY.sl_epochs + 1
    assert history["loss"].iloc[-1] < 0.5 * history["loss"].iloc[0]
    most_frequent = np.bincount(actions).max() / len(actions)  # the agreement of always one action (0.4 here)
    assert history["agreement"].iloc[-1] > max(0.8, most_frequent + 0.3)  # the teacher's action on most decisions
    greedy = nets.greedy()
    same = np.mean([greedy(s, m) == a for s, m, a in zip(states, masks, actions)])
    assert same == pytest.approx(history["agreement"].iloc[-1])  # the evaluation's decide is the trained policy


def test_a_window_prefix_gives_the_whole_windows_log_probabilities():
    settings = replace(TINY, window=12)
    torch.manual_seed(1)
    nets = PolluxNets(pollux_net_config(settings))
    rng = np.random.default_rng(1)
    filled = np.array([0, 1, 3, 5, 5, 2])  # jobs per state: a prefix of the window, as the environment fills it
    states = np.zeros((len(filled), settings.window, NUM_JOB_FEATURES))
    masks = np.zeros((len(filled), settings.window + 1), dtype=bool)
    masks[:, -1] = True
    for row, n in enumerate(filled):
        states[row, :n] = rng.uniform(0.0, 3.0, (n, NUM_JOB_FEATURES))
        states[row, :n, 0] = rng.integers(1, 5, n)  # the application (0: an empty slot)
        masks[row, :n] = rng.random(n) < 0.7
    assert filled_slots(states).tolist() == filled.tolist()
    inputs, mask_t = nets.inputs(states), torch.from_numpy(masks)
    whole = masked_log_probs(nets.policy(inputs), mask_t)
    for slots in (5, 8, settings.window):
        prefix = prefix_log_probs(nets.policy, inputs, mask_t, slots)
        assert torch.equal(torch.isinf(prefix), torch.isinf(whole)), "the same actions are illegal"
        torch.testing.assert_close(prefix[~torch.isinf(whole)], whole[~torch.isinf(whole)], rtol=1e-6, atol=1e-6)


def test_minibatches_cover_each_decision_once_with_windows_that_fill_alike():
    slots = np.random.default_rng(2).integers(0, 40, 1000)
    batches = minibatches(slots, 64, torch.Generator().manual_seed(2))
    assert sorted(torch.cat(batches).tolist()) == list(range(1000))
    assert all(len(b) <= 64 for b in batches)
    buckets = [set(((slots[b.numpy()] + SLOT_BUCKET - 1) // SLOT_BUCKET).tolist()) for b in batches]
    assert all(len(b) == 1 for b in buckets), "a minibatch's windows fill the same bucket of slots"
    firsts = [b.pop() for b in buckets]
    assert firsts != sorted(firsts), "the minibatches are shuffled, not taken bucket by bucket"
    again = minibatches(slots, 64, torch.Generator().manual_seed(2))
    assert all(torch.equal(a, b) for a, b in zip(batches, again))


def test_dagger_adds_the_learners_states_and_is_deterministic(tiny_workload, demonstrations):
    settings = replace(TINY, sl_epochs=1, dagger_rounds=2, dagger_epochs=1)
    runs = []
    for _ in range(2):
        torch.manual_seed(6)
        nets = PolluxNets(pollux_net_config(settings))
        generator = torch.Generator().manual_seed(6)
        pretrain(nets, *demonstrations, settings, generator)
        data = Demonstrations.encode(nets, *demonstrations)
        runs.append((dagger(nets, data, [tiny_workload], PRESET, settings, generator), nets.policy.state_dict()))
    history = runs[0][0]
    assert history["round"].tolist() == [1, 2] and (history["decisions"].diff().iloc[1:] > 0).all()
    assert history["decisions"].iloc[0] > len(demonstrations[2]), "each round adds the states the learner reached"
    pd.testing.assert_frame_equal(history, runs[1][0])
    assert all(torch.equal(v, runs[1][1][k]) for k, v in runs[0][1].items())


def test_sl_pretraining_is_deterministic_for_a_seed(demonstrations):
    short = replace(TINY, sl_epochs=2)
    runs = []
    for _ in range(2):
        torch.manual_seed(4)
        nets = PolluxNets(pollux_net_config(short))
        runs.append((pretrain(nets, *demonstrations, short, torch.Generator().manual_seed(4)), nets.policy.state_dict()))
    pd.testing.assert_frame_equal(runs[0][0], runs[1][0])
    assert all(torch.equal(v, runs[1][1][k]) for k, v in runs[0][1].items())


def _finetuned(workload, seed: int) -> tuple[PolluxNets, pd.DataFrame]:
    torch.manual_seed(seed)
    nets = PolluxNets(pollux_net_config(TINY))
    history = finetune(nets, [workload], PRESET, TINY, np.random.default_rng(seed))
    return nets, history


def test_ppo_updates_run_and_are_deterministic_for_a_seed(tiny_workload):
    torch.manual_seed(5)
    before = PolluxNets(pollux_net_config(TINY)).state_dicts()
    nets, history = _finetuned(tiny_workload, 5)
    again, history_again = _finetuned(tiny_workload, 5)
    assert len(history) == TINY.ppo_updates
    assert np.isfinite(history[["policy_loss", "value_loss", "entropy"]].to_numpy()).all()
    pd.testing.assert_frame_equal(history, history_again)
    for net in ("policy", "value"):
        after, after_again = nets.state_dicts()[net], again.state_dicts()[net]
        assert all(torch.equal(after[k], after_again[k]) for k in after)
        assert any(not torch.equal(after[k], before[net][k]) for k in after)  # the updates changed the weights


def test_a_checkpoint_round_trips(tmp_path, tiny_workload):
    torch.manual_seed(3)
    nets = PolluxNets(pollux_net_config(TINY))
    path = save_checkpoint(tmp_path / "run" / "pretrained.pt", nets, TINY, "pretrained", 3)
    loaded, settings, stage, seed = load_checkpoint(path)
    assert (settings, stage, seed) == (TINY, "pretrained", 3)
    for net in ("policy", "value"):
        assert all(torch.equal(loaded.state_dicts()[net][k], v) for k, v in nets.state_dicts()[net].items())
    assert list(tmp_path.joinpath("run").iterdir()) == [path]  # no temporary file left beside it


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"stage": "pretrained"}, path)
    with pytest.raises(Dl2Error, match="not a Pollux-world DL2 checkpoint"):
        load_checkpoint(path)


def test_training_seeds_exclude_the_artifacts_workloads():
    with pytest.raises(Dl2Error, match="train_seeds"):
        PolluxTrainSettings(train_seeds=(3, 101))


def test_the_baselines_are_the_published_grids_average_jcts():
    baselines = published_baselines().set_index(["load", "workload"])
    summary = pd.read_csv(PUBLISHED_SUMMARY, dtype={"load": str})
    pollux = summary[(summary.policy == "pollux") & (summary.load == "1.0") & (summary.workload == 2)]
    assert len(pollux) >= 3  # a randomized policy: the mean over its seeds
    assert baselines.loc[("1.0", 2), "pollux"] == pytest.approx(pollux.avg_jct.mean())
    optimus = summary[(summary.policy == "optimus") & (summary.load == "2.0") & (summary.workload == 8)].avg_jct
    assert baselines.loc[("2.0", 8), "optimus"] == optimus.item()
    assert len(baselines) == 32  # 4 loads x 8 workloads


@pytest.mark.parametrize("assign_one", [False, True])
def test_an_interval_ends_where_the_environment_opens_the_next(tiny_workload, assign_one):
    env = PolluxDecisionEnv(tiny_workload, PRESET, TINY.variant, TINY.window, assign_one=assign_one)
    state, mask = env.reset()
    assert interval_ended(state, assign_one)
    decide = np.random.default_rng(2)
    for _ in range(200):  # random decisions: the rule agrees with the environment's own interval
        before = env.decisions
        state, mask, reward, done = env.step(int(decide.choice(np.flatnonzero(mask))))
        opened = done or env.decisions is not before
        assert interval_ended(state, assign_one) == opened and (reward == 0.0 or opened)
        if done:
            break


def test_runs_assign_one_gpu_first_unless_an_old_checkpoint_says_otherwise():
    assert PolluxTrainSettings().assign_one
    old = {k: v for k, v in TINY.to_dict().items() if k != "assign_one"}  # written before the setting existed
    assert not PolluxTrainSettings.from_dict(old).assign_one
    assert PolluxTrainSettings.from_dict(TINY.to_dict()) == TINY


@pytest.mark.slow
def test_a_training_run_writes_its_checkpoints_and_compares_with_the_baselines(tmp_path):
    settings = PolluxTrainSettings(window=8, hidden=(16, 16), train_load=0.1, train_seeds=(101,), sl_epochs=1,
                                   ppo_updates=1, num_envs=2, rollout_length=16, eval_loads=("0.5",), eval_workloads=(1,))
    result = train_dl2_pollux(settings, PRESET, 7, tmp_path, progress=False)
    assert {p.name for p in tmp_path.iterdir()} == {"pretrained.pt", "finetuned.pt", "pretrain_history.csv",
                                                    "finetune_history.csv", "evaluation.csv", "comparison.csv", "run.json"}
    nets, loaded, stage, seed = load_checkpoint(tmp_path / "finetuned.pt")
    assert (loaded, stage, seed) == (settings, "finetuned", 7)
    assert all(torch.equal(v, result.nets.policy.state_dict()[k]) for k, v in nets.policy.state_dict().items())
    row, run = result.comparison.iloc[0], result.evaluation.iloc[0]
    assert row["optimus"] == published_baselines().set_index(["load", "workload"]).loc[("0.5", 1), "optimus"]
    if run["error"]:  # an imitation this short may leave a job waiting past the deadline: recorded, not raised
        assert np.isnan(row["avg_jct"])
    else:
        assert row["ratio_to_optimus"] == pytest.approx(row["avg_jct"] / row["optimus"])


@pytest.mark.slow
def test_a_set_of_runs_resumes_reading_back_the_runs_that_finished(tmp_path):
    settings = PolluxTrainSettings(window=8, hidden=(16, 16), train_load=0.1, train_seeds=(101,), sl_epochs=1,
                                   ppo_updates=1, num_envs=2, rollout_length=16, eval_loads=("0.5",), eval_workloads=(1,))
    first = runs.train_runs([settings], PRESET, [3], tmp_path, progress=False)
    folder = tmp_path / "tuned" / "seed-3"
    written = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = runs.train_runs([settings], PRESET, [3], tmp_path, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == written, "read back, not trained again"
    pd.testing.assert_frame_equal(runs.summary(again), runs.summary(first), check_exact=True)
    for a, b in zip(runs.histories(again), runs.histories(first)):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert all(torch.equal(v, first[("tuned", 3)].nets.policy.state_dict()[k])
               for k, v in again[("tuned", 3)].nets.policy.state_dict().items())
    assert finished_run(folder, replace(settings, sl_epochs=2), 3) is None, "other settings: train again"
    assert finished_run(folder, settings, 4) is None and finished_run(tmp_path / "absent", settings, 3) is None
    (folder / "run.json").unlink()  # a run interrupted before its last file
    assert finished_run(folder, settings, 3) is None


def test_evaluating_on_a_workload_that_is_not_shipped_is_an_error_not_a_failed_run():
    nets = PolluxNets(pollux_net_config(TINY))
    with pytest.raises(Dl2Error, match="workload-9.csv"):
        evaluate_greedy(nets, PRESET, "tuned", ["0.5"], [9])
