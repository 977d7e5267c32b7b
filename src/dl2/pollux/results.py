"""Tables of Pollux-world runs: one row per run (`summarize`), per job (`job_table`), per interval
(`interval_table`). Times are seconds."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dl2.pollux.apps import APP_NAMES
from dl2.pollux.cluster import PolluxRun


def summarize(run: PolluxRun) -> dict[str, float]:
    """Average, median, p95, p99 JCT; makespan; GPU utilisation; restarts; time spent deciding."""
    jct = run.jct
    return {
        "avg_jct": float(jct.mean()),
        "median_jct": float(np.median(jct)),
        "p95_jct": float(np.percentile(jct, 95)),
        "p99_jct": float(np.percentile(jct, 99)),
        "makespan": float(run.completion.max()),
        "num_intervals": int(run.num_intervals),
        "mean_gpu_util": float(run.gpus_used.mean() / run.num_gpus) if run.num_intervals else 0.0,
        "restarts_per_job": float(run.restarts.mean()),
        "policy_ms_per_interval": 1e3 * run.policy_seconds / max(run.num_intervals, 1),
        "model_fit_seconds": float(run.model_seconds),
    }


def job_table(run: PolluxRun) -> pd.DataFrame:
    """One row per job: what it asked for, when it came and ended, its JCT and restarts."""
    w = run.workload
    return pd.DataFrame({
        "job": list(w.name),
        "application": [APP_NAMES[a] for a in w.app],
        "submit": w.time,
        "num_replicas": w.num_replicas,
        "batch_size": w.batch_size,
        "completion": run.completion,
        "jct": run.jct,
        "restarts": run.restarts,
    })


def interval_table(run: PolluxRun) -> pd.DataFrame:
    """One row per interval: GPUs allocated, their share of the cluster, jobs holding GPUs."""
    return pd.DataFrame({
        "interval": np.arange(run.num_intervals),
        "time": (np.arange(run.num_intervals) + 1) * run.interval_seconds,
        "gpus_used": run.gpus_used,
        "gpu_util": run.gpus_used / run.num_gpus,
        "running_jobs": run.running,
    })
