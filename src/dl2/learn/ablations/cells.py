"""Running an ablation group's cells: each (cell, seed) trains, is evaluated on the validation traces and
stores its result as soon as it ends, so an interrupted stage resumes at the next cell.

Independent cells run in one pool of processes. Cells that pretrain alike (most change only fine-tuning)
share one pretrained policy per seed, and cells that compute the same (the reference cells of several
axes, say) train once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dl2.distributed.executor import LOCAL, Executor
from dl2.distributed.jobs import run_jobs
from dl2.learn import workflow
from dl2.learn.ablations.plan import AblationPlan, Cell
from dl2.learn.agent import DL2Policy
from dl2.learn.pretrain import pretrain
from dl2.learn.rollout import run_policy
from dl2.learn.settings import RUNS, LearnSettings
from dl2.metrics import lower_bound_jct
from dl2.paths import write_json_atomic
from dl2.schedulers.builtin import simulate_builtin
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace


def stored_result(cell: Cell, seed: int, out_dir: Path) -> dict | None:
    """The result `run_plans` stored for `cell` and `seed` under `out_dir`, if it is of this very cell."""
    path = out_dir / f"{cell.label}-s{seed}.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("digest") == cell.digest(seed):
            return stored
    return None


def run_cell(cell: Cell, seed: int, out_dir: Path) -> dict:
    """Train `cell` with `seed` (resuming its checkpoint under `out_dir`) and evaluate it on the validation
    traces: the result `run_plans` stores as `<out_dir>/<label>-s<seed>.json`."""
    digest = cell.digest(seed)
    torch.set_num_threads(1)
    settings = cell.settings
    measured = workflow.scenario(settings)
    train, validation = workflow.split_traces(settings, measured)
    checkpoint = out_dir / f"{cell.label}-s{seed}.ckpt"  # removed by `run_plans` once the result is stored
    run = RUNS[cell.run]
    policy = _pretrained(cell, seed, settings, train, validation, measured, out_dir.parent / "pretrained") if run.pretrained else None
    history = pd.DataFrame()
    if run.speed_model is not None:  # fine-tuned
        policy, history = workflow.finetune_run(cell.run, seed, settings, cell.finetune, policy, checkpoint)
        history = history.drop(columns=["run", "chosen"])
    greedy = run_policy(policy, validation, measured, greedy=True).avg_jct
    sampled = run_policy(policy, validation, measured, greedy=False, seed=seed).avg_jct
    bound = np.array([lower_bound_jct(t, measured).mean() for t in validation])
    teacher = cell.pretrain.teacher
    heuristic = {name: np.mean([simulate_builtin(t, name, measured).jct.mean() for t in validation])
                 for name in dict.fromkeys(("optimus", teacher))}  # simulated once when the teacher is Optimus
    result = {"axis": cell.axis, "cell": cell.label, "run": cell.run, "seed": seed, "digest": digest,
              "val_jct_greedy": float(np.mean(greedy)), "val_jct_sampled": float(np.mean(sampled)),
              "lower_bound": float(np.mean(bound)), "optimus": float(heuristic["optimus"]), "teacher": float(heuristic[teacher]),
              "history": history.to_dict(orient="list")}
    return result


def _pretrained(cell: Cell, seed: int, settings: LearnSettings, train: list[Trace], validation: list[Trace],
                measured: Scenario, store: Path) -> DL2Policy:
    """The cell's pretrained policy, shared by every cell of the group that pretrains alike (most change only
    fine-tuning): stored under `store`, keyed by the learn settings (canonical: an override that repeats
    the network's own value is none), the pretraining config and the seed."""
    key = repr((settings.canonical(), cell.pretrain, seed))
    path = store / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    if path.is_file():
        return DL2Policy.load(path)
    policy, _ = pretrain(train, validation, measured, workflow.network(settings), replace(cell.pretrain, seed=seed))
    policy.save(path, extra={"stage": "ablate", "key": key})
    return policy


def run_plans(plans: list[AblationPlan], cells_dir: str | Path, workers: int, progress: bool = True,
              executor: Executor = LOCAL) -> dict[str, list[dict]]:
    """Every (cell, seed) of every plan (a group's axes), `workers` at a time in one pool of processes or
    as Ray tasks (`executor`); each axis's results, in plan order, stored under `<cells_dir>/<axis>` as
    each cell ends, by this process. A cell stored before is not trained again."""
    from tqdm.auto import tqdm

    jobs = [(plan.axis, cell, seed) for plan in plans for cell in plan.cells for seed in plan.seeds]
    for plan in plans:
        (Path(cells_dir) / plan.axis).mkdir(parents=True, exist_ok=True)
    digests = [cell.digest(seed) for _, cell, seed in jobs]
    first: dict[str, int] = {}  # digest -> the job that trains it
    for index, digest in enumerate(digests):
        first.setdefault(digest, index)
    unique = list(first.values())
    bar = tqdm(total=len(jobs), desc="ablation cells", disable=not progress)
    results: dict[tuple[str, str, int], dict] = {}

    def finish(trained: int, result: dict) -> None:
        """Store `result` as that of every cell computing what job `trained` computed."""
        for index, (axis, cell, seed) in enumerate(jobs):
            if digests[index] == digests[trained]:
                results[axis, cell.label, seed] = _store(result, axis, cell, seed, Path(cells_dir) / axis)
                bar.update()
        axis, cell, seed = jobs[trained]
        (Path(cells_dir) / axis / f"{cell.label}-s{seed}.ckpt").unlink(missing_ok=True)

    to_train = []
    for i in unique:
        axis, cell, seed = jobs[i]
        stored = stored_result(cell, seed, Path(cells_dir) / axis)
        if stored is None:
            to_train.append(i)
        else:
            finish(i, stored)
    args = [(jobs[i][1], jobs[i][2], Path(cells_dir) / jobs[i][0]) for i in to_train]
    for k, result in run_jobs(run_cell, args, workers, in_order=False, executor=executor):
        finish(to_train[k], result)
    bar.close()
    return {plan.axis: [results[plan.axis, cell.label, seed] for cell in plan.cells for seed in plan.seeds] for plan in plans}


def _store(result: dict, axis: str, cell: Cell, seed: int, out_dir: Path) -> dict:
    """`result` (trained by `cell` or by a cell that computes the same: the same digest) as `cell`'s own,
    written to `cell`'s file unless stored there already."""
    mine = {**result, "axis": axis, "cell": cell.label}
    if stored_result(cell, seed, out_dir) is None:
        write_json_atomic(out_dir / f"{cell.label}-s{seed}.json", mine)
    return mine
