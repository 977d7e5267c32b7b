"""Greedy decisions compiled (`dl2.learn.pollux.fast_greedy`) are torch's own: the same actions through a
whole run, logits within a small fraction of the margin, near ties and other networks asked of torch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from dl2.learn.pollux.demonstrations import teacher_decisions
from dl2.learn.pollux.fast_greedy import MARGIN, FastGreedy
from dl2.learn.pollux.features import encode, encode_row, encoded_size
from dl2.learn.pollux.model import PolluxNets, filled_slots, pollux_net_config
from dl2.learn.pollux.policy import DL2PolluxPolicy
from dl2.learn.pollux.pretrain import pretrain
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.pollux.apps import APP_NAMES
from dl2.pollux.cluster import simulate
from dl2.pollux.grid import Cell
from dl2.pollux.workload import read_workload
from dl2.workload.presets import PolluxPreset

PRESET = PolluxPreset("pollux", 16, 4, 60, 30)
SETTINGS = PolluxTrainSettings(window=6, hidden=(32, 32), train_seeds=(101,), sl_epochs=3, sl_batch_size=64, sl_lr=3e-3)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: weights depend on the thread count


@pytest.fixture(scope="module")
def workload():
    return read_workload(Cell("optimus", "1.0", 2, 0).path).first(10)


def _nets(workload, trained: bool, settings: PolluxTrainSettings = SETTINGS) -> PolluxNets:
    torch.manual_seed(3)
    nets = PolluxNets(pollux_net_config(settings))
    if trained:  # an imitation of Optimus+Oracle: decisive logits, as a trained policy's
        demonstrations = teacher_decisions([workload], PRESET, "optimus", settings.variant, settings.window, True)
        pretrain(nets, *demonstrations, settings, torch.Generator().manual_seed(3))
    return nets


def _run(workload, decide, assign_one: bool):
    actions = []

    def recorded(state, mask):
        actions.append(decide(state, mask))
        return actions[-1]

    run = simulate(workload, DL2PolluxPolicy(recorded, "tuned", SETTINGS.window, assign_one=assign_one), PRESET)
    return actions, run


@pytest.mark.parametrize("assign_one", [True, False])
def test_a_run_makes_torchs_decisions_and_the_same_jcts(workload, assign_one):
    nets = _nets(workload, True)
    fast = FastGreedy(nets)
    ours, run = _run(workload, fast, assign_one)
    def log_probs_argmax(state, mask):  # the most likely legal action, from the networks' batch computation
        return int(np.argmax(nets.log_probs(nets.inputs(state[None]), np.asarray(mask, dtype=bool)[None])[0]))

    theirs, reference = _run(workload, log_probs_argmax, assign_one)
    assert ours == theirs and np.array_equal(run.completion, reference.completion)
    assert fast.decisions == len(ours) > 100 and fast.asked_torch < 0.1 * len(ours), "the compiled pass decides most"


@pytest.mark.parametrize("hidden", [(32,), (32, 32), (32, 16, 8)])
def test_compiled_logits_are_torchs_within_a_hundredth_of_the_margin(workload, hidden):
    nets = _nets(workload, True, replace(SETTINGS, hidden=hidden))
    fast = FastGreedy(nets)
    states, _, _ = teacher_decisions([workload], PRESET, "optimus", "tuned", SETTINGS.window, True)
    with torch.no_grad():
        theirs = nets.policy(nets.inputs(states)).double().numpy()
    ours = np.stack([fast.logits(s) for s in states])
    empty = np.isnan(ours)  # the slots after the last filled one, which the compiled pass leaves out
    assert np.array_equal(empty[:, :-1], np.arange(SETTINGS.window) >= filled_slots(states)[:, None]) and not empty[:, -1].any()
    scale = np.maximum(1.0, np.abs(np.where(empty, 0.0, theirs)).max(-1, keepdims=True))
    assert (np.abs(ours - theirs)[~empty] / np.broadcast_to(scale, ours.shape)[~empty]).max() < MARGIN / 100


def test_a_near_tie_is_asked_of_torch(workload):
    nets = _nets(workload, False)
    with torch.no_grad():
        for p in nets.policy.parameters():
            p.zero_()  # every logit 0: each decision a tie, torch picks the first legal action
    fast = FastGreedy(nets)
    state = np.zeros((SETTINGS.window, 7))
    state[:3, 0] = [1, 2, 3]
    mask = np.array([False, True, True, False, False, False, True])
    assert fast(state, mask) == 1 == nets.greedy()(state, mask) and fast.asked_torch == 1


def test_another_network_is_asked_of_torch_every_time(workload):
    settings = replace(SETTINGS, network="paper")
    nets = _nets(workload, False, settings)
    fast = FastGreedy(nets)
    actions, _ = _run(workload.first(5), fast, True)
    assert not fast.supported and fast.asked_torch == fast.decisions == len(actions) > 0


def test_the_kept_rows_never_change_a_logit(workload):
    """Passes that reuse the previous state's rows give a fresh pass's logits exactly, in a run's order
    (one row changed a decision) and shuffled (every row changed)."""
    nets = _nets(workload, True)
    states, _, _ = teacher_decisions([workload], PRESET, "optimus", "tuned", SETTINGS.window, True)
    fresh = np.stack([FastGreedy(nets).logits(s) for s in states])
    kept = FastGreedy(nets)
    order = np.random.default_rng(0).permutation(len(states))
    assert np.array_equal(np.stack([kept.logits(s) for s in states]), fresh, equal_nan=True)
    assert np.array_equal(np.stack([kept.logits(s) for s in states[order]]), fresh[order], equal_nan=True)


def test_the_compiled_row_encoding_is_encodes(workload):
    states, _, _ = teacher_decisions([workload], PRESET, "optimus", "tuned", SETTINGS.window, True)
    rows = states.reshape(-1, states.shape[-1])
    out = np.empty((len(rows), encoded_size(1)))
    for row, inputs in zip(rows, out):
        encode_row(row, len(APP_NAMES), inputs)
    assert np.array_equal(out, encode(rows[:, None]).astype(np.float64))
