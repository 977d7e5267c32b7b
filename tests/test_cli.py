"""Happy paths of the `dl2` command, run through `dl2.cli.main`."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dl2.cli import main
from dl2.schedulers import policy_names
from dl2.workload.presets import get_preset

NUM_TRACES = 2
SCHEDULER_SOURCE = '''\
import numpy as np


class ShortestFirst:
    name = "shortest-first"

    def __init__(self):
        self.calls = 0

    def schedule(self, obs):
        self.calls += 1
        alloc = obs.allocation()
        for j in np.argsort(obs.num_epochs - obs.progress, kind="stable"):
            while alloc.add_bundle(j):
                pass
        return alloc
'''


def run_ok(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, f"exit {code}: {captured.err}"
    assert "error" not in captured.err
    return captured.out


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    """Two paper traces, generated once for the module."""
    out = tmp_path_factory.mktemp("traces") / "paper"
    assert main(["trace", "generate", "--preset", "paper", "--num", str(NUM_TRACES), "--seed", "7", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def trace_file(traces: Path) -> Path:
    return traces / "trace_000.csv"


# ---------------------------------------------------------------- trace generate / validate / stats


def test_trace_generate_writes_n_files(capsys, tmp_path):
    out = tmp_path / "gen"
    stdout = run_ok(capsys, ["trace", "generate", "--preset", "paper", "--num", "3", "--seed", "1", "--out", str(out)])
    paper = get_preset("paper")
    files = sorted(p.name for p in out.iterdir())
    assert files == ["trace_000.csv", "trace_001.csv", "trace_002.csv"]
    for name in files:
        rows = read_rows(out / name)
        assert list(rows[0]) == ["job_id", "arrival_slot", "model", "num_epochs"]
        assert len(rows) == paper.num_jobs
        assert [int(r["job_id"]) for r in rows] == list(range(1, paper.num_jobs + 1))
        arrivals = [int(r["arrival_slot"]) for r in rows]
        assert arrivals == sorted(arrivals) and arrivals[0] >= 0
        assert max(arrivals.count(a) for a in set(arrivals)) <= paper.max_arrivals
        assert all(0 < float(r["num_epochs"]) <= paper.max_epochs for r in rows)
        assert Path(name).stem in stdout
    # nothing else next to the output folder (no staging folder left)
    assert [p.name for p in tmp_path.iterdir()] == ["gen"]


def test_trace_generate_is_deterministic_per_seed(capsys, tmp_path):
    def generate(seed: int, name: str) -> dict[str, bytes]:
        out = tmp_path / name
        run_ok(capsys, ["trace", "generate", "--num", str(NUM_TRACES), "--seed", str(seed), "--out", str(out)])
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    first, again, other = generate(5, "a"), generate(5, "b"), generate(6, "c")
    assert len(first) == NUM_TRACES
    assert first == again
    assert first.keys() == other.keys()
    assert first != other


def test_trace_generate_replaces_existing_folder(capsys, tmp_path):
    out = tmp_path / "gen"
    out.mkdir()
    (out / "stale.csv").write_text("old\n")
    run_ok(capsys, ["trace", "generate", "--num", "1", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["trace_000.csv"]


def test_trace_validate(capsys, traces):
    files = sorted(traces.glob("*.csv"))
    stdout = run_ok(capsys, ["trace", "validate", *map(str, files)])
    lines = stdout.splitlines()
    assert len(lines) == NUM_TRACES
    for line, path in zip(lines, files):
        assert line == f"{path}: ok, {len(read_rows(path))} jobs"


def test_trace_stats(capsys, trace_file):
    stats = json.loads(run_ok(capsys, ["trace", "stats", str(trace_file)]))
    rows = read_rows(trace_file)
    arrivals = [int(r["arrival_slot"]) for r in rows]
    assert stats["num_jobs"] == len(rows)
    assert stats["first_arrival"] == min(arrivals)
    assert stats["last_arrival"] == max(arrivals)
    assert stats["max_arrivals_per_slot"] == max(arrivals.count(a) for a in set(arrivals))
    assert stats["mean_epochs"] == pytest.approx(sum(float(r["num_epochs"]) for r in rows) / len(rows))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["model"]] = counts.get(r["model"], 0) + 1
    assert stats["jobs_per_model"] == counts


def test_trace_stats_of_hand_written_trace(capsys, tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("job_id,arrival_slot,model,num_epochs,comment\n"
                    "1,2,resnet-50,10,a\n\n2,2,vgg-16,30,b\n3,5,resnet-50,20,c\n")
    stats = json.loads(run_ok(capsys, ["trace", "stats", str(path)]))
    bound = stats.pop("bound")
    assert bound["lower_bound_avg_jct"] > 0 and 0 < bound["bound_demand_mean"] <= bound["bound_demand_peak"] < 1
    assert bound["slots_over_capacity"] == 0.0  # three jobs on the paper's 96 nodes
    assert stats == {"num_jobs": 3, "first_arrival": 2, "last_arrival": 5, "max_arrivals_per_slot": 2,
                     "mean_epochs": 20.0, "jobs_per_model": {"resnet-50": 2, "vgg-16": 1}}


# ---------------------------------------------------------------- simulate


def check_summary(summary: dict) -> None:
    for key in ("avg_jct", "median_jct", "p95_jct", "p99_jct", "makespan", "lower_bound_avg_jct", "ratio_to_lower_bound"):
        assert key in summary, key
        assert math.isfinite(summary[key]), key
    assert summary["lower_bound_avg_jct"] > 0
    assert summary["ratio_to_lower_bound"] >= 1.0
    assert summary["ratio_to_lower_bound"] == pytest.approx(summary["avg_jct"] / summary["lower_bound_avg_jct"])
    assert 0 < summary["median_jct"] <= summary["p95_jct"] <= summary["p99_jct"] <= summary["makespan"]
    # the capacity-aware bound: at or above the contention-free one, at or below the run, its solve timed
    assert summary["lower_bound_avg_jct"] - 1e-9 <= summary["capacity_bound_avg_jct"] <= summary["avg_jct"] + 1e-9
    assert summary["ratio_to_capacity_bound"] == pytest.approx(summary["avg_jct"] / summary["capacity_bound_avg_jct"])
    assert summary["capacity_bound_seconds"] > 0


@pytest.mark.parametrize("policy", ["fifo", "optimus"])
def test_simulate_prints_metrics_and_writes_jobs(capsys, tmp_path, trace_file, policy):
    jobs_out = tmp_path / "out" / "jobs.csv"
    summary = json.loads(run_ok(capsys, ["simulate", "--trace", str(trace_file), "--policy", policy, "--preset", "paper",
                                         "--jobs-out", str(jobs_out)]))
    assert summary["policy"] == policy and summary["preset"] == "paper"
    check_summary(summary)

    trace_rows = read_rows(trace_file)
    jobs = read_rows(jobs_out)
    assert len(jobs) == len(trace_rows)
    assert [j["job_id"] for j in jobs] == [r["job_id"] for r in trace_rows]
    assert [j["model"] for j in jobs] == [r["model"] for r in trace_rows]
    jct = [float(j["jct"]) for j in jobs]
    assert all(v > 0 for v in jct)
    assert summary["avg_jct"] == pytest.approx(sum(jct) / len(jct))
    assert summary["p99_jct"] <= max(jct) + 1e-9
    assert summary["makespan"] >= max(jct)
    for j in jobs:  # no schedule beats a job's time alone on the cluster
        assert float(j["jct"]) >= float(j["jct_lower_bound"]) - 1e-9, j
        assert float(j["jct"]) == pytest.approx(float(j["end_slot"]) - float(j["arrival_slot"]) + 1)
    assert [p.name for p in jobs_out.parent.iterdir()] == ["jobs.csv"]


def test_simulate_fine_grained_jct_is_fractional(capsys, tmp_path, trace_file):
    jobs_out = tmp_path / "jobs.csv"
    run_ok(capsys, ["simulate", "--trace", str(trace_file), "--policy", "fifo", "--jobs-out", str(jobs_out)])
    assert any(float(j["jct"]) != int(float(j["jct"])) for j in read_rows(jobs_out))


def test_simulate_integer_jct(capsys, tmp_path, trace_file):
    fine_out, whole_out = tmp_path / "fine.csv", tmp_path / "whole.csv"
    fine = json.loads(run_ok(capsys, ["simulate", "--trace", str(trace_file), "--policy", "fifo", "--jobs-out", str(fine_out)]))
    whole = json.loads(run_ok(capsys, ["simulate", "--trace", str(trace_file), "--policy", "fifo", "--integer-jct",
                                       "--jobs-out", str(whole_out)]))
    check_summary(whole)
    jobs = read_rows(whole_out)
    assert len(jobs) == len(read_rows(trace_file))
    for j in jobs:
        assert float(j["jct"]) == int(float(j["jct"])) and float(j["jct"]) >= 1, j
        assert float(j["jct_lower_bound"]) == int(float(j["jct_lower_bound"])), j
    assert whole["avg_jct"] == pytest.approx(sum(float(j["jct"]) for j in jobs) / len(jobs))
    # whole slots never count less than the fraction of the last one
    assert whole["avg_jct"] >= fine["avg_jct"] - 1e-9


def test_simulate_is_deterministic(capsys, trace_file):
    """Every number but the bound's wall-clock solve time."""
    argv = ["simulate", "--trace", str(trace_file), "--policy", "drf"]
    first, second = (json.loads(run_ok(capsys, argv)) for _ in range(2))
    assert first.pop("capacity_bound_seconds") > 0 and second.pop("capacity_bound_seconds") > 0
    assert first == second


