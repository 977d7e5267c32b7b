"""Policies of the Pollux world compared on workloads: every policy on every workload (a randomized
policy once per seed), as tidy tables, and their aggregate per policy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import pandas as pd
from tqdm.auto import tqdm

from dl2.pollux.bound import lower_bound_jct
from dl2.pollux.cluster import simulate
from dl2.pollux.policies import RANDOMIZED, make_policy
from dl2.pollux.results import interval_table, job_table, summarize
from dl2.pollux.workload import read_workload
from dl2.workload.presets import PolluxPreset


class PolluxTables(NamedTuple):
    """One row per (workload, policy, seed); per job; per interval."""

    summary: pd.DataFrame
    jobs: pd.DataFrame
    intervals: pd.DataFrame


def runs_of(policies: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """(policy, seed) of every run: a randomized policy once per seed, the others once (seed 0)."""
    return [(p, s) for p in policies for s in (seeds if p in RANDOMIZED else seeds[:1])]


def compare(workloads: Sequence[Path], policies: Sequence[str], preset: PolluxPreset, seeds: Sequence[int] = (0,),
            progress: bool = True) -> PolluxTables:
    """Every policy on every workload file under `preset`, each run's average JCT beside the world's lower bound
    (`dl2.pollux.bound`)."""
    loaded = [(Path(p).stem, read_workload(p)) for p in workloads]
    pairs = runs_of(policies, seeds)
    summary, jobs, intervals = [], [], []
    with tqdm(total=len(loaded) * len(pairs), desc=preset.name, unit="run", disable=not progress) as bar:
        for name, workload in loaded:
            for policy, seed in pairs:
                run = simulate(workload, make_policy(policy, seed), preset)
                key = {"preset": preset.name, "trace": name, "policy": policy, "seed": seed}
                bound = lower_bound_jct(workload, preset)
                summary.append({**key, **summarize(run), "lower_bound_avg_jct": float(bound.mean()),
                                "ratio_to_lower_bound": float(run.jct.mean() / bound.mean())})
                jobs.append(job_table(run).assign(jct_lower_bound=bound, **key))
                intervals.append(interval_table(run).assign(**key))
                bar.update()
    return PolluxTables(pd.DataFrame(summary), pd.concat(jobs, ignore_index=True), pd.concat(intervals, ignore_index=True))


def aggregate(summary: pd.DataFrame) -> pd.DataFrame:
    """Per preset and policy: mean and spread over workloads and seeds of the average JCT, and the means of
    the other measures."""
    return summary.groupby(["preset", "policy"], sort=False).agg(
        runs=("trace", "count"),
        avg_jct_mean=("avg_jct", "mean"),
        avg_jct_std=("avg_jct", "std"),
        p95_jct_mean=("p95_jct", "mean"),
        makespan_mean=("makespan", "mean"),
        gpu_util_mean=("mean_gpu_util", "mean"),
        restarts_per_job=("restarts_per_job", "mean"),
        policy_ms_per_interval=("policy_ms_per_interval", "mean"),
    ).reset_index()
