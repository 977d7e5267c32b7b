"""Several Pollux-world DL2 training runs (each variant x each seed) and their greedy evaluations as one summary
in the baselines' format, set beside the published baselines and the lower bound (`dl2.pollux.table`): what
the `pollux-dl2` stage and `dl2 pollux-train` run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dl2.learn.pollux.evaluate import PUBLISHED_SUMMARY
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.learn.pollux.train import PolluxTrainResult, finished_run, train_dl2_pollux
from dl2.pollux import table
from dl2.workload.presets import PolluxPreset

Runs = dict[tuple[str, int], PolluxTrainResult]  # (variant, seed) -> its run


def train_runs(settings: Sequence[PolluxTrainSettings], preset: PolluxPreset, seeds: Sequence[int], out_dir: str | Path,
               progress: bool = True) -> Runs:
    """One training run per settings (a variant each) and seed, each writing its checkpoints and tables into
    `out_dir/<variant>/seed-<seed>`; a run already finished there with the same settings and seed is read back,
    not trained again (so an interrupted set of runs resumes at the first unfinished one)."""
    results = {}
    for s in settings:
        for seed in seeds:
            folder = Path(out_dir) / s.variant / f"seed-{seed}"
            run = finished_run(folder, s, seed)
            if run is None:
                run = train_dl2_pollux(s, preset, seed, folder, progress)
            elif progress:
                print(f"{folder}: finished earlier with these settings; read back (delete it to train again)")
            results[(s.variant, seed)] = run
    return results


def summary(results: Runs) -> pd.DataFrame:
    """Every run's greedy evaluation, a row per (policy, load, workload, seed) as the baselines' `summary.csv`
    (policy `dl2-<variant>`), with the error of a run that did not finish."""
    frames = [r.evaluation.assign(seed=seed) for (_, seed), r in results.items()]
    out = pd.concat(frames, ignore_index=True)
    first = ["policy", "load", "workload", "seed"]
    return out[first + [c for c in out.columns if c not in first]]


def histories(results: Runs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every run's SL and PPO histories, with variant and seed columns."""
    def tagged(frames: dict) -> pd.DataFrame:
        return pd.concat([f.assign(variant=v, seed=s) for (v, s), f in frames.items()], ignore_index=True)

    return (tagged({k: r.pretrain_history for k, r in results.items()}),
            tagged({k: r.finetune_history for k, r in results.items()}))


def beside_baselines(dl2_summary: pd.DataFrame, preset: PolluxPreset, scale: str,
                     baselines: Path = PUBLISHED_SUMMARY) -> table.PolluxTable:
    """DL2's runs beside the published baselines' and the lower bound on the cells DL2 ran (`dl2.pollux.table`)."""
    cells = sorted(set(zip(dl2_summary.load, dl2_summary.workload)))
    return table.build(dl2_summary, table.read_summary(baselines), table.bound_cells(preset, cells), scale)