def test_simulate_user_scheduler_file(capsys, tmp_path, trace_file):
    sched = tmp_path / "my_sched.py"
    sched.write_text(SCHEDULER_SOURCE)
    jobs_out = tmp_path / "jobs.csv"
    summary = json.loads(run_ok(capsys, ["simulate", "--trace", str(trace_file), "--policy", f"{sched}:ShortestFirst",
                                         "--preset", "paper", "--jobs-out", str(jobs_out)]))
    assert summary["policy"] == "shortest-first"
    check_summary(summary)
    jobs = read_rows(jobs_out)
    assert len(jobs) == len(read_rows(trace_file))
    assert all(float(j["jct"]) >= float(j["jct_lower_bound"]) - 1e-9 for j in jobs)


# ---------------------------------------------------------------- compare


def test_compare_folder(capsys, tmp_path, traces):
    out = tmp_path / "summary.csv"
    stdout = run_ok(capsys, ["compare", str(traces), "--quiet", "--out", str(out), "--preset", "paper"])
    rows = read_rows(out)
    policies = list(policy_names())
    assert len(rows) == NUM_TRACES * len(policies)
    pairs = {(r["trace"], r["policy"]) for r in rows}
    assert pairs == {(f"trace_{i:03d}", p) for i in range(NUM_TRACES) for p in policies}
    for r in rows:
        assert r["preset"] == "paper"
        check_summary({k: float(v) for k, v in r.items() if k not in ("preset", "trace", "policy")})
    # the printed table: one line per policy, after the header
    lines = stdout.splitlines()
    assert "policy" in lines[0] and "avg_jct_mean" in lines[0]
    assert len(lines) == 1 + len(policies)
    for p in policies:
        assert any(line.split()[1] == p for line in lines[1:]), p


