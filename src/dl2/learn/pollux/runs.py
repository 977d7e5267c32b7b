"""Several seeds of one Pollux-world DL2 training run, and their greedy evaluations set beside the published
baselines per cell and per load: what the `pollux-dl2` stage and `dl2 pollux-train` run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dl2.learn.pollux.evaluate import BASELINES, published_baselines
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.learn.pollux.train import PolluxTrainResult, train_dl2_pollux
from dl2.workload.presets import PolluxPreset


def train_seeds(settings: PolluxTrainSettings, preset: PolluxPreset, seeds: Sequence[int], out_dir: str | Path,
                progress: bool = True) -> dict[int, PolluxTrainResult]:
    """One training run per seed, each writing its checkpoints and tables into `out_dir/seed-<seed>`."""
    return {seed: train_dl2_pollux(settings, preset, seed, Path(out_dir) / f"seed-{seed}", progress) for seed in seeds}


def evaluations(results: dict[int, PolluxTrainResult]) -> pd.DataFrame:
    """Every run's greedy evaluation, a row per (seed, load, workload)."""
    return pd.concat([r.evaluation.assign(seed=seed) for seed, r in results.items()], ignore_index=True)


def histories(results: dict[int, PolluxTrainResult]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every run's SL and PPO histories, with a seed column."""
    return (pd.concat([r.pretrain_history.assign(seed=s) for s, r in results.items()], ignore_index=True),
            pd.concat([r.finetune_history.assign(seed=s) for s, r in results.items()], ignore_index=True))


def cells_table(evaluation: pd.DataFrame, baselines: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (load, workload): DL2's average JCT, mean and standard deviation over the seeds whose run finished
    (`runs`, `failed`), the published baselines' (`evaluate.published_baselines`) and DL2's mean over each."""
    baselines = published_baselines() if baselines is None else baselines
    grouped = evaluation.groupby(["load", "workload"])["avg_jct"]
    cells = pd.DataFrame({"dl2": grouped.mean(), "dl2_std": grouped.std(ddof=0), "runs": grouped.size(),
                          "failed": grouped.apply(lambda jct: int(jct.isna().sum()))}).reset_index()
    cells = cells.merge(baselines, on=["load", "workload"], how="left")
    for policy in BASELINES:
        if policy in cells.columns:
            cells[f"ratio_to_{policy}"] = cells["dl2"] / cells[policy]
    return cells


def loads_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per load: each policy's average JCT, mean over the workloads evaluated, and DL2's ratio to each."""
    policies = ["dl2", *(p for p in BASELINES if p in cells.columns)]
    loads = cells.groupby("load")[policies].mean().reset_index()
    loads["workloads"] = cells.groupby("load").size().to_numpy()
    for policy in policies[1:]:
        loads[f"ratio_to_{policy}"] = loads["dl2"] / loads[policy]
    return loads


def stage_metrics(cells: pd.DataFrame, loads: pd.DataFrame, seeds: Sequence[int]) -> dict:
    """The stage's DVC metrics: per load, each policy's mean average JCT and DL2's ratios; the runs that
    did not finish a workload (NaN is written as null)."""
    def number(value: float) -> float | None:
        return None if math.isnan(value) else round(float(value), 6)

    per_load = {row["load"]: {k: number(v) for k, v in row.items() if k not in ("load", "workloads")}
                for row in loads.to_dict("records")}
    return {"seeds": list(seeds), "cells": len(cells), "failed_runs": int(cells["failed"].sum()), "loads": per_load}
