"""How much DL2's window costs a teacher in the Pollux world: Optimus+Oracle's decisions forced through the
decision environment (`teacher_forced`) at a given window, on the artifact's workloads, beside its own run.

The window holds the first `window` active jobs in arrival order; a job outside it holds nothing that
interval. A window of the cluster's GPUs (64) holds as many jobs as could run at once, and on every shipped
cell the forced run is then the teacher's own; a smaller one keeps later jobs waiting, which a learned policy
imitating the teacher cannot undo. `python -m dl2.learn.pollux.window_check --windows 20 32 64` prints the
table docs/pollux.md quotes.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pandas as pd
from tqdm.auto import tqdm

from dl2.learn.pollux.demonstrations import teacher_forced
from dl2.pollux.cluster import simulate
from dl2.pollux.grid import LOADS, WORKLOADS, Cell
from dl2.pollux.policies import make_policy
from dl2.pollux.workload import read_workload
from dl2.workload.presets import PolluxPreset, get_preset


def window_cost(preset: PolluxPreset, windows: Sequence[int], loads: Sequence[str] = tuple(LOADS),
                workloads: Sequence[int] = WORKLOADS, teacher: str = "optimus", progress: bool = False) -> pd.DataFrame:
    """One row per (load, workload, window): the teacher's average JCT forced through the window (with
    `assign_one`, as DL2 trains) and in its own run, and their ratio."""
    rows = []
    cells = [(load, w) for load in loads for w in workloads]
    for load, w in tqdm(cells, desc="window check", unit="workload", disable=not progress):
        workload = read_workload(Cell(teacher, load, w, 0).path)
        own_jct = float(simulate(workload, make_policy(teacher), preset).jct.mean())
        for window in windows:
            forced_jct = float(teacher_forced(workload, preset, teacher, "tuned", window, assign_one=True)[3].jct.mean())
            rows.append({"load": load, "workload": w, "window": window, "forced_avg_jct": forced_jct,
                         "own_avg_jct": own_jct, "ratio": forced_jct / own_jct})
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[20, 64])
    parser.add_argument("--teacher", default="optimus", choices=["optimus", "tiresias"])
    args = parser.parse_args(argv)
    table = window_cost(get_preset("pollux"), args.windows, teacher=args.teacher, progress=True)
    means = table.groupby(["window", "load"])["ratio"].agg(["mean", "max"]).unstack("load")
    print(means.round(3).to_string())


if __name__ == "__main__":
    main()
