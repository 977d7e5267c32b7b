"""Publishing an `ablate` stage's full-scale results into `data/published/ablations/`, a pipeline run on the
kind testbed into `data/published/testbed/`, and the Pollux world's full grid and DL2's table beside it into
`data/published/pollux/` (committed DVC metrics).

A group's axes can run in several sittings (`-S 'ablations.groups.model=[teacher]'`): each publish copies the
axes the stage just ran and merges their entries into the group's published metrics, keeping the axes
published before. Every axis is checked first: its metrics must follow from its per-seed results, and it
must have run at least `MIN_SEEDS` seeds, so a reduced or stale run is never published.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from dl2.errors import Dl2Error
from dl2.learn.ablations import tables
from dl2.paths import atomic_path, write_json_atomic

MIN_SEEDS = 3


def publish_ablations(data_dir: Path, group: str) -> list[str]:
    """Copy the axes of `data_dir/metrics/ablate-<group>.json` from `data_dir/ablations/<group>/` into
    `data_dir/published/ablations/` and merge their metrics into the published `ablate-<group>.json`;
    returns the axes published. Nothing is written unless every axis checks out."""
    source = data_dir / "metrics" / f"ablate-{group}.json"
    if not source.is_file():
        raise Dl2Error(f"{source}: no such file: run the ablate@{group} stage first")
    metrics = json.loads(source.read_text())
    folders = {axis: data_dir / "ablations" / group / axis for axis in metrics}
    for axis, entry in metrics.items():
        _check_axis(folders[axis], axis, entry)
    published = data_dir / "published" / "ablations"
    for axis, folder in folders.items():
        for name in tables.axis_files(axis):
            _copy(folder / name, published / axis / name)
    target = published / f"ablate-{group}.json"
    merged = json.loads(target.read_text()) if target.is_file() else {}
    write_json_atomic(target, {**merged, **metrics})
    return list(metrics)


def _copy(source: Path, target: Path) -> None:
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


def _check_axis(folder: Path, axis: str, entry: dict) -> None:
    """Raise unless `folder` holds the axis's files and `entry` follows from its results over enough seeds."""
    for name in tables.axis_files(axis):
        if not (folder / name).is_file():
            raise Dl2Error(f"{folder / name}: no such file: the ablate stage did not finish axis {axis!r}")
    if entry.get("seeds", 0) < MIN_SEEDS:
        raise Dl2Error(f"{folder}: axis {axis!r} ran {entry.get('seeds')} seed(s); published results need at least "
                       f"{MIN_SEEDS} (ablations.seeds, ablations.scale=full)")
    results = pd.read_csv(folder / "results.csv", dtype={"cell": str})
    if entry != tables.axis_metrics(tables.summary(results, entry["reference"]), entry["reference"], results.seed.nunique()):
        raise Dl2Error(f"{folder / 'results.csv'}: axis {axis!r}'s metrics do not follow from its results (a stale run?): "
                       "rerun the ablate stage")


TESTBED_FILES = {  # published name: the pipeline output it copies (under the data folder)
    "evaluate/jobs.csv": "evaluate/testbed/jobs.csv", "evaluate/slots.csv": "evaluate/testbed/slots.csv",
    "evaluate/speed_error.csv": "evaluate/testbed/speed_error.csv", "evaluate/sim_to_real.png": "evaluate/testbed/sim_to_real.png",
    "evaluate/speed_error.png": "evaluate/testbed/speed_error.png", "results.csv": "evaluate/results.csv",
    "summary.md": "evaluate/summary.md", "finetune_history.csv": "learn/finetune_history.csv",
}


def testbed_metrics(jobs: pd.DataFrame, results: pd.DataFrame) -> dict:
    """The published testbed run's DVC metrics: per policy, the average JCT on kind and in the simulator on the
    profiled table, their ratio, the runs and the spread over repeats (`dl2.sim_to_real.replay.summary`), and the
    simulator evaluation's per-policy metrics."""
    from dl2.learn.evaluate import summary_metrics, summary_table
    from dl2.sim_to_real import replay

    testbed = {r.policy: {"kind_avg_jct": round(float(r.testbed), 6), "sim_avg_jct": round(float(r.sim), 6),
                          "ratio": round(float(r.ratio), 6), "runs": int(r.runs), "repeat_sd": round(float(r.repeat_sd), 6)}
               for r in replay.summary(jobs).itertuples()}
    return {"testbed": testbed, "simulator": summary_metrics(summary_table(results))}


def publish_testbed(data_dir: Path) -> list[str]:
    """Copy a kind testbed run's outputs (`evaluate` with `finetune.backend: kind`) into
    `data_dir/published/testbed/` and write its metrics; returns the files published. Nothing is written
    unless every file is there and the run replayed traces on the testbed."""
    sources = {name: data_dir / source for name, source in TESTBED_FILES.items()}
    for path in sources.values():
        if not path.is_file():
            raise Dl2Error(f"{path}: no such file: run the pipeline with finetune.backend=kind first "
                           "(docs/testbed-kind.md)")
    jobs = pd.read_csv(sources["evaluate/jobs.csv"])
    if jobs.empty:
        raise Dl2Error(f"{sources['evaluate/jobs.csv']}: no testbed runs in it: "
                       "the evaluate stage ran with a finetune.backend other than kind")
    published = data_dir / "published" / "testbed"
    for name, path in sources.items():
        _copy(path, published / name)
    write_json_atomic(published / "metrics.json", testbed_metrics(jobs, pd.read_csv(sources["results.csv"])))
    return [*TESTBED_FILES, "metrics.json"]


