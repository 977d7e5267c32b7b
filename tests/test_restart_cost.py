"""The PS/worker simulator's restart cost (preset key `restart_seconds`): a job that starts a new (PS, workers)
configuration trains only the rest of that slot, on every path through the simulator."""

import dataclasses

import numpy as np
import pytest
import torch
from conftest import run_by_hand, tiny_preset
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2.backends import loop
from dl2.backends.sim import SimulatedCluster, simulate
from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy, DL2Scheduler
from dl2.learn.architecture import net_config
from dl2.learn.env import BackendEnv, DecisionEnv
from dl2.learn.rollout import run_policy
from dl2.schedulers.builtin import BuiltinScheduler, simulate_builtin
from dl2.sim import engine
from dl2.sim.scenario import Scenario, SimOptions
from dl2.sim.state import make_jobs
from dl2.workload.presets import get_preset, presets_from
from dl2.workload.traces import generate_trace

HEURISTICS = ("fifo", "srtf", "drf", "tetris", "optimus")
TEN_PER_WORKER = lambda p, w: 10.0 * w  # noqa: E731  epochs per slot


def _one_job(epochs: float) -> tuple:
    """One job of model 0 arriving at slot 0, and a table of 10 epochs per worker per slot."""
    jobs = make_jobs(np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([1]), np.array([epochs]),
                     np.array([[2, 4]]), np.array([[2, 0]]))
    jobs.active[0] = True
    table = np.zeros((1, 4, 4))
    table[0, 1:, 1:] = 10.0 * np.arange(1, 4)[None, :]
    return jobs, table


def _train(jobs, table, configs, lost: float, fine_grained: bool = True) -> tuple[list[float], np.ndarray]:
    """Run `advance` with the job at (PS, workers) `configs[slot]`; the slots' rewards, and [workers, PS] it
    trained with last."""
    rewards, trained = [], engine.no_training(1)
    for slot, (ps, workers) in enumerate(configs):
        jobs.ps[0], jobs.workers[0] = ps, workers
        rewards.append(engine.advance(jobs, table, slot, fine_grained, (lost, lost), trained)[1])
    return rewards, trained


def _with_restart(preset, seconds: float):
    return dataclasses.replace(preset, restart_seconds=seconds)


def _traces(scenario, n, seed):
    return [generate_trace(scenario.preset, scenario.catalog, s) for s in np.random.SeedSequence(seed).spawn(n)]


def test_a_job_resized_once_pays_at_its_start_and_at_its_resize():
    # 45 epochs, a quarter of a slot lost per new configuration: (2, 2) trains 15 then 20, the resize to
    # (1, 1) trains 7.5, and the last 2.5 epochs take a quarter of slot 3: it ends at 2.25 (JCT 3.25).
    # Without the cost: 20, 20, then 5 of 10 in slot 2: it ends at 1.5 (JCT 2.5).
    configs = [(2, 2), (2, 2), (1, 1), (1, 1), (1, 1)]
    jobs, table = _one_job(45.0)
    rewards, _ = _train(jobs, table, configs, 0.25)
    assert jobs.end[0] == pytest.approx(2.25)
    np.testing.assert_allclose(rewards, np.array([15.0, 20.0, 7.5, 2.5, 0.0]) / 45.0)
    jobs, table = _one_job(45.0)
    _train(jobs, table, configs, 0.0)
    assert jobs.end[0] == pytest.approx(1.5)


def test_a_job_that_completes_in_a_restart_slot_ends_after_the_lost_part():
    # 20 epochs: (2, 2) trains 15, then (1, 1) would train 7.5 after the lost quarter and needs 5 of them
    # (two thirds of the rest): it ends at 0 + 0.25 + 0.75 * 2/3 = 0.75.
    jobs, table = _one_job(20.0)
    _train(jobs, table, [(2, 2), (1, 1)], 0.25)
    assert jobs.end[0] == pytest.approx(0.75)
    jobs, table = _one_job(20.0)
    _train(jobs, table, [(2, 2), (1, 1)], 0.25, fine_grained=False)
    assert jobs.end[0] == 1.0  # whole slots: the slot it completes in


def test_a_job_that_pauses_pays_again_and_a_whole_lost_slot_trains_nothing():
    jobs, table = _one_job(100.0)
    rewards, trained = _train(jobs, table, [(1, 1), (0, 1), (1, 1), (1, 1)], 0.5)  # a worker without a PS does not train
    np.testing.assert_allclose(rewards, np.array([5.0, 0.0, 5.0, 10.0]) / 100.0)
    assert trained.tolist() == [[1, 1]]
    jobs, table = _one_job(100.0)
    rewards, _ = _train(jobs, table, [(1, 1), (1, 2), (1, 2)], 1.0)
    np.testing.assert_allclose(rewards, np.array([0.0, 0.0, 20.0]) / 100.0)


