"""Running a candidate on the suite: one row per run (part, trace, seed, average JCT), and why a part it
cannot play is absent."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from dl2.backends.sim import simulate
from dl2.learn.rollout import run_policy
from dl2.pollux.cluster import simulate as simulate_pollux
from dl2.pollux.workload import read_workload
from dl2.score import suite
from dl2.score.candidate import Candidate
from dl2.workload.presets import POLLUX, PS_WORKER, get_preset

RUN_COLUMNS = ["part", "trace", "seed", "avg_jct"]


@dataclass(frozen=True)
class Runs:
    """A candidate's runs (`RUN_COLUMNS`), the parts it is absent from (part -> why) and the wall seconds per part."""

    runs: pd.DataFrame
    absent: dict[str, str]
    seconds: dict[str, float]


def run_suite(candidate: Candidate, seeds: Sequence[int] = suite.SEEDS, worlds: Sequence[str] = (PS_WORKER, POLLUX),
              progress: bool = True) -> Runs:
    """Every part of the suite in `worlds` that `candidate` plays; a randomized candidate once per seed of `seeds`."""
    rows: list[dict] = []
    absent: dict[str, str] = {}
    seconds: dict[str, float] = {}
    ps_parts = suite.PS_WORKER_PARTS if PS_WORKER in worlds else ()
    loads = suite.POLLUX_LOADS if POLLUX in worlds else ()
    if not candidate.plays(PS_WORKER):
        absent |= {p.label: candidate.why_absent(PS_WORKER) for p in ps_parts}
        ps_parts = ()
    if not candidate.plays(POLLUX):
        absent |= {suite.pollux_label(load): candidate.why_absent(POLLUX) for load in loads}
        loads = ()
    ps_seeds = tuple(seeds) if PS_WORKER in candidate.randomized else (0,)
    pollux_seeds = tuple(seeds) if POLLUX in candidate.randomized else (0,)
    total = sum(p.validation_traces for p in ps_parts) * len(ps_seeds) + len(loads) * len(suite.POLLUX_WORKLOADS) * len(pollux_seeds)
    with tqdm(total=total, desc=f"score {candidate.name}", unit="run", disable=not progress) as bar:
        for part in ps_parts:
            start = time.perf_counter()
            sc, traces = suite.ps_worker_traces(part)
            if candidate.model is not None and candidate.model.max_tasks != sc.preset.max_tasks:
                absent[part.label] = (f"the model was trained for max_tasks={candidate.model.max_tasks}, preset "
                                      f"{part.preset!r} has {sc.preset.max_tasks}")
                bar.update(len(traces) * len(ps_seeds))
                continue
            for seed in ps_seeds:
                if candidate.model is not None:
                    jct = run_policy(candidate.model, traces, sc, greedy=True).avg_jct
                else:
                    jct = np.array([simulate(trace, candidate.factories[PS_WORKER](seed), sc).jct.mean() for trace in traces])
                rows += [{"part": part.label, "trace": str(k), "seed": seed, "avg_jct": float(j)} for k, j in enumerate(jct)]
                bar.update(len(traces))
            seconds[part.label] = time.perf_counter() - start
        preset = get_preset(suite.POLLUX_PRESET, world=POLLUX)
        for load in loads:
            start = time.perf_counter()
            for cell in suite.pollux_cells(candidate.name, pollux_seeds, (load,)):
                run = simulate_pollux(read_workload(cell.path), candidate.factories[POLLUX](cell.seed), preset)
                rows.append({"part": suite.pollux_label(load), "trace": f"workload-{cell.workload}", "seed": cell.seed,
                             "avg_jct": float(run.jct.mean())})
                bar.update()
            seconds[suite.pollux_label(load)] = time.perf_counter() - start
    return Runs(pd.DataFrame(rows, columns=RUN_COLUMNS), absent, seconds)
