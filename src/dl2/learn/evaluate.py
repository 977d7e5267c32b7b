"""Evaluation: learned policies beside every heuristic on the same validation traces."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dl2.capacity_bound import capacity_bound
from dl2.distributed.executor import LOCAL, Executor
from dl2.distributed.jobs import run_jobs
from dl2.learn.agent import DL2Policy
from dl2.learn.rollout import run_policy
from dl2.learn.settings import FinetuneRuns
from dl2.learn.workflow import model_name
from dl2.metrics import lower_bound_jct
from dl2.schedulers.builtin import simulate_builtin
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace

RUN_LABELS = {"sl-rl": "dl2", "rl-only": "rl-only", "offline-rl": "offline-rl"}  # a fine-tuning run, as the report names it
REFERENCES = {"DRF": "drf", "Optimus": "optimus", "SL only": "sl-only"}  # Fig. 10's reference lines


def load_learned(models: Path, runs: FinetuneRuns) -> dict[str, dict[int, DL2Policy]]:
    """The fine-tuned policies under `models/finetune/` by label (`RUN_LABELS`) and seed, and the pretrained
    policy alone (`sl-only`)."""
    learned = {RUN_LABELS[run]: {seed: DL2Policy.load(models / "finetune" / f"{model_name(run, seed)}.pt") for seed in runs.seeds}
               for run in runs.runs}
    learned["sl-only"] = {0: DL2Policy.load(models / "pretrained.pt")}
    return learned


def reference_jcts(summary: pd.DataFrame, results: pd.DataFrame) -> dict[str, float]:
    """Fig. 10's horizontal lines: DRF, Optimus and the pretrained policy where evaluated, and the lower bound."""
    jct = summary.set_index("policy").avg_jct
    return {label: float(jct[policy]) for label, policy in REFERENCES.items() if policy in jct} | \
        {"lower bound": float(results.lower_bound.mean())}


def evaluate(learned: Mapping[str, Mapping[int, DL2Policy]], heuristics: Sequence[str], traces: Sequence[Trace],
             scenario: Scenario, seed: int = 0, executor: Executor = LOCAL) -> pd.DataFrame:
    """One row per (policy, training seed, trace): average JCT and its ratio to the lower bound and to the
    capacity-aware bound (`dl2.capacity_bound`, solved once per trace).

    `learned` maps a name to its policies by training seed. A learned policy appears twice: greedy
    (its most likely action, under its own name) and sampling from its softmax (`<name>-sampled`, as the
    authors validate). Heuristics are deterministic and get seed -1. On a Ray `executor`, each policy plays
    the traces as a task of its own; locally, all in this process.
    """
    bound = np.array([lower_bound_jct(t, scenario).mean() for t in traces])
    capacity = np.array([capacity_bound(t, scenario, label=f"validation trace {i}").avg_jct for i, t in enumerate(traces)])
    jobs = [(name, -1, None, traces, scenario, seed) for name in heuristics] + \
        [(name, k, policy, traces, scenario, seed) for name, policies in learned.items() for k, policy in policies.items()]
    rows = []
    for _, played in run_jobs(_play, jobs, 1, executor=executor):
        for name, k, jct in played:
            rows += _rows(name, k, jct, bound, capacity)
    return pd.DataFrame(rows)


def _play(name: str, k: int, policy: DL2Policy | None, traces: Sequence[Trace], scenario: Scenario,
          seed: int) -> list[tuple[str, int, np.ndarray]]:
    """(label, seed, average JCT per trace): heuristic `name` (`policy` None), or a learned policy greedily
    and sampling."""
    if policy is None:
        return [(name, k, np.array([simulate_builtin(t, name, scenario).jct.mean() for t in traces]))]
    return [(name, k, run_policy(policy, traces, scenario, greedy=True).avg_jct),
            (f"{name}-sampled", k, run_policy(policy, traces, scenario, greedy=False, seed=seed).avg_jct)]


def summary_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per policy: mean average JCT, its spread over training seeds (sd, min, max of the per-seed means),
    the ratio to the lower bound (and to the capacity-aware bound where `results` has it: files written
    before it existed do not), and the gains over DRF and Optimus."""
    capacity = "capacity_bound" in results
    bounds = {"bound": ("lower_bound", "mean")} | ({"capacity_bound": ("capacity_bound", "mean")} if capacity else {})
    per_seed = results.groupby(["policy", "seed"], sort=False).agg(avg_jct=("avg_jct", "mean"), **bounds)
    table = per_seed.groupby("policy", sort=False).agg(
        avg_jct=("avg_jct", "mean"), seed_sd=("avg_jct", "std"), seed_min=("avg_jct", "min"), seed_max=("avg_jct", "max"),
        seeds=("avg_jct", "size"), **{name: (name, "mean") for name in bounds}).reset_index()
    table["seed_sd"] = table.seed_sd.fillna(0.0)
    table["ratio_to_bound"] = table.avg_jct / table.bound
    if capacity:
        table["ratio_to_capacity_bound"] = table.avg_jct / table.capacity_bound
    by_name = table.set_index("policy").avg_jct
    for reference in ("drf", "optimus"):
        if reference in by_name:
            table[f"gain_vs_{reference}"] = 1 - table.avg_jct / by_name[reference]
    return table


def summary_metrics(table: pd.DataFrame) -> dict[str, dict]:
    """The `evaluate` stage's DVC metrics per policy, from `summary_table`'s table (the ratio to the
    capacity-aware bound where the table has it)."""
    capacity = "ratio_to_capacity_bound" in table
    return {r.policy: {"avg_jct": round(r.avg_jct, 6), "seed_sd": round(r.seed_sd, 6), "seeds": int(r.seeds),
                       "ratio_to_bound": round(r.ratio_to_bound, 6)}
            | ({"ratio_to_capacity_bound": round(r.ratio_to_capacity_bound, 6)} if capacity else {})
            for r in table.itertuples()}


def _rows(policy: str, seed: int, jct: np.ndarray, bound: np.ndarray, capacity: np.ndarray) -> list[dict]:
    return [{"policy": policy, "seed": seed, "trace": i, "avg_jct": float(j), "lower_bound": float(b),
             "ratio_to_bound": float(j / b), "capacity_bound": float(c), "ratio_to_capacity_bound": float(j / c)}
            for i, (j, b, c) in enumerate(zip(jct, bound, capacity, strict=True))]
