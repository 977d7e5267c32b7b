"""The artifact's Fig. 8a grid: every policy on the 8 shipped workloads at each relative job load, beside
the average JCTs the artifact stored (`data/reference/pollux/expected_results.json`), with tolerance
verdicts:

- Optimus+Oracle and Tiresias are deterministic: each cell within `DETERMINISTIC_TOLERANCE` (0.1%);
- Pollux is randomized: over at least `MIN_SEEDS` seeds, each workload's mean within `WORKLOAD_TOLERANCE`
  (10%), each load's mean over the 8 workloads within `LOAD_TOLERANCE` (5%), and Pollux's reductions
  against the other two within `REDUCTION_TOLERANCE` (5 points) of the artifact's.

A cell's result is stored under a digest of the cell, the preset and the Pollux world's code and data, so
an interrupted grid resumes and a changed world reruns.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from dl2.distributed.executor import LOCAL, Executor
from dl2.distributed.jobs import run_jobs
from dl2.errors import Dl2Error
from dl2.paths import PACKAGE_DIR, REFERENCE_DIR, write_json_atomic
from dl2.pollux.cluster import simulate
from dl2.pollux.policies import RANDOMIZED, make_policy
from dl2.pollux.results import summarize
from dl2.pollux.workload import read_workload
from dl2.workload.presets import PolluxPreset

POLLUX_DATA = REFERENCE_DIR / "pollux"
LOADS = {"0.5": "workloads-0.5", "1.0": "workloads", "1.5": "workloads-1.5", "2.0": "workloads-2.0"}
WORKLOADS = tuple(range(1, 9))
DETERMINISTIC_TOLERANCE = 0.001
WORKLOAD_TOLERANCE = 0.10
LOAD_TOLERANCE = 0.05
REDUCTION_TOLERANCE = 0.05
MIN_SEEDS = 3


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a policy on one shipped workload at one load, with one seed."""

    policy: str
    load: str  # "0.5", "1.0", "1.5" or "2.0"
    workload: int  # 1..8
    seed: int

    @property
    def label(self) -> str:
        return f"{self.policy}-{self.load}-w{self.workload}-s{self.seed}"

    @property
    def path(self) -> Path:
        return POLLUX_DATA / LOADS[self.load] / f"workload-{self.workload}.csv"


def load_name(load: float) -> str:
    """A relative job load as the grid names it ("1.0"), or an error listing the shipped ones."""
    name = f"{float(load):.1f}"
    if name not in LOADS:
        raise Dl2Error(f"load: the artifact ships workloads at loads {', '.join(LOADS)}, not {load!r}")
    return name


def plan(policies: Sequence[str], loads: Sequence[float], workloads: Sequence[int], seeds: Sequence[int]) -> list[Cell]:
    """The cells to run: every policy at every (load, workload); a randomized policy once per seed, the others once."""
    for w in workloads:
        if w not in WORKLOADS:
            raise Dl2Error(f"workloads: the artifact ships workloads 1..8, not {w!r}")
    cells = []
    for policy in policies:
        randomized = policy in RANDOMIZED
        for load in map(load_name, loads):
            for w in workloads:
                cells += [Cell(policy, load, w, s) for s in (seeds if randomized else seeds[:1])]
    return cells


@lru_cache(maxsize=1)
def world_fingerprint() -> str:
    """A digest of the Pollux world's code and data: a stored cell from another version is stale."""
    digest = hashlib.sha256()
    for path in sorted((PACKAGE_DIR / "pollux").rglob("*.py")) + sorted(p for p in POLLUX_DATA.rglob("*") if p.is_file()):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cell_digest(cell: Cell, preset: PolluxPreset) -> str:
    return hashlib.sha256(repr((cell, preset, world_fingerprint())).encode()).hexdigest()[:16]


def run_cell(cell: Cell, preset: PolluxPreset) -> dict:
    """One cell's run: its summary and every job's completion and restarts."""
    run = simulate(read_workload(cell.path), make_policy(cell.policy, cell.seed), preset)
    return {"cell": asdict(cell), "digest": cell_digest(cell, preset), "summary": summarize(run),
            "jobs": {"name": list(run.workload.name), "completion": run.completion.tolist(), "restarts": run.restarts.tolist()}}


def run_grid(cells: Sequence[Cell], preset: PolluxPreset, store: Path | None = None, workers: int = 1,
             executor: Executor = LOCAL) -> Iterator[dict]:
    """Every cell's result as it is ready: those stored in `store` (under the same digest) first, then the
    others run `workers` at a time (or as Ray tasks), each stored as it ends."""
    todo = []
    for cell in cells:
        stored = _stored(store, cell, preset)
        if stored is not None:
            yield stored
        else:
            todo.append(cell)
    for _, result in run_jobs(run_cell, [(cell, preset) for cell in todo], workers, in_order=False, executor=executor):
        if store is not None:
            write_json_atomic(store / f"{Cell(**result['cell']).label}.json", result)
        yield result


def _stored(store: Path | None, cell: Cell, preset: PolluxPreset) -> dict | None:
    path = store / f"{cell.label}.json" if store is not None else None
    if path is None or not path.is_file():
        return None
    result = json.loads(path.read_text())
    return result if result.get("digest") == cell_digest(cell, preset) else None


