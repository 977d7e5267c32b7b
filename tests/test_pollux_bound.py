"""The Pollux world's lower bound (`dl2.pollux.bound`): no job of any policy's run completes before it, and it
is each job's wait for the first interval, its first restart and its training alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from dl2.paths import repo_root
from dl2.pollux import bound
from dl2.pollux.cluster import simulate
from dl2.pollux.grid import Cell
from dl2.pollux.policies import make_policy
from dl2.pollux.workload import Workload, read_workload
from dl2.workload.presets import get_preset

PRESET = get_preset("pollux")


def test_no_job_of_any_published_run_completes_before_its_bound():
    """Every job of the published grid: Optimus+Oracle, Tiresias and Pollux (3 seeds) on 8 workloads at 4 loads."""
    jobs = pd.read_csv(repo_root() / "data/published/pollux/jobs.csv")
    checked = 0
    for (policy, load, workload, seed), run in jobs.groupby(["policy", "load", "workload", "seed"]):
        jobs_of = read_workload(Cell(policy, f"{load:.1f}", workload, seed).path)
        index = {name: k for k, name in enumerate(jobs_of.name)}
        rows = np.array([index[name] for name in run.name])
        jct = run.completion.to_numpy() - jobs_of.time[rows]
        assert (jct >= bound.lower_bound_jct(jobs_of, PRESET)[rows]).all(), (policy, load, workload, seed)
        checked += len(run)
    assert checked == 32000


@pytest.mark.parametrize("policy", ["optimus", "tiresias", pytest.param("pollux", marks=pytest.mark.slow)])
def test_no_job_completes_before_its_bound_on_a_smaller_cluster(policy):
    """The bound follows the cluster: on 4 nodes, today's code, each built-in policy."""
    preset = dataclasses.replace(PRESET, num_nodes=4)
    jobs = read_workload(Cell(policy, "1.0", 3, 0).path).first(24)
    run = simulate(jobs, make_policy(policy, 0), preset)
    assert (run.jct >= bound.lower_bound_jct(jobs, preset)).all()


def test_a_job_waits_for_the_first_interval_after_its_submission_and_restarts_once():
    apps = np.array([1, 1, 1, 1])
    jobs = Workload(("a", "b", "c", "d"), np.array([0, 59, 60, 61]), apps, np.ones(4, np.int64), np.full(4, 128))
    lb = bound.lower_bound_jct(jobs, PRESET)
    training = lb[0] - PRESET.interval_seconds - PRESET.restart_seconds
    assert training > 0
    np.testing.assert_allclose(lb - training - PRESET.restart_seconds, [60, 1, 0, 59])


def test_a_bigger_cluster_never_raises_the_bound():
    jobs = read_workload(Cell("optimus", "1.0", 1, 0).path).first(40)
    small = bound.lower_bound_jct(jobs, dataclasses.replace(PRESET, num_nodes=2))
    assert (bound.lower_bound_jct(jobs, PRESET) <= small + 1e-9).all()


def test_simulate_reports_the_bound_beside_the_average_jct(tmp_path, capsys):
    import json

    from dl2.cli import main
    from dl2.pollux.workload import write_workload

    path = tmp_path / "w.csv"
    write_workload(read_workload(Cell("optimus", "0.5", 2, 0).path).first(10), path)
    assert main(["simulate", "--preset", "pollux", "--policy", "tiresias", "--trace", str(path)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["lower_bound_avg_jct"] > 0
    assert answer["ratio_to_lower_bound"] == pytest.approx(answer["avg_jct"] / answer["lower_bound_avg_jct"])
    assert answer["ratio_to_lower_bound"] >= 1
