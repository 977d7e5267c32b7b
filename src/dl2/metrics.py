"""Metrics of a simulated run: JCT statistics, utilization, allocation churn, the lower bound, and what the
bound's own schedule would ask of the cluster."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from dl2.sim import engine
from dl2.sim.result import SimResult
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace


def job_table(result: SimResult, scenario: Scenario) -> pd.DataFrame:
    """One row per job: id, arrival, model, epochs, completion slot, JCT and its lower bound."""
    t = result.trace
    return pd.DataFrame(
        {
            "job_id": t.job_id,
            "arrival_slot": t.arrival,
            "model": [t.model_names[m] for m in t.model],
            "num_epochs": t.num_epochs,
            "end_slot": result.end,
            "jct": result.jct,
            "jct_lower_bound": lower_bound_jct(t, scenario),
        }
    )


def slot_table(result: SimResult) -> pd.DataFrame:
    """One row per slot: CPU and GPU utilization, tasks started or stopped, running jobs, reward."""
    s = result.stats
    cpu_cap = result.num_nodes * result.node_capacity[0]
    gpu_cap = result.num_nodes * result.node_capacity[1]
    return pd.DataFrame(
        {
            "slot": np.arange(result.num_slots),
            "cpu_util": s[:, engine.STAT_CPU_USED] / cpu_cap,
            "gpu_util": s[:, engine.STAT_GPU_USED] / gpu_cap,
            "task_changes": s[:, engine.STAT_TASK_CHANGES].astype(np.int64),
            "running_jobs": s[:, engine.STAT_RUNNING].astype(np.int64),
            "reward": s[:, engine.STAT_REWARD],
        }
    )


def summarize(result: SimResult, scenario: Scenario) -> dict[str, float]:
    """Average, median, p95, p99 JCT; makespan; utilization; churn; the lower bound and our distance to it."""
    jct = result.jct
    slots = slot_table(result)
    bound = float(lower_bound_jct(result.trace, scenario).mean())
    return {
        "avg_jct": float(jct.mean()),
        "median_jct": float(np.median(jct)),
        "p95_jct": float(np.percentile(jct, 95)),
        "p99_jct": float(np.percentile(jct, 99)),
        "makespan": float((result.end + 1).max()),
        "num_slots": int(result.num_slots),
        "mean_cpu_util": float(slots.cpu_util.mean()),
        "mean_gpu_util": float(slots.gpu_util.mean()),
        "task_changes_per_slot": float(slots.task_changes.mean()),
        "lower_bound_avg_jct": bound,
        "ratio_to_lower_bound": float(jct.mean()) / bound,
    }


def lower_bound_jct(trace: Trace, scenario: Scenario) -> np.ndarray:
    """Per job, the JCT it would have alone on the cluster at its fastest allowed #PS and #workers.

    No schedule can beat it: a job never trains faster than this, whatever else runs.
    """
    best = _best_allocations(scenario)[0]
    slots = trace.num_epochs / best[trace.model]
    return slots if scenario.options.fine_grained_jct else np.ceil(slots)


def bound_demand(trace: Trace, scenario: Scenario) -> np.ndarray:
    """Per slot until the last job ends, what the lower bound's schedule asks of the cluster: every job at its
    fastest allocation from its arrival to its bound JCT, as a fraction of the cluster's capacity in its
    scarcest resource (CPU or GPU). Above 1 no schedule can give every job that allocation, so the bound is
    out of reach there."""
    _, ps, workers = _best_allocations(scenario)
    p, c = scenario.preset, scenario.catalog
    end = np.ceil(trace.arrival + lower_bound_jct(trace, scenario)).astype(np.int64)
    demand = np.zeros((int(end.max()), 2))
    for arrival, stop, model in zip(trace.arrival, end, trace.model, strict=True):
        demand[int(arrival):stop] += ps[model] * c.ps_demand[model] + workers[model] * c.worker_demand[model]
    capacity = np.array([p.num_nodes * p.node_cpu, p.num_nodes * p.node_gpu], dtype=float)
    return (demand / capacity).max(axis=1)


def bound_reach(trace: Trace, scenario: Scenario) -> dict[str, float]:
    """The lower bound's average JCT and how far its schedule is from fitting the cluster (`bound_demand`):
    its mean and peak demand, and the share of slots where it asks for more than the cluster has."""
    demand = bound_demand(trace, scenario)
    active = demand[int(trace.arrival.min()):]
    return {"lower_bound_avg_jct": float(lower_bound_jct(trace, scenario).mean()),
            "bound_demand_mean": float(active.mean()), "bound_demand_peak": float(active.max()),
            "slots_over_capacity": float((active > 1.0).mean())}


@lru_cache(maxsize=16)
def _best_allocations(scenario: Scenario) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per model: the fastest epochs per slot over the #PS and #workers that fit on the empty cluster, and
    that #PS and #workers."""
    p, c, table = scenario.preset, scenario.catalog, scenario.true_table
    best = np.zeros(c.num_models)
    best_ps, best_workers = np.zeros(c.num_models, np.int64), np.zeros(c.num_models, np.int64)
    for m in range(c.num_models):
        speeds = table[m, 1 : p.max_tasks + 1, 1 : p.max_tasks + 1]
        for flat in np.argsort(-speeds, axis=None, kind="stable"):
            ps, workers = np.unravel_index(flat, speeds.shape)
            if _fits_alone(p.num_nodes, (p.node_cpu, p.node_gpu), c.worker_demand[m], c.ps_demand[m], ps + 1, workers + 1):
                best[m], best_ps[m], best_workers[m] = speeds[ps, workers], ps + 1, workers + 1
                break
    return best, best_ps, best_workers


def _fits_alone(num_nodes: int, capacity: tuple[int, int], worker: np.ndarray, ps: np.ndarray, num_ps: int, num_workers: int) -> bool:
    """Whether `num_ps` PS and `num_workers` workers fit on an empty cluster (bundles first, then the rest)."""
    bundles = min(num_ps, num_workers)
    singles, single = (num_workers - bundles, worker) if num_workers > num_ps else (num_ps - bundles, ps)
    bundle = worker + ps
    for _ in range(num_nodes):
        free = np.array(capacity, dtype=np.int64)
        while bundles and (free >= bundle).all():
            free -= bundle
            bundles -= 1
        while singles and (free >= single).all():
            free -= single
            singles -= 1
        if not bundles and not singles:
            return True
    return False