def test_jobs_that_never_change_pay_once_at_their_start():
    # FIFO on 2 nodes gives each of the two jobs 2 bundles in every slot: each JCT grows by the lost fraction.
    for lost in (0.1, 0.25, 0.5):
        np.testing.assert_allclose(run_by_hand("fifo", [0, 0], [25, 40], TEN_PER_WORKER, lost=lost),
                                   run_by_hand("fifo", [0, 0], [25, 40], TEN_PER_WORKER) + lost, rtol=1e-12)


@pytest.mark.parametrize("preset", [tiny_preset(2, 2, 6), tiny_preset(3, 3, 10), get_preset("dev")], ids=["2n2t", "3n3t", "dev"])
def test_the_compiled_heuristics_and_the_stepwise_backend_agree(preset):
    scenario = Scenario(_with_restart(preset, 0.3 * preset.slot_seconds))
    for trace in _traces(scenario, 2, seed=11):
        for name in HEURISTICS:
            compiled = simulate_builtin(trace, name, scenario)
            backend = SimulatedCluster(trace, scenario)
            loop.run(backend, BuiltinScheduler(name))
            stepwise = np.array([backend.jct()[int(i)] for i in trace.job_id])
            np.testing.assert_array_equal(stepwise, compiled.jct)
            np.testing.assert_array_equal(np.array(backend.stats), compiled.stats)


@pytest.mark.parametrize("assign_bundle", [False, True])
def test_the_decision_environments_pay_the_restarts_alike(assign_bundle):
    """The compiled environment and the backend environment over the simulator: the same rewards, each
    slot's per-job shares summing to it, and progress paid once in all."""
    preset = _with_restart(tiny_preset(3, 3, 10), 400.0)
    scenario = Scenario(preset, SimOptions(assign_bundle=assign_bundle, max_slots=2000))
    trace = _traces(scenario, 1, seed=21)[0]
    fast = DecisionEnv([trace], scenario, window=6)
    generic = BackendEnv([trace], scenario, 6, 0, open_backend=lambda t: SimulatedCluster(t, scenario))
    (fs, fi), (gs, gi) = fast.reset(), generic.reset()
    rng = np.random.default_rng(5)
    paid = 0.0
    for _ in range(100_000):
        np.testing.assert_array_equal(fs, gs)
        assert fast.potential(scenario.table) == generic.potential(scenario.table)
        legal = np.flatnonzero(fi["mask"])
        action = int(rng.choice(legal)) if rng.random() < 0.8 else 3 * fast.window
        fs, fr, ft, ftr, fi = fast.step(action)
        gs, gr, gt, gtr, gi = generic.step(action)
        assert (ft, ftr, fi["slot_end"], fr) == (gt, gtr, gi["slot_end"], gr)
        if fi["slot_end"]:
            assert fast.job_reward.sum() == pytest.approx(fr, rel=1e-12)
        paid += fr
        if ft:
            np.testing.assert_array_equal(fi["jct"], gi["jct"])
            break
    else:
        pytest.fail("the trace did not finish")
    assert paid <= len(trace) + 1e-9  # slots that ran without a decision paid the rest


def test_dl2_greedy_is_the_same_through_the_scheduler_and_the_compiled_rollout():
    scenario = Scenario(_with_restart(tiny_preset(3, 3, 10), 500.0), SimOptions(assign_bundle=True, max_slots=5000))
    torch.manual_seed(1)
    policy = DL2Policy(net_config("paper", hidden=(32, 32), window=8), scenario.preset.max_tasks, True)
    for trace in _traces(scenario, 2, seed=10):
        via_scheduler = simulate(trace, DL2Scheduler(policy, greedy=True), scenario).jct.mean()
        assert via_scheduler == run_policy(policy, [trace], scenario, greedy=True).avg_jct[0]


def test_no_restart_cost_is_the_preset_without_the_key():
    dev = get_preset("dev")
    assert dev.restart_seconds == 0.0 and "restart_seconds" not in repr(dev)  # digests of presets without it stay
    assert "restart_seconds=60.0" in repr(_with_restart(dev, 60.0))
    zero = Scenario(_with_restart(dev, 0.0))
    assert zero.restart_fraction == 0.0
    trace = _traces(zero, 1, seed=2)[0]
    for name in HEURISTICS:
        np.testing.assert_array_equal(simulate_builtin(trace, name, zero).jct, simulate_builtin(trace, name, Scenario(dev)).jct)


@pytest.mark.parametrize("name", ["fifo", "srtf", "drf", "tetris"])
def test_the_heuristics_average_jct_grows_with_the_restart_cost_on_dev(name):
    """On these traces; not a law for a policy that reacts to progress: Optimus, which does, finishes dev's
    first trace of seed 3 sooner with 10% of a slot lost than with 5%."""
    dev = get_preset("dev")
    traces = _traces(Scenario(dev), 3, seed=3)
    for trace in traces:
        jct = [simulate_builtin(trace, name, Scenario(_with_restart(dev, f * dev.slot_seconds))).jct.mean()
               for f in (0.0, 0.05, 0.1, 0.25, 0.5, 0.9)]
        assert np.all(np.diff(jct) >= 0) and jct[-1] > jct[0], jct


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=30),
       st.floats(1.0, 300.0), st.lists(st.floats(0.0, 1.0), min_size=2, max_size=4, unique=True))
