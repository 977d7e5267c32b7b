"""Metrics: JCT statistics, utilization, churn, the lower bound and its schedule's demand."""

import numpy as np
import pytest
from conftest import tiny_preset

from dl2.backends.sim import simulate
from dl2.metrics import bound_demand, job_table, lower_bound_jct, slot_table, summarize
from dl2.sim.scenario import Scenario, SimOptions
from dl2.workload.catalog import load_catalog
from dl2.workload.traces import Trace


def _one_job(epochs=1000.0, fine=True):
    scenario = Scenario(tiny_preset(num_nodes=2, max_tasks=2), SimOptions(fine_grained_jct=fine))
    trace = Trace(np.array([1]), np.array([3]), np.array([0]), np.array([epochs]), load_catalog().names)
    return scenario, trace


def test_a_job_alone_at_its_best_configuration_meets_the_bound():
    scenario, trace = _one_job()
    table = scenario.table
    best = table[0, 1:3, 1:3].max()
    assert lower_bound_jct(trace, scenario)[0] == pytest.approx(1000.0 / best)
    # FIFO gives the lone job 2 bundles, its best configuration here when (2, 2) is the fastest
    result = simulate(trace, "fifo", scenario)
    if table[0, 2, 2] == best:
        assert result.jct[0] == pytest.approx(1000.0 / best)
    assert result.jct[0] >= lower_bound_jct(trace, scenario)[0] - 1e-12


def test_the_bound_schedule_holds_each_job_at_its_best_allocation_from_arrival_to_its_bound():
    scenario, one = _one_job()
    alone = bound_demand(one, scenario)
    arrival, end = one.arrival[0], int(np.ceil(one.arrival[0] + lower_bound_jct(one, scenario)[0]))
    assert len(alone) == end > arrival + 1 and not alone[:arrival].any()
    assert np.all(alone[arrival:] == alone[arrival]) and 0.0 < alone[arrival] <= 1.0  # it fits the empty cluster
    two = Trace(np.array([1, 2]), np.array([arrival, arrival]), np.array([0, 0]), np.array([1000.0, 1000.0]), one.model_names)
    assert bound_demand(two, scenario) == pytest.approx(2 * alone)


def test_the_bound_is_within_reach_on_paper_and_not_on_dev():
    from dl2.workload.presets import get_preset
    from dl2.workload.traces import generate_trace

    for name, reachable in (("paper", True), ("dev", False)):
        scenario = Scenario(get_preset(name))
        demand = np.concatenate([bound_demand(generate_trace(scenario.preset, scenario.catalog, seed), scenario)
                                 for seed in range(3)])
        assert (demand.max() <= 1.0) == reachable, name


def test_integer_bound_rounds_up():
    scenario, trace = _one_job(fine=False)
    fine_scenario, _ = _one_job()
    assert lower_bound_jct(trace, scenario)[0] == np.ceil(lower_bound_jct(trace, fine_scenario)[0])


def test_summary_tables_and_utilization(paper):
    from dl2.workload.traces import generate_trace

    trace = generate_trace(paper.preset, paper.catalog, 0)
    result = simulate(trace, "drf", paper)
    s = summarize(result, paper)
    jct = result.jct
    assert s["avg_jct"] == pytest.approx(jct.mean())
    assert s["median_jct"] <= s["p95_jct"] <= s["p99_jct"] <= jct.max()
    assert s["makespan"] == pytest.approx((result.end + 1).max())
    assert s["ratio_to_lower_bound"] >= 1
    slots = slot_table(result)
    assert len(slots) == result.num_slots
    assert slots.cpu_util.between(0, 1).all() and slots.gpu_util.between(0, 1).all()
    assert slots.task_changes.iloc[0] > 0 and slots.task_changes.iloc[0] % 2 == 0  # DRF places bundles
    jobs = job_table(result, paper)
    assert list(jobs.job_id) == list(trace.job_id)
    assert (jobs.jct >= jobs.jct_lower_bound - 1e-9).all()
