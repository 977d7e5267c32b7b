"""An ablation axis's results as tables: per (cell, seed), per cell against the reference, the stage's DVC
metrics, the learning curves and how fast they converge; and the files an axis is written to, read from
and published as."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dl2.paths import write_csv_atomic

AXIS_TABLES = ("results", "summary", "curves")


def figure_file(axis: str) -> str:
    return f"{axis}.png"


def axis_files(axis: str) -> tuple[str, ...]:
    """The files an `ablate` stage writes per axis (`<axis>/` under the group's folder), which `dl2
    publish` copies and the reproduction report reads: its tables and its figure."""
    return *(f"{name}.csv" for name in AXIS_TABLES), figure_file(axis)


def axis_tables(results: list[dict], reference: str) -> dict[str, pd.DataFrame]:
    """An axis's tables from its (cell, seed) results: per seed, per cell, and the learning curves."""
    table = results_table(results)
    return {"results": table, "summary": summary(table, reference), "curves": curves(results)}


def write_axis(folder: str | Path, frames: dict[str, pd.DataFrame]) -> None:
    """Write an axis's tables (`axis_tables`) into its folder, atomically each."""
    for name in AXIS_TABLES:
        write_csv_atomic(Path(folder) / f"{name}.csv", frames[name])


def read_axis(folder: str | Path) -> dict[str, pd.DataFrame]:
    """An axis folder's tables by name (`results`, `summary`, `curves`), cells read as labels."""
    return {name: pd.read_csv(Path(folder) / f"{name}.csv", dtype={"cell": str}) for name in AXIS_TABLES}


def results_table(results: list[dict]) -> pd.DataFrame:
    """One row per (cell, seed): validation JCT (greedy, sampled), the lower bound, and Optimus and the
    pretraining teacher in the same world (`teacher`: absent from results stored before it was measured)."""
    keys = ("axis", "cell", "run", "seed", "val_jct_greedy", "val_jct_sampled", "lower_bound", "optimus")
    table = pd.DataFrame([{k: r[k] for k in keys} for r in results])
    if all("teacher" in r for r in results):
        table["teacher"] = [r["teacher"] for r in results]
    return table


def summary(results: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per cell: mean, spread (sd, min, max over seeds) of the greedy validation JCT, its ratio to the
    bound, how much worse than the reference cell it is (`vs_reference`: 0.2 = 20% worse) and than Optimus
    in the same world (`vs_optimus`) and than the cell's pretraining teacher (`vs_teacher`, where `results`
    has the teacher's JCT); `reference` marks the reference cell."""
    teacher = {"teacher": ("teacher", "mean")} if "teacher" in results else {}
    table = results.groupby("cell", sort=False).agg(
        jct=("val_jct_greedy", "mean"), sd=("val_jct_greedy", "std"), min=("val_jct_greedy", "min"),
        max=("val_jct_greedy", "max"), jct_sampled=("val_jct_sampled", "mean"), seeds=("seed", "size"),
        bound=("lower_bound", "mean"), optimus=("optimus", "mean"), **teacher).reset_index()
    table["sd"] = table["sd"].fillna(0.0)
    table["ratio_to_bound"] = table.jct / table.bound
    table["vs_reference"] = table.jct / float(table.set_index("cell").loc[reference, "jct"]) - 1.0
    table["vs_optimus"] = table.jct / table.optimus - 1.0
    if teacher:
        table["vs_teacher"] = table.jct / table.teacher - 1.0
    table["reference"] = table.cell == reference
    return table


def axis_metrics(table: pd.DataFrame, reference: str, seeds: int) -> dict:
    """An axis's entry in the `ablate` stage's DVC metrics, from `summary`'s table."""
    return {"reference": reference, "seeds": seeds,
            "cells": {r.cell: {"jct": round(r.jct, 6), "sd": round(r.sd, 6), "ratio_to_bound": round(r.ratio_to_bound, 6),
                               "vs_reference": round(r.vs_reference, 6)} for r in table.itertuples()}}


def curves(results: list[dict]) -> pd.DataFrame:
    """The learning curves: validation JCT against update, per cell and seed (columns in one order, whether
    a result was just trained or read back from its file)."""
    first = ["cell", "seed", "update"]
    frames = [pd.DataFrame(r["history"]).assign(cell=r["cell"], seed=r["seed"]) for r in results if r["history"]]
    if not frames:
        return pd.DataFrame(columns=[*first, "val_jct_greedy"])
    frame = pd.concat(frames, ignore_index=True)
    return frame[first + sorted(c for c in frame.columns if c not in first)]


CONVERGENCE_COLUMNS = ["cell", "seed", "target", "update", "decisions", "seconds"]


def convergence(curve_frame: pd.DataFrame, within: float = 0.05) -> pd.DataFrame:
    """Per cell and seed: when the run first reached its seed's common target, a greedy validation JCT
    within `within` of the worst cell's best in that seed (so that every cell reaches it): the update, the
    decisions taken by then (samples) and the wall seconds since fine-tuning began. All cells are timed to
    one quality; timing each to within `within` of its own best would make a run that stalls early look fast."""
    best = curve_frame.groupby(["seed", "cell"]).val_jct_greedy.min()
    target = (1 + within) * best.groupby(level="seed").max()
    rows = []
    for (cell, seed), run in curve_frame.groupby(["cell", "seed"], sort=False):
        reached = run[run.val_jct_greedy <= target[seed]].iloc[0]
        rows.append({"cell": cell, "seed": seed, "target": float(target[seed]), "update": int(reached["update"]),
                     "decisions": int(reached["decisions"]), "seconds": float(reached.get("seconds", np.nan))})
    return pd.DataFrame(rows, columns=CONVERGENCE_COLUMNS)
