"""One DL2 training run in the Pollux world (issue 35): SL pretraining on a teacher's decisions over
workloads from the Philly-derived generator (seeds other than the artifact's), optional DAgger rounds on
the teacher's labels of the learner's own states, PPO fine-tuning on the
same workloads, greedy evaluation on the artifact's workloads beside the published baselines, a
checkpoint after each stage. Deterministic given the seed and torch's thread count (`settings.threads`).
A run's `run.json` is written last: `finished_run` reads back a run that wrote one, to resume a set of runs."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dl2.checkout import git_commit
from dl2.learn.pollux.checkpoint import load_checkpoint, save_checkpoint
from dl2.learn.pollux.demonstrations import teacher_decisions
from dl2.learn.pollux.evaluate import beside_baselines, evaluate_greedy
from dl2.learn.pollux.finetune import finetune
from dl2.learn.pollux.model import PolluxNets, pollux_net_config
from dl2.learn.pollux.pretrain import Demonstrations, dagger, fit
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.paths import write_csv_atomic, write_json_atomic
from dl2.pollux.philly import generate_workload, load_philly
from dl2.pollux.workload import Workload
from dl2.workload.presets import PolluxPreset


@dataclass
class PolluxTrainResult:
    """What a run produced: its networks, each stage's history, the evaluation and the seconds each took."""

    nets: PolluxNets
    pretrain_history: pd.DataFrame
    finetune_history: pd.DataFrame
    evaluation: pd.DataFrame  # greedy summaries per (load, workload)
    comparison: pd.DataFrame  # average JCTs beside the published baselines
    seconds: dict[str, float]


def training_workloads(settings: PolluxTrainSettings) -> list[Workload]:
    """The generator's workloads of the training seeds, as many jobs as the artifact's at `train_load`."""
    philly = load_philly()  # read once: it takes seconds
    return [generate_workload(settings.train_jobs, seed, philly=philly) for seed in settings.train_seeds]


def train_dl2_pollux(settings: PolluxTrainSettings, preset: PolluxPreset, seed: int, out_dir: str | Path | None = None,
                     progress: bool = True) -> PolluxTrainResult:
    """SL, then PPO, then greedy evaluation; with `out_dir`, the checkpoints (`pretrained.pt`,
    `finetuned.pt`), histories, evaluation and timings are written there."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        return _train(settings, preset, seed, Path(out_dir) if out_dir is not None else None, progress)
    finally:
        torch.set_num_threads(previous_threads)


def _train(settings: PolluxTrainSettings, preset: PolluxPreset, seed: int, out_dir: Path | None,
           progress: bool) -> PolluxTrainResult:
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    nets = PolluxNets(pollux_net_config(settings))
    workloads = training_workloads(settings)
    demonstrated = teacher_decisions(workloads, preset, settings.teacher, settings.variant, settings.window,
                                     settings.assign_one, progress)
    seconds["demonstrations"] = time.perf_counter() - clock

    clock = time.perf_counter()
    data = Demonstrations.encode(nets, *demonstrated)  # once, for SL and every DAgger round
    del demonstrated
    pretrain_history = fit(nets, data, settings, generator, progress).assign(round=0)
    seconds["pretrain"] = time.perf_counter() - clock
    if settings.dagger_rounds:
        clock = time.perf_counter()
        rounds = dagger(nets, data, workloads, preset, settings, generator, progress)
        pretrain_history = pd.concat([pretrain_history, rounds], ignore_index=True)
        seconds["dagger"] = time.perf_counter() - clock
    demonstrations = len(data)
    del data  # the demonstrations' memory back before fine-tuning
    if out_dir is not None:
        save_checkpoint(out_dir / "pretrained.pt", nets, settings, "pretrained", seed)

    clock = time.perf_counter()
    finetune_history = finetune(nets, workloads, preset, settings, rng, progress)
    seconds["finetune"] = time.perf_counter() - clock
    if out_dir is not None:
        save_checkpoint(out_dir / "finetuned.pt", nets, settings, "finetuned", seed)

    clock = time.perf_counter()
    evaluation = evaluate_greedy(nets, preset, settings.variant, settings.eval_loads, settings.eval_workloads, progress,
                                 assign_one=settings.assign_one)
    comparison = beside_baselines(evaluation)
    seconds["evaluate"] = time.perf_counter() - clock
    if out_dir is not None:
        write_csv_atomic(out_dir / "pretrain_history.csv", pretrain_history)
        write_csv_atomic(out_dir / "finetune_history.csv", finetune_history)
        write_csv_atomic(out_dir / "evaluation.csv", evaluation)
        write_csv_atomic(out_dir / "comparison.csv", comparison)
        write_json_atomic(out_dir / "run.json", {"seed": seed, "settings": settings.to_dict(), "seconds": seconds,
                                                  "decisions": demonstrations, "commit": git_commit()})
    return PolluxTrainResult(nets, pretrain_history, finetune_history, evaluation, comparison, seconds)


def finished_run(out_dir: str | Path, settings: PolluxTrainSettings, seed: int) -> PolluxTrainResult | None:
    """The run `train_dl2_pollux` finished in `out_dir` with these settings and seed, read back from its files
    (the networks after fine-tuning); None where none finished there, or one with other settings or seed."""
    out_dir = Path(out_dir)
    try:
        done = json.loads((out_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    wanted = json.loads(json.dumps(settings.to_dict()))  # as JSON holds it: tuples as lists
    if done.get("seed") != seed or done.get("settings") != wanted:
        return None
    nets = load_checkpoint(out_dir / "finetuned.pt")[0]

    def read(name: str, **dtypes: type) -> pd.DataFrame:
        return pd.read_csv(out_dir / name, dtype={"load": str, **dtypes})

    evaluation = read("evaluation.csv", error=str)
    evaluation["error"] = evaluation["error"].fillna("")  # no error: an empty cell
    return PolluxTrainResult(nets, read("pretrain_history.csv"), read("finetune_history.csv"), evaluation,
                             read("comparison.csv"), done["seconds"])
