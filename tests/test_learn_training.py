"""Learning DL2: pretraining imitates its teacher, RL improves a bad policy, runs resume exactly, models load.

Everything runs on tiny presets so the file takes well under three minutes on two cores.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import PPO, learn_settings, pretrain_config, rl_config, tiny_preset

from dl2.backends import load_scheduler
from dl2.backends.sim import simulate
from dl2.cli import main
from dl2.config import load_params
from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy, DL2Scheduler, masks_from_states
from dl2.learn.architecture import net_config
from dl2.learn.env import DecisionEnv
from dl2.learn.exploration import Explorer
from dl2.learn.learners import LEARNERS, make_trainer
from dl2.learn.nets import masked_log_probs
from dl2.learn.pretrain import pretrain, teacher_decisions
from dl2.learn.replay import Replay, importance_beta
from dl2.learn.rollout import run_policy
from dl2.learn.settings import ALGORITHMS, FinetunePlan, PPOSettings, finetune_plan
from dl2.learn.trainer import Trainer
from dl2.learn.workflow import model_name
from dl2.sim.scenario import Scenario, SimOptions
from dl2.sim.state import NUM_FEATURES
from dl2.workload.presets import get_preset
from dl2.workload.traces import generate_trace, write_trace

TESTS = Path(__file__).resolve().parent


def _traces(scenario, n, seed=0):
    return [generate_trace(scenario.preset, scenario.catalog, s) for s in np.random.SeedSequence(seed).spawn(n)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: weights depend on the thread count


# --- pretraining -------------------------------------------------------------------------------------

def test_pretraining_imitates_drf():
    scenario = Scenario(tiny_preset(3, 3, 10))
    train, validation = _traces(scenario, 6, seed=0), _traces(scenario, 2, seed=1)
    net = net_config("paper", hidden=(64, 64), window=10)
    policy, history = pretrain(train, validation, scenario, net,
                               pretrain_config(teacher="drf", epochs=20, batch_size=64, lr=0.005, seed=0, eval_every=10))
    assert list(history["epoch"]) == list(range(1, 21))
    last = history.iloc[-1]
    assert last["train_accuracy"] >= 0.95, history[["epoch", "train_accuracy"]].to_string()
    assert history.iloc[0]["train_accuracy"] < last["train_accuracy"]
    teacher = float(np.mean([simulate(t, "drf", scenario).jct.mean() for t in validation]))
    assert last["val_jct_teacher"] == pytest.approx(teacher)
    assert abs(last["val_jct_greedy"] - teacher) <= 0.05 * teacher, history.to_string()
    # the accuracy is against the teacher's own decisions
    states, actions = teacher_decisions(train, scenario, "drf", net.window)
    chosen = policy.act(states, masks_from_states(states, policy.max_tasks), greedy=True)
    assert np.mean(chosen == actions) >= 0.95


def test_the_validation_loss_in_chunks_is_the_loss_over_all_decisions_at_once():
    from dl2.learn.pretrain import _dataset, _validation_loss

    scenario = Scenario(tiny_preset(3, 3, 10))
    policy = DL2Policy(net_config("paper", hidden=(32, 32), window=10), 3, True)
    x, y, masks = _dataset(policy, _traces(scenario, 2), scenario, "drf")
    whole = _validation_loss(policy, x, y, masks, chunk=len(y))
    chunked = _validation_loss(policy, x, y, masks, chunk=7)
    assert len(y) > 7 and chunked["val_accuracy"] == whole["val_accuracy"]
    assert chunked["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-6)


def test_label_smoothing_keeps_the_teachers_choices_but_leaves_room_to_explore():
    scenario = Scenario(tiny_preset(3, 3, 10))
    train, validation = _traces(scenario, 4, seed=0), _traces(scenario, 1, seed=1)
    net = net_config("paper", hidden=(64, 64), window=10)
    states, actions = teacher_decisions(train, scenario, "drf", net.window)
    masks = masks_from_states(states, 3)
    entropy, accuracy = {}, {}
    for smoothing in (0.0, 0.2):
        policy, _ = pretrain(train, validation, scenario, net, pretrain_config(epochs=8, batch_size=64, eval_every=8,
                                                                            label_smoothing=smoothing))
        with torch.no_grad():
            log_probs = masked_log_probs(policy.net(policy.inputs(states)), torch.from_numpy(masks))
        entropy[smoothing] = float(-(log_probs.exp() * log_probs.masked_fill(~torch.from_numpy(masks), 0)).sum(-1).mean())
        accuracy[smoothing] = float((log_probs.argmax(-1).numpy() == actions).mean())
    assert accuracy[0.2] >= 0.9 and accuracy[0.0] >= 0.9, accuracy
    assert entropy[0.2] > 2 * entropy[0.0], entropy
    with pytest.raises(Dl2Error, match="label_smoothing"):
        pretrain_config(label_smoothing=1.0)


# --- RL fine-tuning ----------------------------------------------------------------------------------

RL_SCENARIO = Scenario(tiny_preset(3, 3, 10), SimOptions(assign_bundle=True))
RL_NET = net_config("paper", hidden=(64, 64), window=10)


def _void_loving_policy(seed: int, void_bias: float = 5.0) -> DL2Policy:
    torch.manual_seed(seed)
    policy = DL2Policy(RL_NET, RL_SCENARIO.preset.max_tasks, RL_SCENARIO.options.assign_bundle)
    with torch.no_grad():
        policy.net.body[-1].bias[-1] += void_bias  # the last logit is void
    return policy


def test_rl_improves_a_policy_that_mostly_does_nothing():
    train, validation = _traces(RL_SCENARIO, 8, seed=0), _traces(RL_SCENARIO, 4, seed=1)
    policy = _void_loving_policy(seed=0)

    def val_jct():
        return float(np.mean(run_policy(policy, validation, RL_SCENARIO, greedy=False, seed=0).avg_jct))

    before = val_jct()
    nothing = float(np.mean([_void_only_jct(t) for t in validation]))
    assert before == pytest.approx(nothing, rel=0.02), "the initial policy should barely act beyond the bundle"
    config = rl_config(updates=300, num_envs=4, lr=1e-3, entropy=0.01, batch_size=64, replay="uniform",
                      replay_size=4096, learn_start=64, critic="slot", exploration="off", validate_every=100,
                      checkpoint_every=1000)
    history = make_trainer(policy, train, validation, RL_SCENARIO, config, 0).train()
    after = val_jct()
    # seen with seeds 0-4: drops of 25-40% (12.66 -> 8.75 with seed 0)
    assert after <= 0.9 * before, (before, after, history.to_string())
    assert list(history["update"]) == [100, 200, 300]
    assert history.iloc[-1]["val_jct_sampled"] == pytest.approx(after)


def test_ppo_improves_a_policy_that_mostly_does_nothing():
    train, validation = _traces(RL_SCENARIO, 8, seed=0), _traces(RL_SCENARIO, 4, seed=1)
    policy = _void_loving_policy(seed=0)

    def val_jct():
        return float(np.mean(run_policy(policy, validation, RL_SCENARIO, greedy=True).avg_jct))

    before = val_jct()
    config = rl_config(algorithm="ppo", updates=30, num_envs=4, lr=1e-3, entropy=0.01, batch_size=128,
                      rollout_length=64, replay="off", exploration="off", critic="slot", shaping="env",
                      validate_every=10, checkpoint_every=1000)
    history = make_trainer(policy, train, validation, RL_SCENARIO, config, 0).train()
    after = val_jct()
    assert after <= 0.8 * before, (before, after, history.to_string())
    assert list(history["update"]) == [10, 20, 30]
    assert history.iloc[-1]["val_jct_greedy"] == pytest.approx(after)
    assert {"policy_loss", "value_loss", "entropy", "mean_reward"} <= set(history.columns)


def test_fine_tuning_keeps_the_weights_that_did_best_on_the_selection_traces():
    train, validation, selection = (_traces(RL_SCENARIO, n, seed=k) for k, n in enumerate((8, 2, 3)))
    config = rl_config(algorithm="ppo", updates=12, num_envs=4, lr=3e-3, entropy=0.01, batch_size=128, rollout_length=32,
                      replay="off", exploration="off", critic="slot", shaping="env", validate_every=2,
                      checkpoint_every=1000)
    world = Scenario(RL_SCENARIO.preset, replace(RL_SCENARIO.options, speed_model="analytical"))  # as OfflineRL's
    trainer = make_trainer(_void_loving_policy(seed=0), train, validation, world, config, 0, validation_scenario=RL_SCENARIO,
                      selection=selection)
    history = trainer.train()
    best = history.loc[history.select_jct.idxmin()]
    assert trainer.chosen_update == best["update"]
    chosen = trainer.chosen_policy()  # chosen in the world it trains in, never on the validation world's speeds
    assert np.mean(run_policy(chosen, selection, world, greedy=True).avg_jct) == best["select_jct"]
    assert np.mean(run_policy(trainer.policy, selection, world, greedy=True).avg_jct) == history.iloc[-1]["select_jct"]
    assert np.mean(run_policy(trainer.policy, selection, RL_SCENARIO, greedy=True).avg_jct) != history.iloc[-1]["select_jct"]
    if best["update"] != history.iloc[-1]["update"]:  # kept from earlier: not the weights training ended with
        assert not all(torch.equal(a, b) for a, b in zip(chosen.net.state_dict().values(), trainer.policy.net.state_dict().values()))
    without = make_trainer(_void_loving_policy(seed=0), train, validation, RL_SCENARIO, replace(config, updates=2), 0)
    assert "select_jct" not in without.train() and without.chosen_policy() is without.policy and without.chosen_update == 2


def test_per_action_rewards_pay_each_decision_its_jobs_share():
    train, validation = _traces(RL_SCENARIO, 4, seed=0), _traces(RL_SCENARIO, 2, seed=1)
    config = rl_config(updates=3, num_envs=2, lr=0.0, batch_size=16, replay="uniform", learn_start=16, exploration="off",
                      reward="job", validate_every=100, checkpoint_every=100)  # lr 0: both runs decide alike
    trainer = make_trainer(_void_loving_policy(seed=0), train, validation, RL_SCENARIO, config, 0)
    trainer.train()
    per_job = trainer.replay.rewards[: trainer.replay.size]
    slot = replace(config, reward="slot")
    same = make_trainer(_void_loving_policy(seed=0), train, validation, RL_SCENARIO, slot, 0)
    same.train()
    per_slot = same.replay.rewards[: same.replay.size]
    # the same decisions, each paid a part of the slot's reward instead of all of it
    assert len(per_job) == len(per_slot) and (per_job <= per_slot + 1e-9).all() and (per_job < per_slot - 1e-9).any()



@pytest.mark.parametrize("bad, key", [({**PPO, "exploration": "code"}, "exploration"), ({**PPO, "replay": "uniform"}, "replay"),
                                      (dict(algorithm="actor-critic", shaping="env"), "shaping"), (dict(algorithm="a3c"), "algorithm"),
                                      ({**PPO, "shaping": "oracle"}, "shaping"), (dict(lr_schedule="cosine"), "lr_schedule"),
                                      ({**PPO, "rollout_length": 0}, "rollout_length"), ({**PPO, "reward": "job"}, "reward"),
                                      (dict(reward="action"), "reward")])
def test_inconsistent_rl_settings_are_refused_naming_the_key(bad, key):
    with pytest.raises(Dl2Error, match=key):
        rl_config(**bad)


def _void_only_jct(trace):

    env = DecisionEnv([trace], RL_SCENARIO, window=RL_NET.window)
    env.reset(trace=trace)
    while True:
        _, _, terminated, truncated, info = env.step(env.num_actions - 1)
        if terminated or truncated:
            assert terminated
            return float(np.mean(info["jct"]))


# --- checkpoints: resuming equals an uninterrupted run ----------------------------------------------

RESUME_UPDATES, RESUME_EVERY = 120, 10
RESUME_SCENARIO = Scenario(tiny_preset(2, 2, 6), SimOptions(assign_bundle=True))
RESUME_NET = net_config("paper", hidden=(32, 32), window=6)


def make_resume_trainer(exploration: str = "code", replay: str = "prioritized", critic: str = "td",
                        algorithm: str = "actor-critic") -> Trainer:
    """The trainer of the resume tests (also built in the subprocess that gets killed)."""
    train, validation = _traces(RESUME_SCENARIO, 4, seed=5), _traces(RESUME_SCENARIO, 1, seed=6)
    torch.manual_seed(3)
    policy = DL2Policy(RESUME_NET, RESUME_SCENARIO.preset.max_tasks, RESUME_SCENARIO.options.assign_bundle)
    ppo = dict(updates=RESUME_UPDATES // 4, rollout_length=16, shaping="analytical", lr_schedule="linear",
               validate_every=5, checkpoint_every=RESUME_EVERY // 2) if algorithm == "ppo" else {}
    config = rl_config(**{**dict(updates=RESUME_UPDATES, num_envs=3, lr=1e-3, entropy=0.05, batch_size=32, replay=replay,
                                replay_size=512, learn_start=32, critic=critic, exploration=exploration, validate_every=20,
                                checkpoint_every=RESUME_EVERY, algorithm=algorithm), **ppo})
    selection = _traces(RESUME_SCENARIO, 1, seed=7) if algorithm == "ppo" else ()  # the kept weights resume too
    return make_trainer(policy, train, validation, RESUME_SCENARIO, config, 11, selection=selection)


def _assert_same_state(a: Trainer, b: Trainer):
    assert a.updates == b.updates and a.decisions == b.decisions
    for x, y in [(a.policy.net.state_dict(), b.policy.net.state_dict()), (a.value.state_dict(), b.value.state_dict())]:
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]), key
    ha = pd.DataFrame(a.history).drop(columns="seconds")
    hb = pd.DataFrame(b.history).drop(columns="seconds")
    pd.testing.assert_frame_equal(ha, hb, check_exact=True)
    assert a.episode_jcts == b.episode_jcts
    assert a.chosen_update == b.chosen_update
    for x, y in zip(a.chosen_policy().net.state_dict().values(), b.chosen_policy().net.state_dict().values()):
        assert torch.equal(x, y)


@pytest.fixture(scope="module")
def straight_run():
    torch.set_num_threads(1)
    trainer = make_resume_trainer()
    trainer.train()
    assert trainer.updates == RESUME_UPDATES
    return trainer


def test_resuming_in_process_equals_an_uninterrupted_run(straight_run, tmp_path):
    checkpoint = tmp_path / "run.ckpt"
    first = make_resume_trainer()
    first.train(checkpoint=checkpoint, stop_after=RESUME_UPDATES // 2 + 1)  # stops between two checkpoints
    assert first.updates == RESUME_UPDATES // 2 + 1
    assert any(first.pending), "the checkpoint should be taken in the middle of some slot"
    resumed = Trainer.load(checkpoint)
    assert resumed is not first and resumed.updates == first.updates
    resumed.train(checkpoint=checkpoint)
    _assert_same_state(straight_run, resumed)
    assert Trainer.load(checkpoint).updates == RESUME_UPDATES


@pytest.mark.parametrize("kind", ["uniform-slot-paper-actor-critic", "off-off-epsilon-actor-critic", "off-td-off-ppo", "off-off-off-ppo"])
def test_resuming_equals_uninterrupted_for_other_settings(kind, tmp_path):
    replay, critic, exploration, algorithm = kind.split("-", 3)
    straight = make_resume_trainer(exploration, replay, critic, algorithm)
    straight.train()
    checkpoint = tmp_path / "run.ckpt"
    stop = 37 if algorithm == "actor-critic" else 13
    make_resume_trainer(exploration, replay, critic, algorithm).train(checkpoint=checkpoint, stop_after=stop)
    resumed = Trainer.load(checkpoint)
    assert resumed.updates == stop
    resumed.train()
    _assert_same_state(straight, resumed)


KILLED_RUN = """
import sys
sys.path.insert(0, {tests!r})
import test_learn_training as t
import time
# pause at each validation (history timings only, which the comparison ignores) so the kill lands mid-run
t.make_resume_trainer().train(checkpoint={checkpoint!r}, on_row=lambda row: time.sleep(1.0))
print("finished")
"""


def test_resuming_after_sigkill_equals_an_uninterrupted_run(straight_run, tmp_path):
    checkpoint = tmp_path / "killed.ckpt"
    code = KILLED_RUN.format(tests=str(TESTS), checkpoint=str(checkpoint))
    out, err = open(tmp_path / "stdout", "w"), open(tmp_path / "stderr", "w")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=TESTS.parent, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 300
        while not checkpoint.exists():
            if proc.poll() is not None:
                pytest.fail(f"training subprocess exited ({proc.returncode}) before a checkpoint: "
                            f"{(tmp_path / 'stderr').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail("no checkpoint within 300 s")
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        err.close()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it was killed: nothing was resumed"
    assert "finished" not in (tmp_path / "stdout").read_text()
    resumed = Trainer.load(checkpoint)
    assert 0 < resumed.updates < RESUME_UPDATES and resumed.updates % RESUME_EVERY == 0
    resumed.train(checkpoint=checkpoint)
    _assert_same_state(straight_run, resumed)


def test_loading_a_missing_or_foreign_checkpoint_is_a_dl2_error(tmp_path):
    with pytest.raises(Dl2Error, match="not found"):
        Trainer.load(tmp_path / "nope.ckpt")
    import pickle

    foreign = tmp_path / "foreign.ckpt"
    foreign.write_bytes(pickle.dumps({"updates": 3}))
    with pytest.raises(Dl2Error, match="foreign.ckpt"):
        Trainer.load(foreign)


@pytest.mark.parametrize("kind", ["text", "empty"])
def test_loading_a_checkpoint_that_is_not_a_pickle_is_a_dl2_error(kind, tmp_path):
    path = tmp_path / f"{kind}.ckpt"
    path.write_bytes(NOT_TORCH_FILES[kind])
    with pytest.raises(Dl2Error, match=f"{kind}.ckpt"):
        Trainer.load(path)


# --- saved models --------------------------------------------------------------------------------------

def _probs(policy, states):
    masks = masks_from_states(states, policy.max_tasks)
    policy.net.eval()
    with torch.no_grad():
        return masked_log_probs(policy.net(policy.inputs(states)), torch.from_numpy(masks)).exp().numpy()


def _random_states(rng, n, window, max_tasks):
    states = np.zeros((n, window, NUM_FEATURES), dtype=np.float32)
    for k in range(n):
        filled = rng.integers(0, window + 1)
        states[k, :filled, 0] = rng.integers(1, 9, filled)
        states[k, :filled, 1] = rng.integers(0, 50, filled)
        states[k, :filled, 2] = rng.random(filled)
        states[k, :filled, 3] = rng.random(filled) * 0.1
        states[k, :filled, 4] = rng.integers(0, max_tasks + 1, filled)
        states[k, :filled, 5] = rng.integers(0, max_tasks + 1, filled)
    return states


@pytest.mark.parametrize("preset_name", ["paper", "code", "per-job"])
def test_a_saved_model_loads_back_and_schedules(preset_name, tmp_path):
    scenario = Scenario(tiny_preset(3, 3, 10))
    torch.manual_seed(0)
    policy = DL2Policy(net_config(preset_name, hidden=(48, 48), window=8), scenario.preset.max_tasks,
                       scenario.options.assign_bundle)
    path = tmp_path / "model.pt"
    policy.save(path, extra={"note": "test"})
    loaded = DL2Policy.load(path)
    assert loaded.config == policy.config and loaded.max_tasks == policy.max_tasks
    states = _random_states(np.random.default_rng(0), 64, policy.config.window, policy.max_tasks)
    np.testing.assert_array_equal(_probs(loaded, states), _probs(policy, states))
    scheduler = load_scheduler(str(path))
    assert isinstance(scheduler, DL2Scheduler) and scheduler.name == "model" and scheduler.greedy
    scheduler = DL2Scheduler.load(path, greedy=False)  # random weights: greedy, void may win every slot
    for trace in _traces(scenario, 2, seed=9):
        result = simulate(trace, scheduler, scenario)
        assert result.jct.shape == (len(trace),) and np.isfinite(result.jct).all() and (result.jct > 0).all()


@pytest.mark.parametrize("assign_bundle,network", [(False, "paper"), (True, "paper"), (True, "per-job")])
def test_the_scheduler_and_the_environment_make_the_same_greedy_decisions(assign_bundle, network):
    scenario = Scenario(tiny_preset(3, 3, 10), SimOptions(assign_bundle=assign_bundle))
    torch.manual_seed(1)
    policy = DL2Policy(net_config(network, hidden=(48, 48), window=8), scenario.preset.max_tasks,
                       scenario.options.assign_bundle)
    for trace in _traces(scenario, 2, seed=10):
        via_scheduler = simulate(trace, DL2Scheduler(policy, greedy=True), scenario).jct.mean()
        via_env = run_policy(policy, [trace], scenario, greedy=True).avg_jct[0]
        assert via_scheduler == via_env == _greedy_jct_through_torch(policy, trace, scenario)


def _greedy_jct_through_torch(policy, trace, scenario) -> float:
    """The reference for the compiled paths: the torch network stepping the environment."""
    env = DecisionEnv([trace], scenario, policy.config.window)
    state, info = env.reset(trace=trace)
    while True:
        action = policy.act(state[None], info["mask"][None], greedy=True)[0]
        state, _, terminated, truncated, info = env.step(int(action))
        if terminated or truncated:
            return float(np.mean(env.jct()))


def test_loading_something_that_is_not_a_model_is_a_dl2_error(tmp_path):
    missing = tmp_path / "missing.pt"
    with pytest.raises(Dl2Error, match="missing.pt"):
        DL2Policy.load(missing)
    wrong_dict = tmp_path / "weights_only.pt"
    torch.save({"state_dict": {}}, wrong_dict)
    with pytest.raises(Dl2Error, match="weights_only.pt"):
        DL2Policy.load(wrong_dict)
    with pytest.raises(Dl2Error, match="weights_only.pt"):
        load_scheduler(str(wrong_dict))
    truncated = tmp_path / "truncated.pt"
    DL2Policy(net_config("paper", hidden=(16,), window=4), max_tasks=3, assign_bundle=True).save(truncated)
    truncated.write_bytes(truncated.read_bytes()[:200])
    with pytest.raises(Dl2Error, match="truncated.pt"):
        DL2Policy.load(truncated)


class _RunsCodeWhenUnpickled:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_model_file_that_would_run_code_is_refused_unopened(tmp_path):
    marker = tmp_path / "ran"
    crafted = tmp_path / "shared.pt"
    torch.save({"config": _RunsCodeWhenUnpickled(marker), "max_tasks": 8}, crafted)
    with pytest.raises(Dl2Error, match=r"shared.pt: refused: .* Python code \(.*\), which dl2 never runs"):
        DL2Policy.load(crafted)
    with pytest.raises(Dl2Error, match="refused"):
        load_scheduler(str(crafted))
    assert not marker.exists()


def test_a_model_runs_greedy_and_as_it_was_trained_wherever_it_is_loaded(tmp_path, capsys):
    """`dl2 simulate --policy model.pt` gives the number `evaluate` reports for the model: greedy, with the
    bundle per job it was trained with, though the command line does not ask for one."""
    trained_in = Scenario(get_preset("paper"), SimOptions(assign_bundle=True))
    torch.manual_seed(4)
    policy = DL2Policy(net_config("per-job", hidden=(32, 32), window=10), 8, assign_bundle=True)
    path = tmp_path / "model.pt"
    policy.save(path)
    assert DL2Policy.load(path).assign_bundle and load_scheduler(str(path)).greedy
    trace = _traces(trained_in, 1, seed=12)[0]
    write_trace(trace, tmp_path / "trace.csv")
    assert main(["simulate", "--trace", str(tmp_path / "trace.csv"), "--policy", str(path), "--preset", "paper"]) == 0
    reported = json.loads(capsys.readouterr().out)["avg_jct"]
    assert reported == run_policy(policy, [trace], trained_in, greedy=True).avg_jct[0]


NOT_TORCH_FILES = {"text": b"these are not weights\n", "empty": b"", "binary": bytes(range(256)) * 4,
                   "csv": b"job_id,arrival_slot,model,num_epochs\n1,0,resnet,10\n"}


@pytest.mark.parametrize("kind", list(NOT_TORCH_FILES))
def test_loading_a_file_that_is_not_a_torch_file_is_a_dl2_error(kind, tmp_path):
    path = tmp_path / f"{kind}.pt"
    path.write_bytes(NOT_TORCH_FILES[kind])
    with pytest.raises(Dl2Error, match=f"{kind}.pt"):
        DL2Policy.load(path)
    with pytest.raises(Dl2Error, match=f"{kind}.pt"):
        load_scheduler(str(path))


def test_a_model_for_another_max_tasks_is_refused(tmp_path):
    path = tmp_path / "m.pt"
    DL2Policy(net_config("paper", hidden=(16,), window=4), max_tasks=5, assign_bundle=True).save(path)
    scenario = Scenario(tiny_preset(2, 2, 6))
    with pytest.raises(Dl2Error, match="max_tasks"):
        simulate(_traces(scenario, 1)[0], load_scheduler(str(path)), scenario)


# --- exploration -------------------------------------------------------------------------------------

def _state(rows, window=5):
    state = np.zeros((window, NUM_FEATURES), dtype=np.float32)
    for pos, (workers, ps) in enumerate(rows):
        state[pos] = [1 + pos % 8, 3, 0.5, 0.01, workers, ps]
    return state


def test_paper_exploration_repairs_a_job_with_workers_but_no_ps():
    max_tasks, window = 4, 5
    explorer = Explorer("paper", epsilon=1.0)
    rng = np.random.default_rng(0)
    state = _state([(1, 1), (2, 0), (0, 2)], window)  # position 1: workers, no PS (and position 2 the other way)
    mask = masks_from_states(state[None], max_tasks)[0]
    probs = mask / mask.sum()
    void = 3 * window
    for sampled in [void, 0, 2, 6, 8]:
        assert explorer.choose(sampled, state, mask, probs, 0, rng, 4) == 3 * 1 + 1
    # a job with PS but no workers gets a worker
    state = _state([(1, 1), (0, 2)], window)
    mask = masks_from_states(state[None], max_tasks)[0]
    assert explorer.choose(void, state, mask, mask / mask.sum(), 0, rng, 4) == 3 * 1 + 0
    # no poor job, or the repair is not legal: the sampled action stands
    state = _state([(1, 1), (2, 2)], window)
    mask = masks_from_states(state[None], max_tasks)[0]
    assert explorer.choose(4, state, mask, mask / mask.sum(), 0, rng, 4) == 4
    state = _state([(1, 1), (2, 0)], window)
    mask = masks_from_states(state[None], max_tasks)[0]
    mask[3 * 1 + 1] = False
    assert explorer.choose(void, state, mask, mask / mask.sum(), 0, rng, 4) == void
    # epsilon = 0: never overrides
    never = Explorer("paper", epsilon=0.0)
    state = _state([(2, 0)], window)
    mask = masks_from_states(state[None], max_tasks)[0]
    assert never.choose(void, state, mask, mask / mask.sum(), 0, rng, 4) == void


@pytest.mark.parametrize("mode", ["code", "paper", "epsilon", "off"])
def test_exploration_never_returns_an_illegal_action(mode):
    rng = np.random.default_rng(42)
    explorer = Explorer(mode, epsilon=1.0 if mode == "paper" else 0.4)
    window, max_tasks = 6, 3
    overridden = 0
    states = _random_states(rng, 3000, window, max_tasks)
    for step, state in enumerate(states):
        mask = masks_from_states(state[None], max_tasks)[0]
        if rng.random() < 0.5:  # also masks narrower than the state's
            mask &= rng.random(mask.shape) < 0.7
            mask[-1] = True
        logits = rng.normal(size=mask.shape) * 3
        logits[rng.random(mask.shape) < 0.2] = -80.0  # some legal actions with negligible probability
        probs = np.where(mask, np.exp(logits), 0.0)
        probs /= probs.sum()
        sampled = int(rng.choice(len(probs), p=probs))
        action = explorer.choose(sampled, state, mask, probs, step, rng, int(rng.integers(3, 8)))
        assert 0 <= action < len(mask) and mask[action], (mode, step, sampled, action)
        overridden += action != sampled
    if mode == "off":
        assert overridden == 0
    else:
        assert overridden > 0, "the rules never fired: the check is empty"


def test_finetune_run_resumes_only_its_own_checkpoint(tmp_path):
    from dl2.learn import workflow

    settings = learn_settings(window=10, hidden=(32, 32), train_traces=2, validation_traces=1)
    rl = rl_config(updates=4, num_envs=2, batch_size=32, learn_start=64, validate_every=2, checkpoint_every=2,
                  replay="uniform", exploration="off")
    pretrained = DL2Policy(workflow.network(settings), 8, settings.assign_bundle)
    checkpoint = tmp_path / "run.ckpt"
    policy, history = workflow.finetune_run("sl-rl", 0, settings, rl, pretrained, checkpoint)
    assert list(history["update"]) == [2, 4] and (history.run == "sl-rl").all() and list(history.chosen) == [False, True]
    # the finished checkpoint is this run's: loading it trains nothing more and gives the same weights
    again, history_again = workflow.finetune_run("sl-rl", 0, settings, rl, pretrained, checkpoint)
    for a, b in zip(policy.net.state_dict().values(), again.net.state_dict().values()):
        assert torch.equal(a, b)
    assert list(history_again["update"]) == [2, 4]
    # another run's settings, or seed, never resume from it
    other = replace(rl, updates=6)
    _, history_other = workflow.finetune_run("sl-rl", 0, settings, other, pretrained, checkpoint)
    assert list(history_other["update"]) == [2, 4, 6]
    _, history_seed = workflow.finetune_run("sl-rl", 1, settings, other, pretrained, checkpoint)
    assert list(history_seed["update"]) == [2, 4, 6]
    assert not history_seed.drop(columns="seconds").equals(history_other.drop(columns="seconds"))
    # nor does a run resume from a file it cannot read (another version's checkpoint, say): it trains anew
    checkpoint.write_bytes(b"a checkpoint of another dl2")
    with pytest.warns(UserWarning, match="run.ckpt: not a dl2 training checkpoint .*; training anew"):
        anew, history_anew = workflow.finetune_run("sl-rl", 0, settings, rl, pretrained, checkpoint)
    pd.testing.assert_frame_equal(history_anew.drop(columns="seconds"), history.drop(columns="seconds"))


def test_selection_traces_are_neither_training_nor_validation_traces():
    from dl2.learn import workflow

    settings = learn_settings(train_traces=2, validation_traces=2)
    sc = workflow.scenario(settings)
    train, validation = workflow.split_traces(settings, sc)
    selection = workflow.selection_traces(settings, sc, 3)
    assert len(selection) == 3 and workflow.selection_traces(settings, sc, 0) == []
    seen = [tuple(t.arrival) + tuple(t.num_epochs) for t in train + validation]
    assert all(tuple(t.arrival) + tuple(t.num_epochs) not in seen for t in selection)
    more = workflow.split_traces(replace(settings, validation_traces=3), sc)[1][:2]
    assert [tuple(t.num_epochs) for t in more] == [tuple(t.num_epochs) for t in validation], "adding traces keeps the earlier ones"


def test_finetune_runs_in_worker_processes_end_as_in_one_process(tmp_path):
    from dl2.learn import workflow

    settings = learn_settings(window=10, hidden=(32, 32), train_traces=2, validation_traces=1)
    plan = FinetunePlan(runs=("sl-rl", "rl-only"), seeds=(0, 1), backend="sim", workers=1,
                        learner=rl_config(updates=2, num_envs=2, batch_size=32, rollout_length=16, validate_every=1))
    torch.manual_seed(0)
    pretrained = DL2Policy(workflow.network(settings), 8, settings.assign_bundle)
    rows = []
    serial = list(workflow.finetune_all(plan, settings, pretrained, tmp_path / "serial", on_row=lambda m, r: rows.append((m, r["update"]))))
    parallel_rows = []
    parallel = list(workflow.finetune_all(replace(plan, workers=2), settings, pretrained, tmp_path / "parallel",
                                          on_row=lambda m, r: parallel_rows.append((m, r["update"]))))
    assert [(name, seed) for name, seed, _, _ in parallel] == [("sl-rl", 0), ("sl-rl", 1), ("rl-only", 0), ("rl-only", 1)]
    assert parallel_rows == rows == [(m, u) for m in ("sl-rl-s0", "sl-rl-s1", "rl-only-s0", "rl-only-s1") for u in (1, 2)]
    for (_, _, one, history_one), (_, _, two, history_two) in zip(serial, parallel):
        pd.testing.assert_frame_equal(history_one.drop(columns="seconds"), history_two.drop(columns="seconds"))
        for a, b in zip(one.net.state_dict().values(), two.net.state_dict().values()):
            assert torch.equal(a, b)


# --- per-decision credit and the live scheduler's forward pass -----------------------------------------

def test_gae_credits_each_decision_and_stops_at_slot_and_episode_ends():
    from dl2.learn.ppo import advantages
    from dl2.learn.ppo_rollout import Rollout

    r = Rollout.empty(4, 1, window=1, features=NUM_FEATURES)
    r.rewards[:, 0] = [0.0, 1.0, 0.0, 2.0]  # decision 1 ends a slot (reward 1), decision 3 ends the episode
    r.discounts[:, 0] = [1.0, 0.5, 1.0, 0.5]
    r.dones[:, 0] = [False, False, False, True]
    r.values[:, 0] = [0.2, 0.4, 0.8, 1.0, 9.0]  # the bootstrap value 9 lies past the episode's end
    lam = 0.9
    deltas = [0.0 + 0.4 - 0.2, 1.0 + 0.5 * 0.8 - 0.4, 0.0 + 1.0 - 0.8, 2.0 - 1.0]
    expected = [0.0] * 4
    expected[3] = deltas[3]
    expected[2] = deltas[2] + lam * expected[3]
    expected[1] = deltas[1] + 0.5 * lam * expected[2]
    expected[0] = deltas[0] + lam * expected[1]
    np.testing.assert_allclose(advantages(r, lam)[:, 0], expected, rtol=1e-6)


@pytest.mark.parametrize("network,hidden", [("paper", (40, 24)), ("code", (40, 24)), ("per-job", (40, 24)),
                                            ("per-job", (16,)), ("per-job", (16, 12, 8)), ("paper", (16, 12, 8))])
def test_the_live_schedulers_compiled_forward_pass_matches_the_network(network, hidden):
    from dl2.learn.compiled import FrozenPolicy

    torch.manual_seed(4)
    policy = DL2Policy(net_config(network, window=12, hidden=hidden), 8, assign_bundle=True)
    with torch.no_grad():  # give batch norm statistics that are not the identity
        for module in policy.net.modules():
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    rng = np.random.default_rng(1)
    states = _random_states(rng, 32, 12, 8)
    # as within a slot: consecutive states differ in one row, so the row cache is reused
    for k in range(16, 32):
        states[k] = states[k - 1]
        states[k, rng.integers(12), 4:6] = rng.integers(0, 9, 2)
    masks = masks_from_states(states, 8)
    expected = _probs(policy, states)
    forward = FrozenPolicy(policy)
    got = np.stack([np.exp(forward.log_probs(s, m)) for s, m in zip(states, masks)])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_slot_latency_times_a_whole_slot_of_decisions():
    from dl2.bench import slot_latency

    scenario = Scenario(tiny_preset(3, 3, 10), SimOptions(assign_bundle=True))
    torch.manual_seed(0)
    policy = DL2Policy(net_config("paper", window=10, hidden=(32, 32)), scenario.preset.max_tasks,
                       scenario.options.assign_bundle)
    latency = slot_latency(policy, scenario, num_jobs=10, repeats=3)
    assert latency.seconds > 0 and latency.decisions >= 1


def test_the_evaluation_summary_spreads_over_seeds():
    from dl2.learn.evaluate import summary_table

    rows = [{"policy": "drf", "seed": -1, "trace": t, "avg_jct": 10.0, "lower_bound": 5.0} for t in range(2)]
    rows += [{"policy": "optimus", "seed": -1, "trace": t, "avg_jct": 8.0, "lower_bound": 5.0} for t in range(2)]
    rows += [{"policy": "dl2", "seed": s, "trace": t, "avg_jct": j, "lower_bound": 5.0}
             for s, (a, b) in enumerate([(5.0, 7.0), (6.0, 8.0), (7.0, 9.0)]) for t, j in enumerate((a, b))]
    table = summary_table(pd.DataFrame(rows)).set_index("policy")
    assert table.loc["dl2", "avg_jct"] == pytest.approx(7.0) and table.loc["dl2", "seeds"] == 3
    assert table.loc["dl2", "seed_sd"] == pytest.approx(1.0) and table.loc["dl2", "seed_min"] == pytest.approx(6.0)
    assert table.loc["dl2", "ratio_to_bound"] == pytest.approx(1.4)
    assert table.loc["dl2", "gain_vs_drf"] == pytest.approx(0.3) and table.loc["dl2", "gain_vs_optimus"] == pytest.approx(0.125)
    assert table.loc["drf", "seed_sd"] == 0.0


def test_the_evaluation_summary_gives_the_ratio_to_the_capacity_bound_where_results_have_it():
    from dl2.learn.evaluate import summary_metrics, summary_table

    rows = [{"policy": "dl2", "seed": s, "trace": t, "avg_jct": j, "lower_bound": 5.0, "capacity_bound": c}
            for s, (a, b) in enumerate([(6.0, 8.0), (8.0, 10.0)]) for t, (j, c) in enumerate(((a, 5.0), (b, 7.0)))]
    with_capacity = pd.DataFrame(rows)
    table = summary_table(with_capacity).set_index("policy")
    assert table.loc["dl2", "capacity_bound"] == pytest.approx(6.0)
    assert table.loc["dl2", "ratio_to_capacity_bound"] == pytest.approx(8.0 / 6.0)
    assert summary_metrics(table.reset_index())["dl2"]["ratio_to_capacity_bound"] == pytest.approx(8.0 / 6.0, abs=1e-6)
    older = summary_metrics(summary_table(with_capacity.drop(columns="capacity_bound")))  # results published before it
    assert set(older["dl2"]) == {"avg_jct", "seed_sd", "seeds", "ratio_to_bound"}


PROJECT_FINETUNE = load_params()["finetune"]


@pytest.mark.parametrize("finetune, key", [({"runs": ["sl-rl", "best"]}, "finetune.runs"), ({"runs": []}, "finetune.runs"),
                                            ({"seeds": [0, 0]}, "finetune.seeds"), ({"seeds": 3}, "finetune.seeds"),
                                            ({"seed": 1}, "finetune.seed"), ({"lr": "fast"}, "finetune.lr"),
                                            ({"backend": "slurm"}, "finetune.backend"), ({"workers": -1}, "finetune.workers"),
                                            ({"gamma": None}, "finetune.gamma"), ({"speed": 2}, "finetune.speed")])
def test_a_bad_finetune_section_names_the_key(finetune, key):
    with pytest.raises(Dl2Error, match=f"params.yaml: {key}".replace(".", r"\.")):
        finetune_plan({**PROJECT_FINETUNE, **finetune}, "params.yaml")


def test_every_finetune_key_comes_from_params_yaml():
    for key in PROJECT_FINETUNE:
        with pytest.raises(Dl2Error, match=rf"params\.yaml: finetune\.{key} is missing"):
            finetune_plan({k: v for k, v in PROJECT_FINETUNE.items() if k != key}, "params.yaml")
    plan = finetune_plan({**PROJECT_FINETUNE, "runs": ["sl-rl", "rl-only"], "seeds": [3, 5], "lr": 0.001}, "params.yaml")
    assert (plan.runs, plan.seeds, plan.learner.lr) == (("sl-rl", "rl-only"), (3, 5), 0.001)
    assert model_name("sl-rl", 3) == "sl-rl-s3"


def test_each_learner_is_a_trainer_of_its_own():
    assert tuple(LEARNERS) == ALGORITHMS and all(issubclass(cls, Trainer) for cls in LEARNERS.values())
    assert len(set(LEARNERS.values())) == len(LEARNERS)


def test_each_learner_reads_only_its_own_keys_of_the_finetune_section():
    """One section holds every learner's keys (an ablation cell switches the learner with `algorithm`); each
    learner's settings hold the shared keys and its own, and the other learner's are still checked."""
    from dataclasses import fields

    from dl2.learn.settings import ActorCriticSettings, LearnerSettings

    names = {cls: {f.name for f in fields(cls)} for cls in (LearnerSettings, PPOSettings, ActorCriticSettings)}
    ppo, ac = names[PPOSettings] - names[LearnerSettings], names[ActorCriticSettings] - names[LearnerSettings]
    assert ppo == {"shaping", "gae_lambda", "clip", "ppo_epochs", "rollout_length"}
    assert ac == {"reward", "replay", "replay_size", "learn_start", "exploration", "learn_rule_actions", "epsilon"}
    assert set(PROJECT_FINETUNE) == names[LearnerSettings] | ppo | ac | {"algorithm", "runs", "seeds", "backend", "workers"}
    paper = finetune_plan({**PROJECT_FINETUNE, "algorithm": "actor-critic", "shaping": "off", "replay": "prioritized"},
                          "params.yaml").learner
    assert type(paper) is ActorCriticSettings and paper.algorithm == "actor-critic" and paper.replay == "prioritized"
    with pytest.raises(Dl2Error, match=r"params\.yaml: finetune\.clip: expected a number above 0"):  # PPO's key, checked all the same
        finetune_plan({**PROJECT_FINETUNE, "algorithm": "actor-critic", "shaping": "off", "clip": 0}, "params.yaml")
    with pytest.raises(Dl2Error, match=r"params\.yaml: finetune\.shaping: algorithm actor-critic does not shape rewards"):
        finetune_plan({**PROJECT_FINETUNE, "algorithm": "actor-critic"}, "params.yaml")
    with pytest.raises(Dl2Error, match=r"finetune\.runs: expected one of sl-rl, rl-only, offline-rl, got 'sl-only'"):
        finetune_plan({**PROJECT_FINETUNE, "runs": ["sl-only"]}, "params.yaml")  # an ablation cell's run only


def test_the_learning_settings_load_without_torch():
    code = ("import sys\n"
            "from dl2.stages import load_stage\n"
            "for name in ('pretrain', 'finetune', 'evaluate', 'ablate@learner'):\n"
            "    load_stage(name)\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("one_hot", [True, False])
def test_the_per_job_network_is_equivariant_to_the_jobs_order(one_hot):
    from dl2.learn.nets import policy_net, value_net

    torch.manual_seed(0)
    config = net_config("per-job", window=6, hidden=(16, 16), one_hot=one_hot)
    policy, value = DL2Policy(config, 8, assign_bundle=True), value_net(config)
    states = _random_states(np.random.default_rng(2), 16, 6, 8)
    states[:, :3, 0] = np.maximum(states[:, :3, 0], 1)  # at least three jobs in every window
    states[:, 3:] = 0
    order = [2, 0, 1, 3, 4, 5]
    x, xp = policy.inputs(states), policy.inputs(states[:, order])
    with torch.no_grad():
        logits, permuted = policy.net(x), policy.net(xp)
        torch.testing.assert_close(permuted[:, :-1].view(16, 6, 3), logits[:, :-1].view(16, 6, 3)[:, order])
        torch.testing.assert_close(permuted[:, -1], logits[:, -1])
        torch.testing.assert_close(value(xp), value(x))
    assert isinstance(policy_net(config), type(policy.net))
    with pytest.raises(Dl2Error, match="batch norm"):
        net_config("per-job", batch_norm=True)


def test_params_read_as_dvc_writes_them_keep_off_a_string(tmp_path):
    """`dvc exp run -S` rewrites params.yaml as YAML 1.2, where an unquoted `off` is a string, not false."""
    path = tmp_path / "params.yaml"
    text = yaml.safe_dump({"finetune": {**PROJECT_FINETUNE, "lr": 0.001}}).replace("'off'", "off")
    assert "replay: off" in text and "exploration: off" in text
    path.write_text(text)
    plan = finetune_plan(load_params(path)["finetune"], str(path))
    assert isinstance(plan.learner, PPOSettings) and plan.learner.lr == 0.001  # with replay and exploration off, as PPO needs


def test_prioritized_replay_corrects_mildly_as_the_authors_code_does():
    # the authors' exponent: 0.1, grown by 1e-4 per batch drawn; it reaches 1 only after 9000 batches
    assert importance_beta(0) == pytest.approx(0.1001) and importance_beta(199) == pytest.approx(0.12)
    assert importance_beta(8998) < 1.0 == importance_beta(8999) == importance_beta(20000)
    replay = Replay("prioritized", 512, window=2, num_features=NUM_FEATURES, num_actions=7)
    rng = np.random.default_rng(0)
    for reward in rng.exponential(1.0, 512) * 5:  # a few decisions paid far above the mean get high priority
        replay.add(np.zeros((2, NUM_FEATURES)), np.ones(7, bool), 0, reward, np.zeros((2, NUM_FEATURES)), np.ones(7, bool), False)
    replay.update(np.arange(512), rng.normal(0, 2, 512))
    _, early = replay.sample(256, rng, importance_beta(199))
    _, full = replay.sample(256, rng, 1.0)
    assert early.max() <= 1.0 and early.mean() > 0.5  # the gradient keeps half its size or more 200 updates in
    assert full.mean() < 0.1 * early.mean()  # where a schedule reaching 1 would shrink it tenfold and more


@pytest.mark.parametrize("learn_rule_actions", [True, False])
def test_the_rules_actions_teach_the_policy_only_when_asked(learn_rule_actions):
    train, validation = _traces(RL_SCENARIO, 4, seed=0), _traces(RL_SCENARIO, 2, seed=1)
    config = rl_config(updates=1, num_envs=2, lr=0.01, entropy=0.0, batch_size=64, replay="uniform", learn_start=64,
                       exploration="code", learn_rule_actions=learn_rule_actions, validate_every=100, checkpoint_every=100)
    trainer = make_trainer(_void_loving_policy(seed=0), train, validation, RL_SCENARIO, config, 0)
    while not trainer._round():  # decisions until an update is due
        pass
    r = trainer.replay
    assert r.by_rule[: r.size].any() and not r.by_rule[: r.size].all()  # the code rules replaced some sampled actions
    r.by_rule[: r.size] = True  # now every stored action is a rule's
    before = [p.detach().clone() for p in trainer.policy.net.parameters()]
    trainer._update()
    moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.net.parameters()))
    assert moved == learn_rule_actions  # without: no gradient from the rules' actions (and no entropy term here)
