"""`dl2 bench --pollux`: how fast the Pollux world runs. The compiled job step in microseconds per
job-interval, and per policy, on the artifact's workload 6 at 1x load (the one its README runs): the wall time
of a run, the policy's milliseconds per interval and the seconds spent fitting jobs' throughput models."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from dl2.bench_record import finish, stamp
from dl2.pollux import kernels
from dl2.pollux.apps import app_tables, load_applications
from dl2.pollux.cluster import simulate
from dl2.pollux.grid import POLLUX_DATA
from dl2.pollux.policies import POLICIES, make_policy
from dl2.pollux.workload import read_workload
from dl2.workload.presets import POLLUX, get_preset

WORKLOAD = POLLUX_DATA / "workloads" / "workload-6.csv"


def job_step_microseconds(intervals: int = 200) -> float:
    """Microseconds per job-interval of `kernels.advance_all`: every job of the workload holding the GPUs it
    asked for, packed 4 to a node, training 60-s intervals (restarted every 20 intervals, so epochs and
    completions happen all along)."""
    workload = read_workload(WORKLOAD)
    tables = app_tables(load_applications())
    jobs = kernels.make_jobs(workload.app, np.zeros(len(workload), dtype=np.int64), workload.batch_size)
    for j, replicas in enumerate(workload.num_replicas):
        counts = [4] * (replicas // 4) + ([replicas % 4] if replicas % 4 else [])
        jobs.counts[j, : len(counts)] = counts
        jobs.nnodes[j] = len(counts)
        jobs.step_sync_bsz[j] = -1
        kernels.set_batch(jobs, j, tables[jobs.app[j]])
    left, clock = np.zeros(len(workload), dtype=np.int64), np.zeros(len(workload), dtype=np.int64)
    kernels.advance_all(jobs, 60, 0, tables, False, left, clock)  # compiled before timing
    elapsed = 0.0
    for k in range(intervals):
        if k % 20 == 0:
            jobs.progress[:], jobs.epoch[:], jobs.completion[:] = 0.0, 0, -1
        start = time.perf_counter()
        kernels.advance_all(jobs, 60, 60 * k, tables, False, left, clock)
        elapsed += time.perf_counter() - start
    return 1e6 * elapsed / (intervals * len(workload))


def pollux_benchmark(out: str | Path | None = None, seed: int = 0) -> dict:
    """The job step's speed and each policy's on workload 6 at 1x load; written as JSON to `out`."""
    preset = get_preset("pollux", world=POLLUX)
    workload = read_workload(WORKLOAD)
    results: dict = {**stamp(), "workload": str(WORKLOAD.relative_to(POLLUX_DATA)), "job_step_us_per_job_interval": job_step_microseconds(),
                     "policies": {}}
    for policy in POLICIES:
        simulate(workload.first(12), make_policy(policy, seed), preset)  # compiled (or loaded from cache) before timing
        start = time.perf_counter()
        run = simulate(workload, make_policy(policy, seed), preset)
        wall = time.perf_counter() - start
        results["policies"][policy] = {"run_seconds": wall, "intervals": run.num_intervals, "avg_jct": float(run.jct.mean()),
                                       "policy_ms_per_interval": 1e3 * run.policy_seconds / run.num_intervals,
                                       "model_fit_seconds": run.model_seconds,
                                       "ms_per_interval": 1e3 * wall / run.num_intervals}
    return finish(results, out)
