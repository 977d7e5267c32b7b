"""Ablations: what each part of DL2 is worth, one axis at a time (the `ablate` stages, one per group of axes).

`params.yaml`'s `ablations` section holds the axes and their groups. A cell of an axis is a set of overrides of the
`learn`, `pretrain` and `finetune` sections (applied on top of the scale's, `ablations.scales[scale]`,
and the axis's own `base`), plus the `run` it trains: `sl-rl` (DL2), `rl-only`, `offline-rl` or `sl-only` (the pretrained
policy alone). Every cell runs once per seed in `ablations.seeds`; the seed drives pretraining and
fine-tuning alike. Each (cell, seed) writes its result as soon as it ends, so an interrupted axis resumes
where it stopped, and independent cells run in parallel processes. Cells that pretrain alike (most change
only fine-tuning) share one pretrained policy per seed, and cells that compute the same (the reference
cells of several axes, say) train once.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import pandas as pd

from dl2.errors import Dl2Error
from dl2.learn.processes import run_jobs
from dl2.paths import write_json_atomic

if TYPE_CHECKING:
    from dl2.learn.agent import DL2Policy
    from dl2.learn.workflow import LearnSettings
    from dl2.sim.scenario import Scenario
    from dl2.workload.traces import Trace

RUNS = ("sl-rl", "rl-only", "offline-rl", "sl-only")
SECTIONS = ("learn", "pretrain", "finetune")


@dataclass(frozen=True)
class Cell:
    """One cell of an axis: its label, the run it trains, and the full params it trains with."""

    axis: str
    label: str
    run: str
    params: dict  # learn, pretrain, finetune sections after every override

    def digest(self, seed: int, params_file: str | None = None) -> str:
        """Identifies what this cell computes with `seed`: a stored result with another digest is stale. It
        hashes the typed settings the cell trains with and its preset, so keys that change only how runs are
        scheduled (`finetune.workers`, `runs`, `seeds`) leave stored results valid."""
        from dl2.config import get_preset
        from dl2.learn import workflow

        settings = workflow.canonical(workflow.learn_settings(self.params))
        text = repr((self.run, get_preset(settings.preset, params_file), settings, workflow.pretrain_config(self.params),
                     workflow.finetune_config(self.params), seed))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AblationPlan:
    axis: str
    cells: tuple[Cell, ...]
    reference: str  # the label of the cell every other is compared with (full DL2)
    seeds: tuple[int, ...]
    workers: int


def group_axes(params: Mapping[str, Any], group: str, where: str = "params.yaml") -> list[str]:
    """The axes one `ablate` stage runs (`ablations.groups[group]`), each a key of `ablations.axes`."""
    section = params.get("ablations") or {}
    groups = section.get("groups") or {}
    if group not in groups:
        raise Dl2Error(f"{where}: ablations.groups: no group {group!r} (known: {', '.join(groups) or 'none'})")
    axes = groups[group]
    if not isinstance(axes, list) or not axes or any(a not in (section.get("axes") or {}) for a in axes):
        raise Dl2Error(f"{where}: ablations.groups.{group}: expected a list of axes of ablations.axes, got {axes!r}")
    return list(axes)


def plan(params: Mapping[str, Any], axis: str, where: str = "params.yaml") -> AblationPlan:
    """The cells of `axis`, each checked as the stages would check it (errors name the cell and key)."""
    from dl2.learn import workflow

    section = params.get("ablations") or {}
    axes = section.get("axes") or {}
    if axis not in axes:
        raise Dl2Error(f"{where}: ablations.axes: no axis {axis!r} (known: {', '.join(axes) or 'none'})")
    spec = axes[axis] or {}
    seeds = workflow.seed_list(section.get("seeds", [0]), "ablations.seeds", where)
    workers = workflow.worker_count(section.get("workers", 0), "ablations.workers", where)
    cells_spec = spec.get("cells") or {}
    if not cells_spec:
        raise Dl2Error(f"{where}: ablations.axes.{axis}.cells: expected at least one cell")
    scales = section.get("scales") or {}
    scale = section.get("scale", "reduced")
    if scale not in scales:
        raise Dl2Error(f"{where}: ablations.scale: expected one of {', '.join(scales) or 'the keys of ablations.scales'}, got {scale!r}")
    main = {name: copy.deepcopy(params.get(name) or {}) for name in SECTIONS}
    base = _merge(main, scales[scale] or {}, f"{where}: ablations.scales.{scale}")
    base = _merge(base, spec.get("base") or {}, f"{where}: ablations.axes.{axis}.base")
    cells = []
    for label, overrides in cells_spec.items():
        at = f"{where}: ablations.axes.{axis}.cells.{label}"
        overrides = dict(overrides or {})
        run = overrides.pop("run", "sl-rl")
        if run not in RUNS:
            raise Dl2Error(f"{at}.run: expected one of {', '.join(RUNS)}, got {run!r}")
        cell_params = _merge(base, overrides, at)
        workflow.learn_settings(cell_params, at)
        workflow.pretrain_config(cell_params, at)
        workflow.finetune_config(cell_params, at)
        cells.append(Cell(axis, str(label), run, cell_params))
    reference = str(spec.get("reference", cells[0].label))
    if reference not in {c.label for c in cells}:
        raise Dl2Error(f"{where}: ablations.axes.{axis}.reference: {reference!r} is not one of the axis's cells")
    return AblationPlan(axis, tuple(cells), reference, tuple(seeds), workers)


def _merge(base: Mapping[str, Any], overrides: Mapping[str, Any], where: str) -> dict:
    """`base` with the sections of `overrides` merged in, key by key."""
    out = copy.deepcopy(dict(base))
    for name, values in overrides.items():
        if name not in SECTIONS:
            raise Dl2Error(f"{where}: {name}: expected one of {', '.join(SECTIONS)} (or run)")
        if not isinstance(values, Mapping):
            raise Dl2Error(f"{where}.{name}: expected a mapping of {name} keys")
        out[name] = {**out.get(name, {}), **copy.deepcopy(dict(values))}
    return out


def run_cell(cell: Cell, seed: int, params_file: str | None, out_dir: Path) -> dict:
    """Train `cell` with `seed` (resuming its checkpoint), evaluate it on the validation traces, and store
    the result as `<out_dir>/<label>-s<seed>.json`; a stored result for the same digest is returned as is."""
    import torch

    from dl2.learn import workflow
    from dl2.learn.rollout import run_policy
    from dl2.metrics import lower_bound_jct
    from dl2.sim.run import simulate

    path = out_dir / f"{cell.label}-s{seed}.json"
    digest = cell.digest(seed, params_file)
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("digest") == digest:
            return stored
    torch.set_num_threads(1)
    settings = workflow.learn_settings(cell.params)
    measured = workflow.scenario(settings, params_file)
    train, validation = workflow.split_traces(settings, measured)
    checkpoint = out_dir / f"{cell.label}-s{seed}.ckpt"
    policy = None if cell.run == "rl-only" else _pretrained(cell, seed, settings, train, validation, measured,
                                                             out_dir.parent / "pretrained")
    history = pd.DataFrame()
    if cell.run != "sl-only":
        rl = replace(workflow.finetune_config(cell.params), seed=seed)
        policy, history = workflow.finetune_run(cell.run, settings, rl, policy, checkpoint, params_file)
        history = history.drop(columns=["run", "chosen"])
    greedy = run_policy(policy, validation, measured, greedy=True).avg_jct
    sampled = run_policy(policy, validation, measured, greedy=False, seed=seed).avg_jct
    bound = np.array([lower_bound_jct(t, measured).mean() for t in validation])
    teacher = workflow.pretrain_config(cell.params).teacher
    heuristic = {name: np.mean([simulate(t, name, measured).jct.mean() for t in validation])
                 for name in dict.fromkeys(("optimus", teacher))}  # simulated once when the teacher is Optimus
    result = {"axis": cell.axis, "cell": cell.label, "run": cell.run, "seed": seed, "digest": digest,
              "val_jct_greedy": float(np.mean(greedy)), "val_jct_sampled": float(np.mean(sampled)),
              "lower_bound": float(np.mean(bound)), "optimus": float(heuristic["optimus"]), "teacher": float(heuristic[teacher]),
              "history": history.to_dict(orient="list")}
    write_json_atomic(path, result)
    checkpoint.unlink(missing_ok=True)
    return result


def _pretrained(cell: Cell, seed: int, settings: LearnSettings, train: list[Trace], validation: list[Trace],
                measured: Scenario, store: Path) -> DL2Policy:
    """The cell's pretrained policy, shared by every cell of the group that pretrains alike (most change only
    fine-tuning): stored under `store`, keyed by the preset, the learn settings (canonical: an override that
    repeats the network's own value is none), the pretraining config and the seed."""
    from dl2.learn import workflow
    from dl2.learn.agent import DL2Policy
    from dl2.learn.pretrain import pretrain

    key = repr((measured.preset, workflow.canonical(settings), workflow.pretrain_config(cell.params), seed))
    path = store / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    if path.is_file():
        return DL2Policy.load(path)
    policy, _ = pretrain(train, validation, measured, workflow.network(settings),
                         replace(workflow.pretrain_config(cell.params), seed=seed))
    policy.save(path, extra={"stage": "ablate", "key": key})
    return policy


def run_plans(plans: list[AblationPlan], params_file: str | None, cells_dir: str | Path,
              progress: bool = True) -> dict[str, list[dict]]:
    """Every (cell, seed) of every plan (a group's axes), `workers` at a time in one pool of processes;
    each axis's results, in plan order, stored under `<cells_dir>/<axis>`."""
    from tqdm.auto import tqdm

    jobs = [(plan.axis, cell, seed) for plan in plans for cell in plan.cells for seed in plan.seeds]
    for plan in plans:
        (Path(cells_dir) / plan.axis).mkdir(parents=True, exist_ok=True)
    digests = [cell.digest(seed, params_file) for _, cell, seed in jobs]
    first: dict[str, int] = {}  # digest -> the job that trains it
    for index, digest in enumerate(digests):
        first.setdefault(digest, index)
    unique = list(first.values())
    workers = max((plan.workers for plan in plans), default=1)
    bar = tqdm(total=len(jobs), desc="ablation cells", disable=not progress)
    results: dict[tuple[str, str, int], dict] = {}
    args = [(jobs[i][1], jobs[i][2], params_file, Path(cells_dir) / jobs[i][0]) for i in unique]
    for k, result in run_jobs(run_cell, args, workers, in_order=False):
        for index, (axis, cell, seed) in enumerate(jobs):
            if digests[index] == digests[unique[k]]:
                results[axis, cell.label, seed] = _as_cell(result, axis, cell, seed, Path(cells_dir) / axis)
                bar.update()
    bar.close()
    return {plan.axis: [results[plan.axis, cell.label, seed] for cell in plan.cells for seed in plan.seeds] for plan in plans}


def _as_cell(result: dict, axis: str, cell: Cell, seed: int, out_dir: Path) -> dict:
    """`result`, trained by a cell that computes the same (the same digest), stored as `cell`'s own."""
    if (result["axis"], result["cell"]) == (axis, cell.label):
        return result
    mine = {**result, "axis": axis, "cell": cell.label}
    write_json_atomic(out_dir / f"{cell.label}-s{seed}.json", mine)
    return mine


def results_table(results: list[dict]) -> pd.DataFrame:
    """One row per (cell, seed): validation JCT (greedy, sampled), the lower bound, and Optimus and the
    pretraining teacher in the same world (`teacher`: absent from results stored before it was measured)."""
    keys = ("axis", "cell", "run", "seed", "val_jct_greedy", "val_jct_sampled", "lower_bound", "optimus")
    table = pd.DataFrame([{k: r[k] for k in keys} for r in results])
    if all("teacher" in r for r in results):
        table["teacher"] = [r["teacher"] for r in results]
    return table


def summary(results: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Per cell: mean, spread (sd, min, max over seeds) of the greedy validation JCT, its ratio to the
    bound, how much worse than the reference cell it is (`vs_reference`: 0.2 = 20% worse) and than Optimus
    in the same world (`vs_optimus`) and than the cell's pretraining teacher (`vs_teacher`, where `results`
    has the teacher's JCT); `reference` marks the reference cell."""
    teacher = {"teacher": ("teacher", "mean")} if "teacher" in results else {}
    table = results.groupby("cell", sort=False).agg(
        jct=("val_jct_greedy", "mean"), sd=("val_jct_greedy", "std"), min=("val_jct_greedy", "min"),
        max=("val_jct_greedy", "max"), jct_sampled=("val_jct_sampled", "mean"), seeds=("seed", "size"),
        bound=("lower_bound", "mean"), optimus=("optimus", "mean"), **teacher).reset_index()
    table["sd"] = table["sd"].fillna(0.0)
    table["ratio_to_bound"] = table.jct / table.bound
    table["vs_reference"] = table.jct / float(table.set_index("cell").loc[reference, "jct"]) - 1.0
    table["vs_optimus"] = table.jct / table.optimus - 1.0
    if teacher:
        table["vs_teacher"] = table.jct / table.teacher - 1.0
    table["reference"] = table.cell == reference
    return table


def axis_metrics(table: pd.DataFrame, reference: str, seeds: int) -> dict:
    """An axis's entry in the `ablate` stage's DVC metrics, from `summary`'s table."""
    return {"reference": reference, "seeds": seeds,
            "cells": {r.cell: {"jct": round(r.jct, 6), "sd": round(r.sd, 6), "ratio_to_bound": round(r.ratio_to_bound, 6),
                               "vs_reference": round(r.vs_reference, 6)} for r in table.itertuples()}}


def curves(results: list[dict]) -> pd.DataFrame:
    """The learning curves: validation JCT against update, per cell and seed (columns in one order, whether
    a result was just trained or read back from its file)."""
    first = ["cell", "seed", "update"]
    frames = [pd.DataFrame(r["history"]).assign(cell=r["cell"], seed=r["seed"]) for r in results if r["history"]]
    if not frames:
        return pd.DataFrame(columns=[*first, "val_jct_greedy"])
    frame = pd.concat(frames, ignore_index=True)
    return frame[first + sorted(c for c in frame.columns if c not in first)]


def convergence(curve_frame: pd.DataFrame, within: float = 0.05) -> pd.DataFrame:
    """Per cell and seed: the first update whose greedy validation JCT is within `within` of the run's
    best (how fast it converges), and the decisions taken by then."""
    rows = []
    for (cell, seed), run in curve_frame.groupby(["cell", "seed"], sort=False):
        reached = run[run.val_jct_greedy <= (1 + within) * run.val_jct_greedy.min()].iloc[0]
        rows.append({"cell": cell, "seed": seed, "update": int(reached["update"]), "decisions": int(reached["decisions"])})
    return pd.DataFrame(rows, columns=["cell", "seed", "update", "decisions"])


def log_cells(ablation: AblationPlan, table: pd.DataFrame, curve_frame: pd.DataFrame, parent_run_id: str | None) -> None:
    """One MLflow run per cell, tagged with the axis and the cell (nested under the stage's run): the
    cell's parameters, its summary row, and each seed's learning curve."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from dl2 import tracking

    client = MlflowClient(tracking.tracking_uri())
    experiment = tracking.experiment_id()
    rows = table.set_index("cell")
    now = int(time.time() * 1000)
    for cell in ablation.cells:
        tags = {"dl2.stage": "ablate", "dl2.axis": ablation.axis, "dl2.cell": cell.label,
                "dl2.reference": str(cell.label == ablation.reference).lower()}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run_id = client.create_run(experiment, run_name=f"{ablation.axis}={cell.label}", tags=tags).info.run_id
        params = [Param(key, value) for key, value in tracking.flatten({"run": cell.run, **cell.params}).items()]
        metrics = [Metric(key, float(rows.loc[cell.label, key]), now, 0)
                   for key in ("jct", "sd", "min", "max", "jct_sampled", "ratio_to_bound", "vs_reference", "vs_optimus", "vs_teacher")
                   if key in rows]
        mine = curve_frame[curve_frame.cell == cell.label]
        metrics += [Metric(f"val_jct_greedy.s{seed}", float(jct), now, int(update))
                    for seed, update, jct in zip(mine["seed"], mine["update"], mine["val_jct_greedy"])]
        client.log_batch(run_id, metrics=metrics, params=params)
        client.set_terminated(run_id, "FINISHED")
