"""The capacity-aware lower bound (`dl2.capacity_bound`): never above any schedule's average JCT, never below the
contention-free bound, the same number bit for bit on the same input, and clear errors on bad input."""

import dataclasses

import numpy as np
import pytest
import torch
from conftest import tiny_preset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from dl2.bound_tightness import PriorityGreedy, best_found
from dl2.capacity_bound import best_speeds, capacity_bound, useful_configs
from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy
from dl2.learn.architecture import net_config
from dl2.learn.rollout import run_policy
from dl2.metrics import _best_allocations, _fits_alone, lower_bound_jct
from dl2.schedulers import policy_names
from dl2.schedulers.builtin import simulate_builtin
from dl2.sim.scenario import Scenario, SimOptions
from dl2.workload.catalog import load_catalog
from dl2.workload.presets import get_preset
from dl2.workload.traces import Trace, generate_trace


def lower_bound_speed(scenario: Scenario, model: int) -> float:
    """The contention-free bound's speed for `model`: its fastest config that fits the empty cluster."""
    return float(_best_allocations(scenario)[0][model])


MODELS = load_catalog("public_release").names
SLACK = 1e-7  # the LP solver's tolerances


@st.composite
def cases(draw):
    """A random small cluster and trace, fine-grained or whole-slot JCT, with or without a restart cost."""
    n = draw(st.integers(1, 8))
    arrivals = sorted(draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)))
    models = draw(st.lists(st.integers(0, len(MODELS) - 1), min_size=n, max_size=n))
    epochs = draw(st.lists(st.floats(1.0, 3000.0), min_size=n, max_size=n))
    ids = draw(st.permutations(range(1, n + 1)))
    trace = Trace(np.array(ids, dtype=np.int64), np.array(arrivals, dtype=np.int64), np.array(models, dtype=np.int64),
                  np.array(epochs), MODELS)
    preset = dataclasses.replace(tiny_preset(draw(st.integers(1, 4)), draw(st.integers(1, 3))),
                                 restart_seconds=draw(st.sampled_from([0.0, 300.0])))
    return Scenario(preset, SimOptions(fine_grained_jct=draw(st.booleans()))), trace


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_schedule_beats_the_bound_and_it_is_above_the_contention_free_one(case):
    scenario, trace = case
    bound = capacity_bound(trace, scenario)
    assert bound.avg_jct == pytest.approx(bound.per_job.mean())
    assert (bound.per_job >= lower_bound_jct(trace, scenario) - SLACK).all()  # per job, so on average too
    for policy in policy_names():
        assert simulate_builtin(trace, policy, scenario).jct.mean() >= bound.avg_jct - SLACK, policy
    torch.manual_seed(0)
    p = scenario.preset
    untrained = DL2Policy(net_config("per-job", hidden=(16, 16), window=4), p.max_tasks, assign_bundle=False)
    for greedy in (True, False):
        assert run_policy(untrained, [trace], scenario, greedy=greedy).avg_jct[0] >= bound.avg_jct - SLACK


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_the_best_schedule_a_search_finds_is_above_the_bound(case):
    scenario, trace = case
    found = best_found(trace, scenario, evaluations=12, seed=0)
    assert found["search_avg_jct"] >= capacity_bound(trace, scenario).avg_jct - SLACK


def test_the_bound_is_deterministic_and_tighter_than_running_alone_under_contention():
    scenario = Scenario(dataclasses.replace(get_preset("paper"), num_nodes=4))
    trace = generate_trace(scenario.preset, scenario.catalog, 3)
    first, second = capacity_bound(trace, scenario), capacity_bound(trace, scenario)
    assert first.avg_jct == second.avg_jct and np.array_equal(first.per_job, second.per_job)
    assert first.variables > 0 and first.solve_seconds > 0
    assert first.avg_jct > 1.5 * lower_bound_jct(trace, scenario).mean()  # 4 nodes for 60 jobs: waiting counts
    assert simulate_builtin(trace, "optimus", scenario).jct.mean() >= first.avg_jct


