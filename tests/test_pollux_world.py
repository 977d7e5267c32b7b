"""The Pollux world: its job model against the artifact's, the deterministic baselines cell for cell, Pollux's
own machinery (model fit, search, repair), the workload format, and the world behind dl2's commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2 import cli
from dl2.errors import Dl2Error
from dl2.paths import repo_root
from dl2.pollux import grid, kernels
from dl2.pollux.apps import APP_NAMES, app_tables, artifact_float, barycentric_transforms, load_applications
from dl2.pollux.cluster import ClusterView, simulate
from dl2.pollux.perf_model import _Measurements, fit_perf_params
from dl2.pollux.policies import make_policy
from dl2.pollux.policies.nsga2 import repair
from dl2.pollux.policies.pollux import Pollux
from dl2.pollux.workload import Workload, read_workload
from dl2.workload.presets import PolluxPreset, get_preset

PROBES = json.loads((Path(__file__).parent / "data" / "pollux_artifact_probes.json").read_text())
PRESET = PolluxPreset("pollux", 16, 4, 60, 30)
APPS = load_applications()


def tables(name: str):
    return APPS[APP_NAMES.index(name)].tables


def test_numbers_are_read_as_the_artifacts_csv_reader_read_them():
    # what pandas 1.5's read_csv gives (checked with it): 17 significant digits, a leading zero counted (the last
    # digit of the first is dropped), then a division by a power of ten (not correctly rounded)
    assert artifact_float("0.07654820203781128") == 0.0765482020378112 != float("0.07654820203781128")
    assert artifact_float("9.811291501041085e-05") == 9.811291501041084e-05 != float("9.811291501041085e-05")
    assert artifact_float("-12.5") == -12.5 and artifact_float("3") == 3.0


@pytest.mark.parametrize("app", APP_NAMES)
def test_throughput_equals_the_artifacts_on_measured_and_interpolated_placements(app):
    probes = [p for p in PROBES["throughput"] if p[0] == app]
    assert any(len(p[1]) > 4 for p in probes)  # beyond the measured placements: the triangulation
    for _, counts, local_bsz, step, sync in probes:
        got = kernels.throughput(tables(app), np.array(counts, dtype=np.int64), float(local_bsz))
        if kernels.placement_id(np.array(counts, dtype=np.int64)) in tables(app).known_ids:  # measured: bit for bit
            assert got == (step, sync), counts
        else:  # the triangulation: scipy's transforms round by the machine's LAPACK, ours alike everywhere
            assert got == pytest.approx((step, sync), rel=1e-12, abs=0), counts


def test_barycentric_transforms_equal_scipys_to_rounding():
    from scipy.spatial import Delaunay

    rng = np.random.default_rng(0)
    triangulation = Delaunay(rng.random((40, 3)))
    ours, scipys = barycentric_transforms(triangulation), triangulation.transform
    assert np.array_equal(np.isnan(ours), np.isnan(scipys))
    np.testing.assert_allclose(ours, scipys, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("app", APP_NAMES)
def test_gradient_statistics_iterations_and_progress_equal_the_artifacts(app):
    t = tables(app)
    for _, batch, epoch, sqr, var, iteration, progress in (p for p in PROBES["gradients"] if p[0] == app):
        assert kernels.grad_stats(t, float(batch), epoch) == (sqr, var)
        assert kernels.iterations(t, float(batch), epoch) == iteration
        assert t.progress_at[epoch + 1] == progress


def test_a_placement_is_named_by_its_smallest_rotation():
    assert kernels.placement_id(np.array([2, 1, 3])) == 132 == kernels.placement_id(np.array([1, 3, 2]))
    assert kernels.placement_id(np.array([4, 1])) == 14
    assert kernels.placement_id(np.array([2, 3, 1])) == 123


def test_the_readmes_workload_6_runs_give_the_artifacts_printed_average_jct():
    # simulator/README.md of the artifact prints these two (Pollux is randomized)
    workload = read_workload(grid.POLLUX_DATA / "workloads" / "workload-6.csv")
    assert simulate(workload, make_policy("optimus"), PRESET).jct.mean() == 5301.875
    assert simulate(workload, make_policy("tiresias"), PRESET).jct.mean() == 3469.69375


@pytest.mark.parametrize("load, workload", [("0.5", 1), ("1.0", 3), ("1.5", 5), ("2.0", 7)])
def test_deterministic_baselines_reproduce_a_reduced_grid_within_tolerance(load, workload):
    cells = [grid.Cell(policy, load, workload, 0) for policy in ("optimus", "tiresias")]
    table = grid.cells_table(grid.summary_table(list(grid.run_grid(cells, PRESET))))
    assert table.within.tolist() == [True, True], table
    assert (table.rel_error.abs() <= grid.DETERMINISTIC_TOLERANCE).all()


def _short_workload(jobs: int = 24) -> Workload:
    return read_workload(grid.POLLUX_DATA / "workloads-0.5" / "workload-5.csv").first(jobs)


class _Recording:
    """Pollux, with every allocation it makes and every job limit it used kept."""

    def __init__(self, seed: int):
        self.inner = Pollux(seed)
        self.name, self.fits_models = "pollux", True
        self.seen: list[tuple[dict, dict]] = []  # (allocations, each active job's GPU limit) per interval

    def batch_sizes(self, workload):
        return self.inner.batch_sizes(workload)

    def allocate(self, view: ClusterView) -> dict:
        allocations = self.inner.allocate(view)
        self.seen.append(({j: list(nodes) for j, nodes in allocations.items()},
                          {j: self.inner._max_replicas(view, j) for j in view.active.tolist()}))
        return allocations


def test_pollux_is_seeded_and_keeps_its_own_rules():
    workload = _short_workload()
    first, again = _Recording(3), _Recording(3)
    run = simulate(workload, first, PRESET)
    assert (run.completion > workload.time).all()
    assert np.array_equal(run.completion, simulate(workload, again, PRESET).completion)  # same seed, same run
    assert [a for a, _ in first.seen] == [a for a, _ in again.seen]
    for allocations, limits in first.seen:
        used = np.zeros(PRESET.num_nodes, dtype=int)
        distributed_on = np.zeros(PRESET.num_nodes, dtype=int)
        for j, nodes in allocations.items():
            assert nodes == sorted(nodes) and len(nodes) <= limits[j]
            np.add.at(used, nodes, 1)
            if len(set(nodes)) > 1:
                distributed_on[list(set(nodes))] += 1
            if workload.app[j] == APP_NAMES.index("ncf"):
                assert len(nodes) <= 1
        assert (used <= PRESET.gpus_per_node).all() and (distributed_on <= 1).all()
    # the jobs that ran fitted their throughput model, and chose their own batch sizes (ncf keeps 32768)
    assert run.model_seconds > 0


def test_pollux_beats_tiresias_and_optimus_on_a_short_workload():
    workload = _short_workload()
    pollux = simulate(workload, make_policy("pollux", 0), PRESET).jct.mean()
    assert pollux < simulate(workload, make_policy("tiresias"), PRESET).jct.mean()
    assert pollux < simulate(workload, make_policy("optimus"), PRESET).jct.mean()


def test_the_throughput_model_gradient_is_exact_and_the_fit_recovers_a_known_model():
    truth = np.array([0.04, 0.002, 0.03, 0.004, 0.01, 0.001, 2.0])
    nodes = np.array([1, 1, 1, 2, 2, 4, 1, 3])
    replicas = np.array([1, 2, 4, 4, 8, 16, 3, 6])
    bsz = np.array([32, 64, 32, 64, 128, 32, 16, 48])
    accum = truth[0] + truth[1] * bsz
    network = np.where(nodes > 1, truth[2] + truth[3] * np.maximum(replicas - 2, 1e-8),
                       np.where(replicas > 1, truth[4] + truth[5] * np.maximum(replicas - 2, 1e-8), 2e-8))
    step = (accum ** truth[6] + network ** truth[6]) ** (1 / truth[6])
    sync = step - accum
    data = _Measurements(nodes.astype(float), replicas.astype(float), bsz.astype(float), accum, step)
    point = np.array([0.05, 0.001, 0.02, 0.003, 0.02, 0.002, 1.5])
    loss, grad = data.objective(point)
    for k in range(7):
        h = 1e-7 * point[k]
        numeric = (data.objective(point + h * np.eye(7)[k])[0] - data.objective(point - h * np.eye(7)[k])[0]) / (2 * h)
        assert grad[k] == pytest.approx(numeric, rel=1e-5, abs=1e-6), k
    fitted = fit_perf_params(nodes, replicas, bsz, step, sync)
    predicted = [kernels.predicted_throughput(fitted, n, r, float(b), 0.0) for n, r, b in zip(nodes, replicas, bsz)]
    assert np.allclose(predicted, replicas * bsz / step, rtol=0.02)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.data())
def test_repair_leaves_a_feasible_allocation(jobs, nodes, data):
    states = np.array(data.draw(st.lists(st.lists(st.lists(st.integers(0, 6), min_size=nodes, max_size=nodes),
                                                  min_size=jobs, max_size=jobs), min_size=1, max_size=4)), dtype=np.int64)
    limits = np.array(data.draw(st.lists(st.integers(1, 8), min_size=jobs, max_size=jobs)), dtype=np.int64)
    before = states.copy()
    repair(states, limits, 4, np.random.default_rng(0))
    assert (states >= 0).all() and (states <= before).all()
    assert (states.sum(axis=1) <= 4).all()  # no node over its GPUs
    assert (states.sum(axis=2) <= limits).all()  # no job over its limit
    distributed = (states > 0).sum(axis=2) > 1
    assert ((states > 0) & distributed[:, :, None]).sum(axis=1).max(initial=0) <= 1  # one distributed job per node


def test_a_workload_file_with_bad_rows_names_the_line_and_field(tmp_path):
    header = "name,time,application,num_replicas,batch_size\n"
    cases = {
        "a,0,resnet,1,128\n": "application: unknown application 'resnet'",
        "a,-5,cifar10,1,128\n": "time: expected an integer >= 0",
        "a,0,cifar10,0,128\n": "num_replicas: expected an integer >= 1",
        "a,0,cifar10,1,64\n": "batch_size: cifar10 was measured at total batch sizes 128..4096",
        "a,0,cifar10,65,4096\n": "num_replicas: expected at most 64",
        "a,0,cifar10,1,128\na,5,ncf,1,256\n": "name: duplicate job 'a'",
        "a,0,cifar10,1\n": "expected 5 fields, got 4",
    }
    for body, message in cases.items():
        path = tmp_path / "w.csv"
        path.write_text(header + body)
        with pytest.raises(Dl2Error, match=message) as caught:
            read_workload(path)
        assert str(path) in str(caught.value)
    (tmp_path / "cols.csv").write_text("name,time,application,num_replicas\na,0,ncf,1\n")
    with pytest.raises(Dl2Error, match=r"cols.csv:1: missing column 'batch_size'"):
        read_workload(tmp_path / "cols.csv")


def test_a_preset_belongs_to_one_world(tmp_path):
    assert get_preset("pollux").world == "pollux" and get_preset("paper").world == "ps-worker"
    assert get_preset("pollux") == PRESET
    with pytest.raises(Dl2Error, match="preset 'pollux' is of the pollux world, this needs one of the ps-worker world"):
        get_preset("pollux", world="ps-worker")
    bad = tmp_path / "params.yaml"
    bad.write_text("presets:\n  x: {world: mars, num_nodes: 1}\n")
    with pytest.raises(Dl2Error, match=r"presets.x.world: expected one of ps-worker, pollux, got 'mars'"):
        get_preset("x", bad)
    bad.write_text("presets:\n  x: {world: pollux, num_nodes: 4, gpus_per_node: 8, interval_seconds: 60, restart_seconds: 30}\n")
    with pytest.raises(Dl2Error, match=r"presets.x.gpus_per_node: expected a number at most 4"):
        get_preset("x", bad)


def test_dl2_simulate_and_compare_run_a_pollux_preset(capsys, tmp_path):
    workload = grid.POLLUX_DATA / "workloads" / "workload-6.csv"
    jobs = tmp_path / "jobs.csv"
    assert cli.main(["simulate", "--preset", "pollux", "--trace", str(workload), "--policy", "tiresias", "--jobs-out", str(jobs)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["preset"] == "pollux" and summary["avg_jct"] == 3469.69375
    assert jobs.read_text().startswith("job,application,submit,num_replicas,batch_size,completion,jct,restarts,jct_lower_bound\n")
    out = tmp_path / "summary.csv"
    assert cli.main(["compare", str(workload), "--preset", "pollux", "--policies", "optimus", "tiresias", "--quiet",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "optimus" in printed and "5301.875" in printed
    assert cli.main(["simulate", "--preset", "pollux", "--trace", str(workload), "--policy", "drf"]) == 2
    assert "unknown policy 'drf' of the pollux world" in capsys.readouterr().err
    trace = repo_root() / "deploy" / "kind-example" / "trace.csv"
    assert cli.main(["simulate", "--preset", "pollux", "--trace", str(trace), "--policy", "tiresias"]) == 2
    assert "missing column 'name'" in capsys.readouterr().err


def test_a_stored_grid_cell_is_reused_and_a_stale_one_runs_again(tmp_path):
    cell = grid.Cell("tiresias", "0.5", 5, 0)
    (first,) = grid.run_grid([cell], PRESET, tmp_path)
    stored = tmp_path / f"{cell.label}.json"
    stored.write_text(json.dumps({**first, "summary": {**first["summary"], "avg_jct": -1.0}}))
    (again,) = grid.run_grid([cell], PRESET, tmp_path)
    assert again["summary"]["avg_jct"] == -1.0  # read from the store, not run
    stored.write_text(json.dumps({**first, "digest": "stale", "summary": {**first["summary"], "avg_jct": -1.0}}))
    (rerun,) = grid.run_grid([cell], PRESET, tmp_path)
    timing = ("policy_ms_per_interval", "model_fit_seconds")  # wall time, not a result
    assert {k: v for k, v in rerun["summary"].items() if k not in timing} == {k: v for k, v in first["summary"].items() if k not in timing}
    assert json.loads(stored.read_text())["digest"] == first["digest"]


def test_every_job_state_array_is_sized_to_the_workload():
    jobs = kernels.make_jobs(np.array([0, 1]), np.array([0, 10]), np.array([0, 64]))
    assert all(len(a) == 2 for a in jobs)
    assert len(app_tables(APPS)) == len(APP_NAMES)


@pytest.mark.slow
def test_deterministic_baselines_reproduce_every_cell_of_the_artifacts_grid():
    cells = grid.plan(("optimus", "tiresias"), (0.5, 1.0, 1.5, 2.0), grid.WORKLOADS, (0,))
    table = grid.cells_table(grid.summary_table(list(grid.run_grid(cells, PRESET))))
    assert len(table) == 64 and table.within.all(), table[~table.within.astype(bool)]
    loads = grid.loads_table(table)
    assert loads.within.all() and (loads.rel_error.abs() <= grid.DETERMINISTIC_TOLERANCE).all()


@pytest.mark.slow
def test_pollux_over_three_seeds_lands_within_tolerance_of_the_artifact():
    cells = grid.plan(("pollux",), (0.5,), (5,), (0, 1, 2))
    table = grid.cells_table(grid.summary_table(list(grid.run_grid(cells, PRESET, workers=2))))
    (row,) = table.itertuples()
    assert row.seeds == 3 and row.within, row
