"""Greedy evaluation in the Pollux world: the trained policy runs through the world's own `simulate` on the
artifact's workloads (held out from training), beside the published JCTs of the built-in policies on the
same cells (`data/published/pollux/summary.csv`; a randomized policy's mean over its seeds)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from dl2.errors import Dl2Error
from dl2.learn.pollux.fast_greedy import FastGreedy
from dl2.learn.pollux.model import PolluxNets
from dl2.learn.pollux.policy import DL2PolluxPolicy
from dl2.paths import DATA_DIR
from dl2.pollux.cluster import simulate
from dl2.pollux.grid import Cell, load_name
from dl2.pollux.results import summarize
from dl2.pollux.workload import read_workload
from dl2.workload.presets import PolluxPreset

PUBLISHED_SUMMARY = DATA_DIR / "published" / "pollux" / "summary.csv"
BASELINES = ("optimus", "tiresias", "pollux")
MAX_SECONDS = 7 * 24 * 3600  # a policy that has not finished a workload in a week (the built-ins take < 1 day) fails it


def evaluate_greedy(nets: PolluxNets, preset: PolluxPreset, variant: str, loads: Sequence[str], workloads: Sequence[int],
                    progress: bool = False, max_seconds: int = MAX_SECONDS, assign_one: bool = False) -> pd.DataFrame:
    """One row per (load, workload): the greedy policy's run summary (`dl2.pollux.results.summarize`), or,
    where the run failed (a policy that leaves jobs waiting past `max_seconds`), NaN numbers and the error.
    `assign_one` as the policy was trained (`dl2.learn.pollux.decisions`)."""
    decide = FastGreedy(nets)  # nets.greedy()'s decisions, without a torch call for each
    rows = []
    cells = [(load_name(float(load)), w) for load in loads for w in workloads]
    for load, w in tqdm(cells, desc="greedy evaluation", unit="workload", disable=not progress):
        cell = Cell(f"dl2-{variant}", load, w, 0)
        policy = DL2PolluxPolicy(decide, variant, nets.config.window, name=cell.policy, assign_one=assign_one)
        workload = read_workload(cell.path)  # a missing or malformed file is an error, not a failed run
        try:
            summary, error = summarize(simulate(workload, policy, preset, max_seconds=max_seconds)), ""
        except Dl2Error as exc:
            summary, error = {"avg_jct": float("nan")}, str(exc)
        rows.append({"policy": cell.policy, "load": load, "workload": w, **summary, "error": error})
    return pd.DataFrame(rows)


def published_baselines(path: Path = PUBLISHED_SUMMARY) -> pd.DataFrame:
    """The published average JCT of each built-in per (load, workload), a column per policy."""
    if not path.is_file():
        raise Dl2Error(f"{path}: the published Pollux grid is missing (`dvc pull` or the pollux stage writes it)")
    summary = pd.read_csv(path, dtype={"load": str})
    table = summary.groupby(["load", "workload", "policy"])["avg_jct"].mean().unstack("policy")
    return table[[p for p in BASELINES if p in table.columns]].reset_index()


def beside_baselines(evaluation: pd.DataFrame, path: Path = PUBLISHED_SUMMARY) -> pd.DataFrame:
    """The evaluation's average JCTs with the baselines' on the same cells and DL2's ratio to each."""
    baselines = published_baselines(path)
    out = evaluation[["load", "workload", "avg_jct"]].merge(baselines, on=["load", "workload"], how="left")
    for policy in BASELINES:
        if policy in out.columns:
            out[f"ratio_to_{policy}"] = out["avg_jct"] / out[policy]
    return out