def test_a_job_alone_gets_its_contention_free_jct_plus_its_start():
    preset = tiny_preset(2, 2)
    trace = Trace(np.array([7]), np.array([3]), np.array([0]), np.array([500.0]), MODELS)
    for restart, fine in ((0.0, True), (0.0, False), (600.0, True)):
        scenario = Scenario(dataclasses.replace(preset, restart_seconds=restart), SimOptions(fine_grained_jct=fine))
        alone = lower_bound_jct(trace, scenario)[0] + scenario.restart_fraction
        expected = alone if fine else np.ceil(alone)
        assert capacity_bound(trace, scenario).per_job[0] == pytest.approx(expected, rel=1e-9)
        assert simulate_builtin(trace, "optimus", scenario).jct[0] >= expected - SLACK


@pytest.mark.parametrize("preset", ["paper", "dev"])
def test_useful_configs_keep_the_fastest_and_every_dropped_one_is_beaten_by_a_mix_of_them(preset):
    scenario = Scenario(get_preset(preset))
    p, c, table = scenario.preset, scenario.catalog, scenario.true_table
    for m in range(c.num_models):
        kept = useful_configs(scenario, m)
        assert kept.speed.max() == best_speeds(scenario)[m] == lower_bound_speed(scenario, m)
        held = np.column_stack([kept.demand, kept.speed])
        for ps in range(1, p.max_tasks + 1):
            for workers in range(1, p.max_tasks + 1):
                demand = ps * c.ps_demand[m] + workers * c.worker_demand[m]
                if not _fits_alone(p.num_nodes, (p.node_cpu, p.node_gpu), c.worker_demand[m], c.ps_demand[m], ps, workers):
                    continue
                mix = linprog(-held[:, 2], A_ub=np.vstack([np.ones(len(held)), held[:, :2].T]), b_ub=np.r_[1.0, demand],
                              bounds=(0, None), method="highs")  # the fastest mix of kept configs within its resources
                assert -mix.fun >= table[m, ps, workers] * (1 - 1e-9), (c.names[m], ps, workers)


def test_priority_greedy_replays_in_the_simulator_and_never_beats_the_bound():
    scenario = Scenario(tiny_preset(2, 3))
    trace = Trace(np.array([1, 2, 3]), np.array([0, 0, 1]), np.array([0, 1, 2]), np.array([800.0, 400.0, 1200.0]), MODELS)
    configs = {m: useful_configs(scenario, m) for m in range(scenario.catalog.num_models)}
    fallback = {m: [(int(c.ps[k]), int(c.workers[k])) for k in np.argsort(-c.speed)] for m, c in configs.items()}
    from dl2.backends.sim import simulate
    result = simulate(trace, PriorityGreedy([3, 1, 2], {j: fallback[int(m)][0] for j, m in zip([1, 2, 3], trace.model)}, fallback),
                      scenario)
    assert np.isfinite(result.jct).all()
    assert result.jct.mean() >= capacity_bound(trace, scenario).avg_jct - SLACK


def test_bad_input_is_a_clear_error():
    scenario = Scenario(tiny_preset())
    empty = Trace(*(np.array([], dtype=np.int64) for _ in range(3)), np.array([]), MODELS)
    with pytest.raises(Dl2Error, match="no jobs"):
        capacity_bound(empty, scenario)
    other = Trace(np.array([1]), np.array([0]), np.array([0]), np.array([10.0]), ("resnet-50", "vgg-16"))
    with pytest.raises(Dl2Error, match="trace t9 .*different model catalog"):
        capacity_bound(other, scenario, label="t9")


def test_evaluate_reports_each_trace_s_capacity_bound_beside_the_contention_free_one():
    from dl2.learn.evaluate import evaluate

    scenario = Scenario(tiny_preset(2, 2))
    traces = [generate_trace(scenario.preset, scenario.catalog, s) for s in (1, 2)]
    results = evaluate({}, ["drf", "optimus"], traces, scenario)
    for t, trace in enumerate(traces):
        rows = results[results.trace == t]
        assert (rows.capacity_bound == capacity_bound(trace, scenario).avg_jct).all()
        assert (rows.ratio_to_capacity_bound == rows.avg_jct / rows.capacity_bound).all()
        assert (rows.lower_bound <= rows.capacity_bound + SLACK).all() and (rows.ratio_to_capacity_bound >= 1 - SLACK).all()