def test_compare_matches_simulate(capsys, tmp_path, traces, trace_file):
    out = tmp_path / "summary.csv"
    run_ok(capsys, ["compare", str(trace_file), "--quiet", "--out", str(out), "--policies", "srtf", "tetris"])
    rows = {r["policy"]: r for r in read_rows(out)}
    assert set(rows) == {"srtf", "tetris"}
    for policy, row in rows.items():
        single = json.loads(run_ok(capsys, ["simulate", "--trace", str(trace_file), "--policy", policy]))
        assert float(row["avg_jct"]) == pytest.approx(single["avg_jct"])
        assert float(row["makespan"]) == pytest.approx(single["makespan"])


def test_compare_with_user_scheduler(capsys, tmp_path, trace_file):
    sched = tmp_path / "my_sched.py"
    sched.write_text(SCHEDULER_SOURCE)
    out = tmp_path / "summary.csv"
    run_ok(capsys, ["compare", str(trace_file), "--quiet", "--out", str(out), "--policies", "fifo", f"{sched}:ShortestFirst"])
    rows = read_rows(out)
    assert [r["policy"] for r in rows] == ["fifo", "shortest-first"]
    for r in rows:
        assert float(r["ratio_to_lower_bound"]) >= 1.0


def test_a_reader_that_stops_early_ends_the_command_quietly(trace_file):
    """`dl2 simulate ... | head`: the pipe closes before the output is written; no traceback follows."""
    proc = subprocess.Popen([sys.executable, "-m", "dl2.cli", "simulate", "--trace", str(trace_file), "--policy", "drf"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before a line is printed
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and err.decode() == ""
