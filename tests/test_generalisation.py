"""Generalisation: trained policies replayed on traces moved away from their training distribution."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import learn_settings

from dl2.errors import Dl2Error
from dl2.learn import generalisation, workflow
from dl2.learn.agent import DL2Policy
from dl2.learn.rollout import run_policy
from dl2.schedulers.builtin import simulate_builtin
from dl2.stages import load_stage
from dl2.workload.presets import get_preset


@pytest.fixture(scope="module")
def world():
    settings = learn_settings(train_traces=2, validation_traces=2)
    measured = workflow.scenario(settings)
    _, validation = workflow.split_traces(settings, measured)
    return settings, measured, validation


def test_a_load_factor_moves_arrivals_and_keeps_the_jobs(world):
    _, _, validation = world
    trace = validation[0]
    fast, slow = generalisation.with_load(trace, 2.0), generalisation.with_load(trace, 0.5)
    assert (fast.arrival == trace.arrival // 2).all() and (slow.arrival == trace.arrival * 2).all()
    for moved in (fast, slow):
        assert (moved.model == trace.model).all() and (moved.num_epochs == trace.num_epochs).all()


def test_shifts_leave_out_the_training_distribution_and_refuse_bad_values(world):
    settings, _, _ = world
    names = [s.name for s in generalisation.shifts(["ali", "google"], [1.0, 2.0], [get_preset("paper"), get_preset("dev")], settings)]
    assert names == ["own", "arrivals-google", "load-200pct", "cluster-dev"]  # ali, 1x and paper are its own
    assert all(re.fullmatch(r"[a-z0-9-]+", name) for name in names)  # DVC metric keys, MLflow metric names
    with pytest.raises(Dl2Error, match="arrivals"):
        generalisation.shifts(["weekly"], [], [], settings)
    with pytest.raises(Dl2Error, match="loads"):
        generalisation.shifts([], [0.0], [], settings)


def test_every_shift_is_played_by_every_policy_on_traces_of_its_own(world):
    settings, measured, validation = world
    policy = DL2Policy(workflow.network(settings), measured.preset.max_tasks, settings.assign_bundle)
    shift_list = generalisation.shifts(["google"], [2.0], [get_preset("dev")], settings)
    seeds = workflow.validation_seeds(settings)
    results = generalisation.evaluate_shifts({"dl2": {3: policy}}, generalisation.HEURISTICS, shift_list, settings,
                                             validation, seeds, measured)
    assert len(results) == len(shift_list) * 3 * len(validation)
    own = results[results["shift"] == "own"]
    # the unshifted rows are the validation results themselves
    assert own[own.policy == "dl2"].avg_jct.tolist() == run_policy(policy, validation, measured, greedy=True).avg_jct.tolist()
    assert own[own.policy == "optimus"].avg_jct.tolist() == [simulate_builtin(t, "optimus", measured).jct.mean() for t in validation]
    dev = results[results["shift"] == "cluster-dev"]
    traces, sc = generalisation.shifted_world(shift_list[-1], settings, validation, seeds, measured)
    assert sc.preset.num_nodes == 48 and sc.preset.max_tasks == measured.preset.max_tasks  # its size, the policy's limits
    assert dev[dev.policy == "drf"].avg_jct.tolist() == [simulate_builtin(t, "drf", sc).jct.mean() for t in traces]
    assert np.isfinite(results.avg_jct).all() and (results.avg_jct >= results.lower_bound - 1e-9).all()
    table = generalisation.shift_table(results)
    assert (table[table.policy == "optimus"].gain_vs_optimus == 0).all()
    metrics = generalisation.shift_metrics(table)
    assert set(metrics) == {s.name for s in shift_list} and set(metrics["own"]) == {"drf", "optimus", "dl2"}


def test_an_unknown_shift_cluster_names_the_key():
    with pytest.raises(Dl2Error, match="evaluate.shift_clusters"):
        load_stage("evaluate", None, {"evaluate": {"shift_clusters": ["nowhere"]}})
