"""`dl2 publish`: an ablate stage's axes copied into data/published, merged with the axes published before."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dl2.cli import main
from dl2.learn.ablations import tables as ab
from dl2.paths import write_csv_atomic, write_json_atomic


def stage_output(data: Path, group: str, axis: str, seeds: int = 3, jcts: tuple[float, float] = (6.0, 6.6)) -> dict:
    """What an ablate stage writes for one axis of two cells (`ref` and `other`), and its metrics entry."""
    rows = [{"axis": axis, "cell": cell, "run": "sl-rl", "seed": seed, "val_jct_greedy": jct + 0.01 * seed,
             "val_jct_sampled": jct, "lower_bound": 5.5, "optimus": 6.5}
            for cell, jct in zip(("ref", "other"), jcts) for seed in range(seeds)]
    results = pd.DataFrame(rows)
    summary = ab.summary(results, "ref")
    folder = data / "ablations" / group / axis
    write_csv_atomic(folder / "results.csv", results)
    write_csv_atomic(folder / "summary.csv", summary)
    write_csv_atomic(folder / "curves.csv", pd.DataFrame({"cell": ["ref"], "seed": [0], "update": [0], "val_jct_greedy": [6.0]}))
    (folder / f"{axis}.png").write_bytes(b"\x89PNG figure")
    return ab.axis_metrics(summary, "ref", seeds)


def stage_metrics(data: Path, group: str, entries: dict) -> None:
    write_json_atomic(data / "metrics" / f"ablate-{group}.json", entries)


def published(data: Path) -> Path:
    return data / "published" / "ablations"


def test_publish_copies_the_axes_the_stage_ran_and_keeps_those_published_before(tmp_path, capsys):
    earlier = {"pretraining": {"reference": "sl-rl", "seeds": 3, "cells": {"sl-rl": {"jct": 6.0}}}}
    write_json_atomic(published(tmp_path) / "ablate-model.json", earlier)
    stage_metrics(tmp_path, "model", {"teacher": stage_output(tmp_path, "model", "teacher"),
                                      "window": stage_output(tmp_path, "model", "window", jcts=(6.0, 5.9))})

    assert main(["publish", "--group", "model", "--data-dir", str(tmp_path)]) == 0
    assert "published teacher, window" in capsys.readouterr().out
    merged = json.loads((published(tmp_path) / "ablate-model.json").read_text())
    assert sorted(merged) == ["pretraining", "teacher", "window"] and merged["pretraining"] == earlier["pretraining"]
    assert merged["teacher"]["cells"]["other"]["vs_reference"] == pytest.approx(0.1, abs=1e-3)
    for name in ("results.csv", "summary.csv", "curves.csv", "window.png"):
        assert (published(tmp_path) / "window" / name).read_bytes() == (tmp_path / "ablations" / "model" / "window" / name).read_bytes()


def test_publish_replaces_an_axis_published_before_with_its_new_run(tmp_path):
    stage_metrics(tmp_path, "model", {"teacher": stage_output(tmp_path, "model", "teacher")})
    main(["publish", "--group", "model", "--data-dir", str(tmp_path)])
    stage_metrics(tmp_path, "model", {"teacher": stage_output(tmp_path, "model", "teacher", jcts=(6.0, 7.2))})
    assert main(["publish", "--group", "model", "--data-dir", str(tmp_path)]) == 0
    merged = json.loads((published(tmp_path) / "ablate-model.json").read_text())
    assert merged["teacher"]["cells"]["other"]["vs_reference"] == pytest.approx(0.2, abs=1e-3)
    assert pd.read_csv(published(tmp_path) / "teacher" / "results.csv").val_jct_greedy.max() == pytest.approx(7.22)


@pytest.mark.parametrize("fault, message", [
    ("one seed", "ran 1 seed(s); published results need at least 3"),
    ("stale metrics", "metrics do not follow from its results"),
    ("no figure", "window.png: no such file"),
    ("no stage run", "ablate-model.json: no such file: run the ablate@model stage first"),
])
def test_publish_refuses_a_reduced_stale_or_unfinished_run_and_writes_nothing(tmp_path, capsys, fault, message):
    good = stage_output(tmp_path, "model", "teacher")
    window = stage_output(tmp_path, "model", "window", seeds=1 if fault == "one seed" else 3)
    if fault == "stale metrics":
        window["cells"]["other"]["jct"] += 0.5
    if fault == "no figure":
        (tmp_path / "ablations" / "model" / "window" / "window.png").unlink()
    if fault != "no stage run":
        stage_metrics(tmp_path, "model", {"teacher": good, "window": window})

    assert main(["publish", "--group", "model", "--data-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not published(tmp_path).exists(), "a refused publish leaves nothing, not even the axes that checked out"


def write_testbed_run(data: Path, jobs: int = 2) -> None:
    """What `evaluate` (with finetune.backend: kind) and `finetune` write for a testbed run."""
    from dl2.sim_to_real import replay

    rows = [{"policy": p, "seed": -1 if p == "drf" else 0, "trace": 0, "repeat": r, "job_id": j, "model": "wlm",
             "epochs": 10.0, "jct_testbed": 4.0 + j + r, "jct_sim": 2.0}
            for p in ("drf", "dl2") for r in (0, 1) for j in range(1, jobs + 1)]
    folder = data / "evaluate" / "testbed"
    write_csv_atomic(folder / "jobs.csv", pd.DataFrame(rows, columns=replay.JOB_COLUMNS))
    write_csv_atomic(folder / "slots.csv", pd.DataFrame(columns=replay.SLOT_COLUMNS))
    write_csv_atomic(folder / "speed_error.csv", pd.DataFrame(columns=["model"]))
    for name in ("sim_to_real.png", "speed_error.png"):
        (folder / name).write_bytes(b"\x89PNG figure")
    results = pd.DataFrame([{"policy": "drf", "seed": -1, "trace": 0, "avg_jct": 2.0, "lower_bound": 1.5, "ratio_to_bound": 2 / 1.5}])
    write_csv_atomic(data / "evaluate" / "results.csv", results)
    (data / "evaluate" / "summary.md").write_text("table\n")
    write_csv_atomic(data / "learn" / "finetune_history.csv", pd.DataFrame({"update": [1], "val_jct_greedy": [2.0]}))


def test_publish_testbed_copies_a_kind_run_and_writes_its_metrics(tmp_path, capsys):
    write_testbed_run(tmp_path)
    assert main(["publish", "--testbed", "--data-dir", str(tmp_path)]) == 0
    folder = tmp_path / "published" / "testbed"
    assert (folder / "evaluate" / "jobs.csv").read_bytes() == (tmp_path / "evaluate" / "testbed" / "jobs.csv").read_bytes()
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["testbed"]["drf"] == {"kind_avg_jct": 6.0, "sim_avg_jct": 2.0, "ratio": 3.0, "runs": 2, "repeat_sd": 0.5}
    assert metrics["simulator"]["drf"]["avg_jct"] == 2.0


def test_publish_testbed_refuses_a_run_that_never_used_the_testbed(tmp_path, capsys):
    write_testbed_run(tmp_path, jobs=0)
    assert main(["publish", "--testbed", "--data-dir", str(tmp_path)]) == 2
    assert "no testbed runs" in capsys.readouterr().err and not (tmp_path / "published").exists()
    assert main(["publish", "--data-dir", str(tmp_path)]) == 2
    assert "--group GROUP" in capsys.readouterr().err