POLLUX_FILES = ("summary.csv", "jobs.csv", "cells.csv", "loads.csv", "reductions.csv", "metrics.json", "fig8a.png", "cells.png")


def publish_pollux(data_dir: Path) -> list[str]:
    """Copy the `pollux-baselines` stage's full-scale grid (`data_dir/pollux/`) into `data_dir/published/pollux/`;
    returns the files published. Nothing is written unless every file is there, the grid ran every policy,
    load and workload with at least `MIN_SEEDS` seeds for Pollux, and its tables follow from its runs."""
    from dl2.pollux import grid

    folder = data_dir / "pollux"
    for name in POLLUX_FILES:
        if not (folder / name).is_file():
            raise Dl2Error(f"{folder / name}: no such file: run the pollux-baselines stage first")
    summary = pd.read_csv(folder / "summary.csv", dtype={"load": str})
    cells = grid.cells_table(summary)
    if len(cells) != 3 * len(grid.LOADS) * len(grid.WORKLOADS) or cells.within.isna().any():
        raise Dl2Error(f"{folder / 'summary.csv'}: not the full grid with {grid.MIN_SEEDS} seeds for pollux "
                       "(rerun with pollux.scale=full, docs/pollux.md)")
    loads, reductions = grid.loads_table(cells), grid.reductions_table(cells)
    if json.loads((folder / "metrics.json").read_text()) != json.loads(json.dumps(grid.grid_metrics(cells, loads, reductions))):
        raise Dl2Error(f"{folder / 'metrics.json'}: does not follow from summary.csv (a stale run?): rerun the stage")
    published = data_dir / "published" / "pollux"
    for name in POLLUX_FILES:
        _copy(folder / name, published / name)
    return list(POLLUX_FILES)


POLLUX_TABLE_FILES = {  # published name (beside the grid in data/published/pollux/): the pollux-dl2 stage's output
    "dl2_summary.csv": "summary.csv", "bound.csv": "bound.csv", "table_cells.csv": "cells.csv", "table.csv": "table.csv",
    "table_targets.csv": "targets.csv", "table_comparisons.csv": "comparisons.csv", "table.md": "table.md",
    "table.png": "table.png", "table.json": "metrics.json",
}


def publish_pollux_table(data_dir: Path) -> list[str]:
    """Copy the `pollux-dl2` stage's full-scale table (`data_dir/pollux-dl2/`) into `data_dir/published/pollux/`
    beside the grid; returns the files published. Nothing is written unless every file is there, the run was the
    full scale with both variants over at least `MIN_SEEDS` seeds on all 32 cells, and its metrics follow from its
    runs, the published grid and the bound."""
    from dl2.pollux import grid, table

    folder, published = data_dir / "pollux-dl2", data_dir / "published" / "pollux"
    for source in POLLUX_TABLE_FILES.values():
        if not (folder / source).is_file():
            raise Dl2Error(f"{folder / source}: no such file: run the pollux-dl2 stage first")
    metrics = json.loads((folder / "metrics.json").read_text())
    if metrics.get("scale") != "full":
        raise Dl2Error(f"{folder / 'metrics.json'}: a {metrics.get('scale')} run; only the full scale is published "
                       "(pollux_dl2.scale=full, docs/pollux.md)")
    summary = table.read_summary(folder / "summary.csv")
    seeds = summary.groupby("policy").seed.nunique()
    short = [f"{p} ({int(seeds.get(p, 0))})" for p in table.DL2_POLICIES if seeds.get(p, 0) < MIN_SEEDS]
    if short:
        raise Dl2Error(f"{folder / 'summary.csv'}: published results need both variants over at least {MIN_SEEDS} seeds; "
                       f"seeds run: {', '.join(short)}")
    bound = pd.read_csv(folder / "bound.csv", dtype={"load": str})
    if set(zip(bound.load, bound.workload)) != {(load, w) for load in grid.LOADS for w in grid.WORKLOADS}:
        raise Dl2Error(f"{folder / 'bound.csv'}: not every load and workload of the grid (pollux_dl2.run.eval_loads, eval_workloads)")
    rebuilt = table.build(summary, table.read_summary(published / "summary.csv"), bound, "full")
    if metrics != json.loads(json.dumps(rebuilt.metrics())):
        raise Dl2Error(f"{folder / 'metrics.json'}: does not follow from summary.csv, bound.csv and the published grid "
                       "(a stale run?): rerun the stage")
    for name, source in POLLUX_TABLE_FILES.items():
        _copy(folder / source, published / name)
    return list(POLLUX_TABLE_FILES)
