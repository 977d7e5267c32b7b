"""`dl2 score`: the suite is the published evaluations' traces, the published scoreboard follows from its runs,
a user's class is scored from the command line, and what cannot be scored is refused with its reason."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy
from dl2.learn.architecture import net_config
from dl2.paths import repo_root
from dl2.pollux.cluster import simulate as simulate_pollux
from dl2.pollux.grid import Cell
from dl2.pollux.workload import read_workload
from dl2.score import board, builtins, suite
from dl2.score.candidate import resolve
from dl2.score.runs import run_suite
from dl2.workload.presets import POLLUX, PS_WORKER, get_preset

ROOT = repo_root()
DOCS = ROOT / "docs" / "scoreboard.md"


def test_the_suite_is_the_published_evaluations_validation_traces():
    """The heuristics scored on each PS/worker part give the published `evaluate` results trace by trace, and the
    contention-free bound its published bound (`paper`'s results were written at an older commit: equal to the
    last bits, 1e-12)."""
    for part in suite.PS_WORKER_PARTS:
        published = pd.read_csv(ROOT / "data" / "published" / part.preset / "results.csv")
        sc, traces = suite.ps_worker_traces(part)
        assert len(traces) == published.trace.nunique() == 10
        for name in ("fifo", "srtf", "drf", "tetris", "optimus"):
            runs = run_suite(resolve(name), worlds=(PS_WORKER,), progress=False).runs
            mine = runs[runs.part == part.label].avg_jct.to_numpy()
            theirs = published[published.policy == name].sort_values("trace").avg_jct.to_numpy()
            np.testing.assert_allclose(mine, theirs, rtol=1e-12, atol=0, err_msg=f"{part.label} {name}")
        bounds = pd.read_csv(builtins.SCOREBOARD / "bounds.csv", dtype={"trace": str})
        theirs = published[published.policy == "fifo"].sort_values("trace").lower_bound.to_numpy()
        np.testing.assert_allclose(bounds[bounds.part == part.label].contention_free, theirs, rtol=1e-12, atol=0)


def test_the_published_scoreboard_follows_from_its_runs_and_bounds():
    runs, bounds = builtins.load()
    recomputed = builtins.builtin_runs(progress=False)
    pd.testing.assert_frame_equal(runs, recomputed.astype({"trace": str}), check_exact=False, rtol=1e-12)
    scores = builtins.builtin_scores(runs, bounds)
    assert json.loads((builtins.SCOREBOARD / "score.json").read_text()) == json.loads(json.dumps(board.board_json(scores)))
    assert (builtins.SCOREBOARD / "score.md").read_text() == board.board_markdown(scores)
    assert sorted(runs.drop_duplicates(["part", "policy"]).groupby("part").policy.apply(sorted).items()) == sorted(
        [(p.label, ["dl2", "drf", "fifo", "optimus", "srtf", "tetris"]) for p in suite.PS_WORKER_PARTS]
        + [(suite.pollux_label(load), ["optimus", "pollux", "tiresias"]) for load in suite.POLLUX_LOADS])
    dl2 = scores[(scores.policy == "dl2") & (scores.part == "ps-worker/paper")].iloc[0]
    assert (round(dl2.avg_jct, 3), round(dl2.sd_seeds, 3), round(dl2.ratio_contention_free, 3)) == (5.871, 0.061, 1.060)
    bounded = scores[scores.part.str.startswith("ps-worker/")]
    assert len(bounded) == 18 and (bounded.capacity >= bounded.contention_free - 1e-9).all()
    pollux = scores[~scores.part.str.startswith("ps-worker/")]
    assert pollux.capacity.isna().all(), "the Pollux world has no capacity-aware bound"
    assert (pollux.contention_free > 0).all() and (pollux.ratio_contention_free >= 1).all(), "each job alone bounds it"


@pytest.mark.slow
def test_the_published_bounds_are_the_bounds_of_the_suites_traces():
    published = pd.read_csv(builtins.SCOREBOARD / "bounds.csv", dtype={"trace": str})
    recomputed = builtins.bounds_table(progress=False)
    pd.testing.assert_frame_equal(published.drop(columns="capacity_seconds"), recomputed.drop(columns="capacity_seconds"),
                                  check_exact=False, rtol=1e-9)
    ps_worker = published[published.part.str.startswith("ps-worker/")]
    assert (ps_worker.capacity >= ps_worker.contention_free - 1e-9).all()
    assert published[~published.part.str.startswith("ps-worker/")].capacity.isna().all(), "no capacity bound in the Pollux world"


@pytest.mark.parametrize("policy", ["optimus", "tiresias"])
def test_a_pollux_cell_rescored_is_the_published_grids(policy):
    cell = Cell(policy, "0.5", 5, 0)
    run = simulate_pollux(read_workload(cell.path), resolve(policy).factories[POLLUX](0), get_preset("pollux", world=POLLUX))
    runs, _ = builtins.load()
    published = runs[(runs.policy == policy) & (runs.part == "pollux/load-0.5") & (runs.trace == "workload-5")]
    assert float(run.jct.mean()) == published.avg_jct.item()


def docs_example() -> str:
    """The example class of docs/scoreboard.md, as the page shows it."""
    block = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    assert len(block.splitlines()) < 30
    return block


def test_the_docs_example_is_the_one_the_benchmark_times():
    from dl2.bench_score import EXAMPLE

    assert docs_example() == EXAMPLE


def test_the_docs_example_is_scored_from_the_command_line_and_absent_in_the_pollux_world(tmp_path):
    (tmp_path / "my_scheduler.py").write_text(docs_example())
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "dl2.cli", "score", "my_scheduler.py:ShortestFirst", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)  # as the docs run it
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in done.stdout.splitlines() if line.startswith("| ps-worker") or
            line.startswith("| pollux")}
    assert set(rows) == set(suite.PARTS)
    for part in suite.PARTS:
        if part.startswith("ps-worker/"):
            assert re.search(r"\| \d of 7 \|", rows[part]), rows[part]
        else:
            assert "absent" in rows[part]
    score = json.loads((out / "score.json").read_text())
    assert score["scheduler"] == "shortest-first" and score["suite"]["version"] == suite.SUITE_VERSION
    assert {p: e["status"] for p, e in score["parts"].items()} == {p: "scored" if p.startswith("ps-worker/") else "absent"
                                                                   for p in suite.PARTS}
    assert (out / "score.md").read_text() == done.stdout.rstrip("\n") + "\n"
    paper = score["parts"]["ps-worker/paper"]
    assert paper["runs"] == 10 and paper["avg_jct"] > paper["capacity"] >= paper["contention_free"] > 0


def test_a_class_plays_the_worlds_whose_methods_it_has_and_a_seed_argument_makes_it_randomized(tmp_path, monkeypatch):
    (tmp_path / "both_worlds.py").write_text(
        "class Both:\n    fits_models = False\n    def __init__(self, seed=0):\n        self.seed = seed\n"
        "    def schedule(self, obs):\n        return obs.allocation()\n"
        "    def batch_sizes(self, workload):\n        return 0 * workload.batch_size\n"
        "    def allocate(self, view):\n        return {}\n\n"
        "class Neither:\n    def plan(self):\n        pass\n\n"
        "class NeedsArgs:\n    def __init__(self, nodes):\n        pass\n    def schedule(self, obs):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    both = resolve("both_worlds:Both")
    assert both.plays(PS_WORKER) and both.plays(POLLUX) and both.randomized == {PS_WORKER, POLLUX}
    assert both.factories[POLLUX](2).seed == 2 and both.factories[PS_WORKER](1).name == "both_worlds:Both"
    with pytest.raises(Dl2Error, match="implements neither world's protocol"):
        resolve("both_worlds:Neither")
    with pytest.raises(Dl2Error, match=re.escape("both_worlds:NeedsArgs: cannot build it as cls()")):
        resolve("both_worlds:NeedsArgs").factories[PS_WORKER](0)


def test_built_ins_play_their_own_worlds():
    assert resolve("DRF").plays(PS_WORKER) and not resolve("drf").plays(POLLUX)
    assert resolve("tiresias").plays(POLLUX) and not resolve("tiresias").plays(PS_WORKER)
    assert resolve("optimus").plays(PS_WORKER) and resolve("optimus").plays(POLLUX)  # Optimus in one, Optimus+Oracle in the other
    assert resolve("pollux").randomized == {POLLUX} and not resolve("tiresias").randomized


def test_a_model_is_scored_on_the_presets_of_its_max_tasks_and_absent_elsewhere(tmp_path):
    path = tmp_path / "tiny.pt"
    DL2Policy(net_config("per-job", hidden=(8,), window=20), get_preset("paper").max_tasks, True).save(path)
    done = run_suite(resolve(str(path)), progress=False)
    assert set(done.runs.part) == {"ps-worker/paper"} and len(done.runs) == 10 and np.isfinite(done.runs.avg_jct).all()
    assert "max_tasks=8" in done.absent["ps-worker/dev"] and "max_tasks=8" in done.absent["ps-worker/paper-large"]
    assert all("ps-worker world" in done.absent[suite.pollux_label(load)] for load in suite.POLLUX_LOADS)


@pytest.mark.parametrize(("spec", "message"), [
    ("fastest", "unknown scheduler 'fastest'"),
    ("missing.pt", "missing.pt: model file not found"),
    ("no_such_module:Class", "cannot import scheduler module 'no_such_module'"),
])
def test_what_cannot_be_scored_is_refused_with_its_reason(spec, message):
    with pytest.raises(Dl2Error, match=re.escape(message)):
        resolve(spec)


def test_a_file_that_is_no_model_is_refused_from_the_command_line(tmp_path, capsys):
    from dl2.cli import main

    (tmp_path / "notes.pt").write_text("not a model")
    assert main(["score", str(tmp_path / "notes.pt"), "--out", str(tmp_path / "out")]) == 2
    assert "notes.pt: not a dl2 model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_scoreboard_of_another_suite_version_is_refused(tmp_path):
    for name in ("runs.csv", "bounds.csv"):
        (tmp_path / name).write_text((builtins.SCOREBOARD / name).read_text())
    (tmp_path / "score.json").write_text(json.dumps({"suite_version": suite.SUITE_VERSION + 1}))
    with pytest.raises(Dl2Error, match=f"suite version {suite.SUITE_VERSION + 1}"):
        builtins.load(tmp_path)


def test_rank_counts_the_built_ins_below_and_a_built_in_of_its_own_name_is_itself():
    builtin = pd.DataFrame({"part": ["a", "a", "a", "b"], "policy": ["x", "y", "z", "x"], "avg_jct": [1.0, 2.0, 3.0, 5.0]})
    mine = pd.DataFrame({"part": ["a", "a", "b", "c"], "policy": ["me", "y", "me", "me"], "avg_jct": [2.5, 0.5, 4.0, 1.0]})
    ranked = board.rank(mine, builtin)
    assert ranked["rank"].tolist()[:3] == [3, 1, 1] and ranked["of"].tolist()[:3] == [4, 3, 2]
    assert ranked["rank"].isna().tolist() == [False, False, False, True]  # no built-in ran part c


def test_the_results_pages_scoreboard_is_the_published_one():
    text = (ROOT / "docs" / "results.md").read_text().split("## Scoreboard", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in text.splitlines() if line.startswith("| `")]
    header = next(line for line in text.splitlines() if line.startswith("| PS/worker preset"))
    names = {v: k for k, v in board.DISPLAY["ps-worker"].items()}
    policies = [names[cell.strip()] for cell in header.strip("|").split("|")[1:]]
    parts = json.loads((builtins.SCOREBOARD / "score.json").read_text())["parts"]
    assert len(lines) == len(suite.PS_WORKER_PARTS)
    for line in lines:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        part = f"ps-worker/{cells[0].strip('`')}"
        for policy, cell in zip(policies, cells[1:]):
            entry = parts[part][policy]
            assert cell == f"{entry['avg_jct']:.3f} ({entry['ratio_contention_free']:.3f}, {entry['ratio_capacity']:.3f})", (part, policy)


@pytest.mark.slow
def test_a_users_pollux_world_class_is_scored_on_the_whole_grid(tmp_path, monkeypatch):
    """A class with the Pollux-world methods (here Tiresias under another name) plays the 32 cells, once each, and
    gives the published grid's numbers; the PS/worker parts mark it absent."""
    (tmp_path / "my_pollux.py").write_text("from dl2.pollux.policies.tiresias import Tiresias\n\n\n"
                                           "class Mine(Tiresias):\n    name = 'mine'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    done = run_suite(resolve("my_pollux:Mine"), progress=False)
    assert set(done.absent) == {p.label for p in suite.PS_WORKER_PARTS}
    runs, _ = builtins.load()
    published = runs[runs.policy == "tiresias"].set_index(["part", "trace"]).avg_jct
    assert len(done.runs) == 32
    assert done.runs.set_index(["part", "trace"]).avg_jct.to_dict() == published.to_dict()


@pytest.mark.slow
def test_the_score_benchmark_times_both_schedulers_and_their_parts(tmp_path):
    from dl2.bench_score import SCHEDULERS, score_benchmark

    out = tmp_path / "bench-score.json"
    result = score_benchmark(out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert set(result["schedulers"]) == set(SCHEDULERS)
    optimus, example = result["schedulers"]["optimus"], result["schedulers"]["example"]
    assert set(optimus["part_seconds"]) == set(suite.PARTS)
    assert set(example["part_seconds"]) == {p.label for p in suite.PS_WORKER_PARTS} and example["pollux_seconds"] == 0
    assert 0 < optimus["ps_worker_seconds"] + optimus["pollux_seconds"] < optimus["wall_seconds"]