def expected_results() -> dict[str, dict[str, dict]]:
    """The artifact's stored average JCTs: policy -> load -> {"avgs": {"workload-k": s}, "mean": s}."""
    return json.loads((POLLUX_DATA / "expected_results.json").read_text())["results"]


def summary_table(results: Sequence[dict]) -> pd.DataFrame:
    """One row per run, its cell beside its summary, in grid order."""
    rows = [{**r["cell"], **r["summary"]} for r in results]
    return pd.DataFrame(rows).sort_values(["policy", "load", "workload", "seed"], kind="mergesort", ignore_index=True)


def jobs_table(results: Sequence[dict]) -> pd.DataFrame:
    """One row per job of every run."""
    frames = [pd.DataFrame(r["jobs"]).assign(**r["cell"]) for r in results]
    return pd.concat(frames, ignore_index=True)


def cells_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (policy, load, workload): our average JCT (mean and spread over seeds) beside the artifact's, the
    relative error, the tolerance and whether it holds (None: a randomized policy with fewer than
    `MIN_SEEDS` seeds, not judged)."""
    expected = expected_results()
    grouped = summary.groupby(["policy", "load", "workload"], sort=True).avg_jct
    table = grouped.agg(seeds="count", ours="mean", ours_sd="std").reset_index()
    table["artifact"] = [expected[p][load]["avgs"][f"workload-{w}"] for p, load, w in zip(table.policy, table.load, table.workload)]
    table["rel_error"] = table.ours / table.artifact - 1
    randomized = table.policy.isin(RANDOMIZED)
    table["tolerance"] = np.where(randomized, WORKLOAD_TOLERANCE, DETERMINISTIC_TOLERANCE)
    judged = ~randomized | (table.seeds >= MIN_SEEDS)
    table["within"] = [bool(abs(e) <= t) if j else None for e, t, j in zip(table.rel_error, table.tolerance, judged)]
    return table


def loads_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (policy, load): the mean over the workloads run of ours and of the artifact's; judged (within the
    load tolerance) once all 8 workloads ran with enough seeds."""
    rows = []
    for (policy, load), group in cells.groupby(["policy", "load"], sort=True):
        complete = len(group) == len(WORKLOADS) and group.within.notna().all()
        tolerance = LOAD_TOLERANCE if policy in RANDOMIZED else DETERMINISTIC_TOLERANCE
        ours, artifact = group.ours.mean(), group.artifact.mean()
        rows.append({"policy": policy, "load": load, "workloads": len(group), "seeds": int(group.seeds.min()), "ours": ours,
                     "artifact": artifact, "rel_error": ours / artifact - 1, "tolerance": tolerance,
                     "within": bool(abs(ours / artifact - 1) <= tolerance) if complete else None})
    return pd.DataFrame(rows)


def reductions_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per load and baseline: Pollux's reduction of the average JCT against it, ours beside the artifact's, on
    the workloads both ran; judged (within `REDUCTION_TOLERANCE` points) on all 8 with enough seeds."""
    rows = []
    pollux = cells[cells.policy == "pollux"]
    for baseline in ("optimus", "tiresias"):
        other = cells[cells.policy == baseline]
        for load, mine in pollux.groupby("load", sort=True):
            both = mine.merge(other[other.load == load], on=["load", "workload"], suffixes=("", "_base"))
            if both.empty:
                continue
            ours = 1 - both.ours.mean() / both.ours_base.mean()
            artifact = 1 - both.artifact.mean() / both.artifact_base.mean()
            complete = len(both) == len(WORKLOADS) and both.within.notna().all()
            rows.append({"load": load, "baseline": baseline, "workloads": len(both), "ours": ours, "artifact": artifact,
                         "difference": ours - artifact,
                         "within": bool(abs(ours - artifact) <= REDUCTION_TOLERANCE) if complete else None})
    return pd.DataFrame(rows, columns=["load", "baseline", "workloads", "ours", "artifact", "difference", "within"])


def grid_metrics(cells: pd.DataFrame, loads: pd.DataFrame, reductions: pd.DataFrame) -> dict:
    """The DVC metrics: how many verdicts hold, the per-load means beside the artifact's, and the reductions
    (no wall times: the same cells give the same metrics)."""
    def number(v: float) -> float:
        return round(float(v), 6)

    judged = pd.concat([cells.within, loads.within, reductions.within]).dropna()
    return {
        "verdicts": len(judged), "within_tolerance": int(judged.sum()),
        "cells_within": {p: f"{int(g.within.dropna().sum())}/{int(g.within.notna().sum())}" for p, g in cells.groupby("policy")},
        "loads": {f"{r.policy}@{r.load}": {"ours": number(r.ours), "artifact": number(r.artifact), "rel_error": number(r.rel_error),
                                           "workloads": int(r.workloads), "within": r.within} for r in loads.itertuples()},
        "reductions": {f"vs_{r.baseline}@{r.load}": {"ours": number(r.ours), "artifact": number(r.artifact), "within": r.within}
                       for r in reductions.itertuples()},
    }
