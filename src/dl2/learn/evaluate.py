"""Evaluation: learned policies beside every heuristic on the same validation traces, with latency."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from dl2.learn.agent import DL2Policy, DL2Scheduler
from dl2.learn.rollout import run_policy
from dl2.metrics import lower_bound_jct
from dl2.sim.backend import SimulatedCluster
from dl2.sim.run import simulate
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace


def evaluate(learned: Mapping[str, Mapping[int, DL2Policy]], heuristics: Sequence[str], traces: Sequence[Trace],
             scenario: Scenario, seed: int = 0) -> pd.DataFrame:
    """One row per (policy, training seed, trace): average JCT and its ratio to the lower bound.

    `learned` maps a name to its policies by training seed. A learned policy appears twice: greedy
    (its most likely action, under its own name) and sampling from its softmax (`<name>-sampled`, as the
    authors validate). Heuristics are deterministic and get seed -1.
    """
    bound = np.array([lower_bound_jct(t, scenario).mean() for t in traces])
    rows = []
    for name in heuristics:
        jct = np.array([simulate(t, name, scenario).jct.mean() for t in traces])
        rows += _rows(name, -1, jct, bound)
    for name, policies in learned.items():
        for k, policy in policies.items():
            rows += _rows(name, k, run_policy(policy, traces, scenario, greedy=True).avg_jct, bound)
            rows += _rows(f"{name}-sampled", k, run_policy(policy, traces, scenario, greedy=False, seed=seed).avg_jct, bound)
    return pd.DataFrame(rows)


def summary_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per policy: mean average JCT, its spread over training seeds (sd, min, max of the per-seed means),
    the ratio to the lower bound, and the gains over DRF and Optimus."""
    per_seed = results.groupby(["policy", "seed"], sort=False).agg(avg_jct=("avg_jct", "mean"), bound=("lower_bound", "mean"))
    table = per_seed.groupby("policy", sort=False).agg(
        avg_jct=("avg_jct", "mean"), seed_sd=("avg_jct", "std"), seed_min=("avg_jct", "min"), seed_max=("avg_jct", "max"),
        seeds=("avg_jct", "size"), bound=("bound", "mean")).reset_index()
    table["seed_sd"] = table.seed_sd.fillna(0.0)
    table["ratio_to_bound"] = table.avg_jct / table.bound
    by_name = table.set_index("policy").avg_jct
    for reference in ("drf", "optimus"):
        if reference in by_name:
            table[f"gain_vs_{reference}"] = 1 - table.avg_jct / by_name[reference]
    return table


def summary_metrics(table: pd.DataFrame) -> dict[str, dict]:
    """The `evaluate` stage's DVC metrics per policy, from `summary_table`'s table."""
    return {r.policy: {"avg_jct": round(r.avg_jct, 6), "seed_sd": round(r.seed_sd, 6), "seeds": int(r.seeds),
                       "ratio_to_bound": round(r.ratio_to_bound, 6)} for r in table.itertuples()}


def _rows(policy: str, seed: int, jct: np.ndarray, bound: np.ndarray) -> list[dict]:
    return [{"policy": policy, "seed": seed, "trace": i, "avg_jct": float(j), "lower_bound": float(b),
             "ratio_to_bound": float(j / b)} for i, (j, b) in enumerate(zip(jct, bound))]


@dataclass(frozen=True)
class SlotLatency:
    seconds: float  # median time to make one slot's decisions
    decisions: float  # mean decisions per slot


def slot_latency(policy: DL2Policy, scenario: Scenario, num_jobs: int | None = None, repeats: int = 20,
                 seed: int = 0) -> SlotLatency:
    """Time for `DL2Scheduler` to make one whole slot's decisions with `num_jobs` (default: the window) jobs
    waiting, as a live scheduler would: one decision at a time, each placed before the next."""
    num_jobs = num_jobs or policy.config.window
    rng = np.random.default_rng(seed)
    names = scenario.catalog.names
    trace = Trace(job_id=np.arange(1, num_jobs + 1), arrival=np.zeros(num_jobs, dtype=np.int64),
                  model=rng.integers(0, len(names), num_jobs), num_epochs=rng.uniform(100, 3000, num_jobs),
                  model_names=tuple(names))
    observation = SimulatedCluster(trace, scenario).observe()
    scheduler = DL2Scheduler(policy, greedy=False, seed=seed)
    times, decisions = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        scheduler.schedule(observation)
        times.append(time.perf_counter() - start)
        decisions.append(scheduler.decisions)
    return SlotLatency(float(np.median(times)), float(np.mean(decisions)))
