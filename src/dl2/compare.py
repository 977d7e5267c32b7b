"""Trace sets and policy comparisons: the work behind `dl2 trace generate`, `dl2 compare` and the pipeline."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from dl2.backends import load_scheduler
from dl2.backends.sim import simulate
from dl2.capacity_bound import capacity_bound
from dl2.errors import Dl2Error
from dl2.metrics import job_table, slot_table, summarize
from dl2.schedulers import Scheduler
from dl2.sim.scenario import Scenario
from dl2.workload.catalog import load_catalog
from dl2.workload.presets import Preset
from dl2.workload.traces import Trace, generate_trace, read_trace, write_trace


def generate_trace_set(preset: Preset, num_traces: int, seed: int, out_dir: str | Path,
                       arrivals: str = "ali", lengths: str = "ali") -> pd.DataFrame:
    """Write `num_traces` traces as `trace_000.csv`... into `out_dir` (replaced as a whole); returns their stats."""
    if num_traces <= 0:
        raise Dl2Error(f"num_traces: expected a positive integer, got {num_traces}")
    catalog = load_catalog(preset.speed_table)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    rows = []
    try:
        for i, child in enumerate(np.random.SeedSequence(seed).spawn(num_traces)):
            trace = generate_trace(preset, catalog, child, arrivals=arrivals, lengths=lengths)
            write_trace(trace, staging / f"trace_{i:03d}.csv")
            stats = trace.stats()
            rows.append({"preset": preset.name, "trace": f"trace_{i:03d}", **{k: v for k, v in stats.items() if k != "jobs_per_model"},
                         **{f"jobs_{m}": n for m, n in stats["jobs_per_model"].items()}})
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return pd.DataFrame(rows).fillna(0)


def trace_files(path: str | Path) -> list[Path]:
    """The CSV files of a folder (sorted), or the file itself."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.csv"))
        if not files:
            raise Dl2Error(f"{path}: no .csv traces in this folder")
        return files
    if not path.is_file():
        raise Dl2Error(f"{path}: trace file not found")
    return [path]


@dataclass(frozen=True)
class Comparison:
    """Tidy tables: one row per (trace, policy); per job; per slot."""

    summary: pd.DataFrame
    jobs: pd.DataFrame
    slots: pd.DataFrame


def compare(traces: Sequence[Path], policies: Sequence[str | Scheduler], scenario: Scenario,
            progress: bool = True) -> Comparison:
    """Every policy on every trace under `scenario`; beside each run's metrics, the trace's capacity-aware
    bound (`dl2.capacity_bound`, solved once per trace): its average JCT, the run's ratio to it, its solve time."""
    catalog = scenario.catalog
    loaded: list[tuple[str, Trace]] = [(Path(p).stem, read_trace(p, catalog)) for p in traces]
    schedulers = [load_scheduler(p) if isinstance(p, str) else p for p in policies]
    summary, jobs, slots = [], [], []
    total = len(loaded) * len(schedulers)
    with tqdm(total=total, desc=f"{scenario.preset.name}", unit="run", disable=not progress) as bar:
        for name, trace in loaded:
            bound = capacity_bound(trace, scenario, label=name)
            for scheduler in schedulers:
                result = simulate(trace, scheduler, scenario)
                key = {"preset": scenario.preset.name, "trace": name, "policy": scheduler.name}
                metrics = summarize(result, scenario)
                summary.append({**key, **metrics, "capacity_bound_avg_jct": bound.avg_jct,
                                "ratio_to_capacity_bound": metrics["avg_jct"] / bound.avg_jct,
                                "capacity_bound_seconds": bound.solve_seconds})
                jobs.append(job_table(result, scenario).assign(**key))
                slots.append(slot_table(result).assign(**key))
                bar.update()
    return Comparison(pd.DataFrame(summary), pd.concat(jobs, ignore_index=True), pd.concat(slots, ignore_index=True))


def aggregate(summary: pd.DataFrame) -> pd.DataFrame:
    """Per preset and policy: mean and spread over traces of average JCT, and the ratio to each bound."""
    grouped = summary.groupby(["preset", "policy"], sort=False)
    return grouped.agg(
        traces=("trace", "count"),
        avg_jct_mean=("avg_jct", "mean"),
        avg_jct_std=("avg_jct", "std"),
        lower_bound_mean=("lower_bound_avg_jct", "mean"),
        ratio_to_bound_mean=("ratio_to_lower_bound", "mean"),
        capacity_bound_mean=("capacity_bound_avg_jct", "mean"),
        ratio_to_capacity_bound_mean=("ratio_to_capacity_bound", "mean"),
        p95_jct_mean=("p95_jct", "mean"),
        makespan_mean=("makespan", "mean"),
        gpu_util_mean=("mean_gpu_util", "mean"),
    ).reset_index()


def metrics_tree(table: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """`aggregate`'s table as nested {preset: {policy: {metric: value}}}, for DVC metrics."""
    tree: dict[str, dict[str, dict[str, float]]] = {}
    for row in table.to_dict("records"):
        values = {k: round(float(v), 6) for k, v in row.items() if k not in ("preset", "policy") and pd.notna(v)}
        tree.setdefault(row["preset"], {})[row["policy"]] = values
    return tree


def traces_table(traces_dir: str | Path, presets: Sequence[str]) -> pd.DataFrame:
    """Every job of every trace under `traces_dir/<preset>/`, one row each."""
    frames = []
    for preset in presets:
        for path in trace_files(Path(traces_dir) / preset):
            frames.append(pd.read_csv(path).assign(preset=preset, trace=path.stem))
    return pd.concat(frames, ignore_index=True)
