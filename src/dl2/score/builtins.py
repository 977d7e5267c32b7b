"""The built-ins on the suite, computed once and published (`data/published/scoreboard/`), so that a user's
scheduler is ranked among them without rerunning them.

- PS/worker heuristics (FIFO, SRTF, DRF, Tetris, Optimus): scored here (about a second for all).
- DL2: no model is committed; the suite's traces are the published evaluations' validation traces, so its
  greedy per-trace JCTs are read from `data/published/<preset>/results.csv` (three training seeds).
- Pollux world (Optimus+Oracle, Tiresias, Pollux): the suite's cells are the published grid's, so they are read
  from `data/published/pollux/summary.csv` (Pollux over seeds 0, 1, 2: 96 runs of 55 minutes on two cores).

The bounds of every trace and workload are published beside them (`bounds.csv`), so a score never recomputes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from dl2.capacity_bound import capacity_bound
from dl2.errors import Dl2Error
from dl2.metrics import lower_bound_jct
from dl2.paths import repo_root, write_csv_atomic, write_json_atomic, write_text_atomic
from dl2.pollux.bound import lower_bound_jct as pollux_bound
from dl2.pollux.policies import POLICIES as POLLUX_POLICIES
from dl2.pollux.workload import read_workload
from dl2.schedulers.builtin import BUILTIN_POLICIES
from dl2.score import board, suite
from dl2.score.candidate import resolve
from dl2.score.runs import RUN_COLUMNS, run_suite
from dl2.workload.presets import POLLUX, PS_WORKER, get_preset

PUBLISHED = repo_root() / "data" / "published"
SCOREBOARD = PUBLISHED / "scoreboard"
BUILTIN_COLUMNS = ["policy", "provenance", *RUN_COLUMNS]
BOUND_COLUMNS = ["part", "trace", *board.BOUNDS, "capacity_seconds"]
SCORED = "scored by dl2 score"


def bounds_table(progress: bool = True) -> pd.DataFrame:
    """Per part and trace: the contention-free bound (in the Pollux world, each job alone: `dl2.pollux.bound`),
    and in the PS/worker world the capacity-aware bound and its solve seconds."""
    rows = []
    for part in tqdm(suite.PS_WORKER_PARTS, desc="bounds", unit="preset", disable=not progress):
        sc, traces = suite.ps_worker_traces(part)
        for k, trace in enumerate(traces):
            capacity = capacity_bound(trace, sc, label=f"{part.label} trace {k}")
            rows.append({"part": part.label, "trace": str(k), "contention_free": float(lower_bound_jct(trace, sc).mean()),
                         "capacity": capacity.avg_jct, "capacity_seconds": capacity.solve_seconds})
    preset = get_preset(suite.POLLUX_PRESET, world=POLLUX)
    for cell in suite.pollux_cells("optimus", (0,)):  # a cell's workload is the same for every policy and seed
        rows.append({"part": suite.pollux_label(cell.load), "trace": f"workload-{cell.workload}",
                     "contention_free": float(pollux_bound(read_workload(cell.path), preset).mean())})
    return pd.DataFrame(rows, columns=BOUND_COLUMNS)


def builtin_runs(published: Path = PUBLISHED, progress: bool = True) -> pd.DataFrame:
    """Every built-in's runs on the suite (`BUILTIN_COLUMNS`): the heuristics scored, DL2 and the Pollux world
    read from the published results (see the module's docstring)."""
    frames = []
    for name in BUILTIN_POLICIES:
        runs = run_suite(resolve(name), worlds=(PS_WORKER,), progress=progress).runs
        frames.append(runs.assign(policy=name, provenance=SCORED))
    for part in suite.PS_WORKER_PARTS:
        source = published / part.preset / "results.csv"
        results = pd.read_csv(source)
        dl2 = results[(results.policy == "dl2") & (results.seed >= 0)]
        if dl2.empty:
            raise Dl2Error(f"{source}: no dl2 rows (per training seed and trace)")
        frames.append(pd.DataFrame({"policy": "dl2", "provenance": source.relative_to(published.parents[1]).as_posix(),
                                    "part": part.label, "trace": dl2.trace.astype(str), "seed": dl2.seed, "avg_jct": dl2.avg_jct}))
    source = published / "pollux" / "summary.csv"
    grid = pd.read_csv(source, dtype={"load": str})
    for load in suite.POLLUX_LOADS:
        for policy in POLLUX_POLICIES:
            cells = grid[(grid.policy == policy) & (grid.load == load) & grid.workload.isin(suite.POLLUX_WORKLOADS)]
            seeds = suite.SEEDS if policy == "pollux" else (0,)
            if sorted(zip(cells.workload, cells.seed)) != sorted((w, s) for w in suite.POLLUX_WORKLOADS for s in seeds):
                raise Dl2Error(f"{source}: {policy} at load {load} does not hold every workload of the suite once per seed {seeds}")
            frames.append(pd.DataFrame({"policy": policy, "provenance": source.relative_to(published.parents[1]).as_posix(),
                                        "part": suite.pollux_label(load), "trace": "workload-" + cells.workload.astype(str),
                                        "seed": cells.seed, "avg_jct": cells.avg_jct}))
    return pd.concat(frames, ignore_index=True)[BUILTIN_COLUMNS]


def builtin_scores(runs: pd.DataFrame, bounds: pd.DataFrame) -> pd.DataFrame:
    """Each built-in's score per part, ranked among the built-ins of that part."""
    table = board.summarize(runs, bounds)
    return board.rank(table, table)


def publish(out: Path = SCOREBOARD, progress: bool = True) -> list[Path]:
    """Score the built-ins and write the scoreboard into `out`: runs.csv, bounds.csv, score.json, score.md."""
    bounds = bounds_table(progress)
    runs = builtin_runs(progress=progress)
    scores = builtin_scores(runs, bounds)
    files = [out / "runs.csv", out / "bounds.csv", out / "score.json", out / "score.md"]
    write_csv_atomic(files[0], runs)
    write_csv_atomic(files[1], bounds)
    write_json_atomic(files[2], board.board_json(scores))
    write_text_atomic(files[3], board.board_markdown(scores))
    return files


def load(folder: Path = SCOREBOARD) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The published built-ins' runs and the suite's bounds, checked to be of this suite version."""
    try:
        version = json.loads((folder / "score.json").read_text())["suite_version"]
        runs = pd.read_csv(folder / "runs.csv", dtype={"trace": str})
        bounds = pd.read_csv(folder / "bounds.csv", dtype={"trace": str})
    except (OSError, KeyError, ValueError) as exc:
        raise Dl2Error(f"{folder}: no published scoreboard ({exc}): run `dl2 score --builtins`") from None
    if version != suite.SUITE_VERSION:
        raise Dl2Error(f"{folder / 'score.json'}: the scoreboard is of suite version {version}, this dl2's suite is "
                       f"{suite.SUITE_VERSION}: run `dl2 score --builtins`")
    return runs, bounds