def test_a_fixed_schedule_finishes_no_sooner_with_a_larger_restart_cost(configs, epochs, fractions):
    ends, progress = [], []
    for lost in sorted(fractions):
        jobs, table = _one_job(epochs)
        _train(jobs, table, configs, lost)
        ends.append(jobs.end[0] if np.isfinite(jobs.end[0]) else np.inf)
        progress.append(jobs.progress[0])
    assert all(a <= b for a, b in zip(ends, ends[1:]))
    assert all(a >= b - 1e-9 for a, b in zip(progress, progress[1:]))


@pytest.mark.parametrize("value", [-1, -0.5, "soon", None, True])
def test_a_bad_restart_cost_is_refused_naming_the_key(value):
    spec = dict(num_nodes=2, num_jobs=3, max_arrivals=1, max_epochs=10, max_tasks=2, speed_table="public_release",
                bucket_to_model=False, restart_seconds=value)
    with pytest.raises(Dl2Error, match=r"params\.yaml: presets\.mine\.restart_seconds"):
        presets_from({"presets": {"mine": spec}}, "params.yaml")
    spec["restart_seconds"] = 45
    assert presets_from({"presets": {"mine": spec}}, "params.yaml")["mine"].restart_seconds == 45.0


def test_a_shrink_pays_the_rejoin_cost_and_a_grow_the_restart_cost():
    # 10 epochs per worker per slot. (1, 2) starts: restart 0.5 -> 10; keeps: 20; shrinks to (1, 1): rejoin 0.1
    # -> 9; grows to (1, 2): restart -> 10; drops a worker and adds a PS (2, 1): it adds a task, restart -> 5.
    jobs, table = _one_job(1000.0)
    rewards, trained = [], engine.no_training(1)
    for slot, (ps, workers) in enumerate([(1, 2), (1, 2), (1, 1), (1, 2), (2, 1)]):
        jobs.ps[0], jobs.workers[0] = ps, workers
        rewards.append(engine.advance(jobs, table, slot, True, (0.5, 0.1), trained)[1])
    np.testing.assert_allclose(np.array(rewards) * 1000.0, [10.0, 20.0, 9.0, 10.0, 5.0])


def test_a_rejoin_cost_alone_charges_only_shrinks():
    jobs, table = _one_job(1000.0)
    rewards, trained = [], engine.no_training(1)
    for slot, (ps, workers) in enumerate([(2, 3), (1, 3), (1, 1), (0, 1), (1, 1)]):
        jobs.ps[0], jobs.workers[0] = ps, workers
        rewards.append(engine.advance(jobs, table, slot, True, (0.0, 0.25), trained)[1])
    np.testing.assert_allclose(np.array(rewards) * 1000.0, [30.0, 22.5, 7.5, 0.0, 10.0])  # after a pause: a start


def test_the_rejoin_cost_is_the_restart_cost_unless_the_preset_sets_it():
    dev = get_preset("dev")
    assert dev.rejoin_seconds is None and "rejoin_seconds" not in repr(dev)
    assert Scenario(_with_restart(dev, 600.0)).lost == (0.5, 0.5)
    rejoin = dataclasses.replace(dev, restart_seconds=600.0, rejoin_seconds=120.0)
    assert Scenario(rejoin).lost == (0.5, 0.1) and "rejoin_seconds=120.0" in repr(rejoin)
    assert Scenario(dataclasses.replace(dev, rejoin_seconds=0.0)).lost == (0.0, 0.0)
    spec = dict(num_nodes=2, num_jobs=3, max_arrivals=1, max_epochs=10, max_tasks=2, speed_table="public_release",
                bucket_to_model=False, rejoin_seconds=-1)
    with pytest.raises(Dl2Error, match=r"params\.yaml: presets\.mine\.rejoin_seconds"):
        presets_from({"presets": {"mine": spec}}, "params.yaml")


@pytest.mark.parametrize("name", HEURISTICS)
def test_a_cheaper_rejoin_agrees_between_the_compiled_heuristics_and_the_stepwise_backend(name):
    preset = dataclasses.replace(tiny_preset(3, 3, 10), restart_seconds=400.0, rejoin_seconds=40.0)
    scenario = Scenario(preset)
    trace = _traces(scenario, 1, seed=12)[0]
    compiled = simulate_builtin(trace, name, scenario)
    backend = SimulatedCluster(trace, scenario)
    loop.run(backend, BuiltinScheduler(name))
    np.testing.assert_array_equal(np.array([backend.jct()[int(i)] for i in trace.job_id]), compiled.jct)
