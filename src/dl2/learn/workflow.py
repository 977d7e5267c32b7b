"""The learning stages as functions the notebooks call: settings from `params.yaml`, traces, runs.

`learn` (shared), `pretrain`, `finetune` and `evaluate` sections are checked here, with errors naming
the key. Training and validation traces come from one seed and never overlap.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pandas as pd
import torch

from dl2.config import get_preset
from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy
from dl2.learn.nets import NET_PRESETS, NetConfig, net_config
from dl2.learn.pretrain import PretrainConfig
from dl2.learn.processes import run_jobs
from dl2.learn.rl import RLConfig, Trainer
from dl2.sim.scenario import Scenario, SimOptions
from dl2.workload.traces import ARRIVAL_PATTERNS, Trace, generate_trace


@dataclass(frozen=True)
class LearnSettings:
    preset: str = "paper"
    window: int = 20
    network: str = "paper"
    hidden: tuple[int, ...] | None = None
    one_hot: bool | None = None
    batch_norm: bool | None = None
    assign_bundle: bool = True
    train_traces: int = 40
    validation_traces: int = 10
    seed: int = 7
    arrivals: str = "ali"  # the arrival pattern of the training and validation traces
    speed_noise: float = 0.0  # true speeds off the speed model by up to this fraction (dl2.sim.scenario.SimOptions)
    epoch_error: float = 0.0  # the epochs schedulers are told off the true ones by up to this fraction


def _typed(cls, section: Mapping[str, Any] | None, name: str, where: str):
    """Build dataclass `cls` from a params section, naming the bad key in errors."""
    section = dict(section or {})
    known = {f.name: f for f in fields(cls)}
    for key, value in section.items():
        if key not in known:
            raise Dl2Error(f"{where}: {name}.{key}: unknown key (known: {', '.join(known)})")
        default = known[key].default
        if key in ("one_hot", "batch_norm") and value is not None and not isinstance(value, bool):
            raise Dl2Error(f"{where}: {name}.{key}: expected true, false or null, got {value!r}")
        if key == "hidden" and value is not None:
            if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
                raise Dl2Error(f"{where}: {name}.hidden: expected a list of positive integers, got {value!r}")
            section[key] = tuple(value)
        elif default is not None and not isinstance(default, tuple):
            kind = type(default)
            ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                section[key], ok = float(value), True
            if not ok:
                raise Dl2Error(f"{where}: {name}.{key}: expected {kind.__name__}, got {value!r}")
            if kind in (int, float) and value < 0:
                raise Dl2Error(f"{where}: {name}.{key}: expected a non-negative number, got {value!r}")
    try:
        return cls(**section)
    except Dl2Error as exc:
        raise Dl2Error(f"{where}: {name}: {exc}") from None


def learn_settings(params: Mapping[str, Any], where: str = "params.yaml") -> LearnSettings:
    s = _typed(LearnSettings, params.get("learn"), "learn", where)
    if s.network not in NET_PRESETS:
        raise Dl2Error(f"{where}: learn.network: expected one of {', '.join(NET_PRESETS)}, got {s.network!r}")
    if s.train_traces <= 0 or s.validation_traces <= 0 or s.window <= 0:
        raise Dl2Error(f"{where}: learn: train_traces, validation_traces and window must be positive")
    for key in ("speed_noise", "epoch_error"):
        if getattr(s, key) >= 1.0:
            raise Dl2Error(f"{where}: learn.{key}: expected a number in [0, 1), got {getattr(s, key)!r}")
    if s.arrivals not in ARRIVAL_PATTERNS:
        raise Dl2Error(f"{where}: learn.arrivals: expected one of {', '.join(ARRIVAL_PATTERNS)}, got {s.arrivals!r}")
    return s


def pretrain_config(params: Mapping[str, Any], where: str = "params.yaml") -> PretrainConfig:
    return _typed(PretrainConfig, params.get("pretrain"), "pretrain", where)


@dataclass(frozen=True)
class FinetunePlan:
    """Which runs of `RUNS` to train, with which seeds, under one RL configuration."""

    config: RLConfig
    runs: tuple[str, ...]
    seeds: tuple[int, ...]
    backend: str = "sim"  # where training runs: the simulator, or the Kubernetes testbed (k8s)
    workers: int = 1  # runs trained at once, each in its own process (simulator only)

    def items(self) -> list[tuple[str, int, RLConfig]]:
        """(run, seed, that run's configuration) for every run and seed."""
        return [(run, seed, replace(self.config, seed=seed)) for run in self.runs for seed in self.seeds]


def finetune_config(params: Mapping[str, Any], where: str = "params.yaml") -> RLConfig:
    section = {k: v for k, v in (params.get("finetune") or {}).items() if k not in ("runs", "seeds", "backend", "workers")}
    return _typed(RLConfig, section, "finetune", where)


def seed_list(seeds: Any, key: str, where: str) -> list[int]:
    """`seeds` checked as a non-empty list of distinct non-negative integers (errors name `key`)."""
    if not isinstance(seeds, list) or not seeds or any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in seeds) \
            or len(set(seeds)) != len(seeds):
        raise Dl2Error(f"{where}: {key}: expected a list of distinct non-negative integers, got {seeds!r}")
    return seeds


def worker_count(workers: Any, key: str, where: str) -> int:
    """`workers` checked as a non-negative integer (errors name `key`); 0 means one per CPU core."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise Dl2Error(f"{where}: {key}: expected a non-negative integer (0: one per core), got {workers!r}")
    return workers or os.cpu_count() or 1


def finetune_plan(params: Mapping[str, Any], where: str = "params.yaml") -> FinetunePlan:
    """The `finetune` section: the RL configuration plus `runs` (default: all of `RUNS`) and `seeds`."""
    section = params.get("finetune") or {}
    runs = section.get("runs", list(RUNS))
    if not isinstance(runs, list) or not runs or any(r not in RUNS for r in runs):
        raise Dl2Error(f"{where}: finetune.runs: expected a list of {', '.join(RUNS)}, got {runs!r}")
    seeds = seed_list(section.get("seeds", [0]), "finetune.seeds", where)
    if "seed" in section:
        raise Dl2Error(f"{where}: finetune.seed: use finetune.seeds, a list (one run per seed)")
    backend = section.get("backend", "sim")
    if backend not in BACKENDS:
        raise Dl2Error(f"{where}: finetune.backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    workers = worker_count(section.get("workers", 0), "finetune.workers", where)
    return FinetunePlan(finetune_config(params, where), tuple(runs), tuple(seeds), backend, workers)


def model_name(run: str, seed: int) -> str:
    """The file stem of a fine-tuned model and its checkpoint: `sl-rl-s0`."""
    return f"{run}-s{seed}"


def network(settings: LearnSettings) -> NetConfig:
    return net_config(settings.network, window=settings.window, hidden=settings.hidden, one_hot=settings.one_hot,
                      batch_norm=settings.batch_norm)


def canonical(settings: LearnSettings) -> LearnSettings:
    """`settings` with each network override that repeats its preset's value dropped: two settings that
    build the same network are then equal (`hidden: [128, 128]` on the per-job network is no override)."""
    preset = NET_PRESETS[settings.network]
    return replace(settings, **{key: None for key in ("hidden", "one_hot", "batch_norm")
                                if getattr(settings, key) == getattr(preset, key)})


def scenario(settings: LearnSettings, params_file: str | None = None, speed_model: str = "measured") -> Scenario:
    """The learning scenario; `speed_model="analytical"` is OfflineRL's training world."""
    options = SimOptions(assign_bundle=settings.assign_bundle, speed_model=speed_model, max_slots=2000,
                         speed_noise=settings.speed_noise, epoch_error=settings.epoch_error)
    return Scenario(get_preset(settings.preset, params_file), options)


def split_traces(settings: LearnSettings, sc: Scenario) -> tuple[list[Trace], list[Trace]]:
    """(training, validation) traces from `settings.seed`: disjoint seeds, so disjoint traces."""
    seeds = np.random.SeedSequence(settings.seed).spawn(settings.train_traces + settings.validation_traces)
    traces = [generate_trace(sc.preset, sc.catalog, s, arrivals=settings.arrivals) for s in seeds]
    return traces[: settings.train_traces], traces[settings.train_traces:]


def selection_traces(settings: LearnSettings, sc: Scenario, count: int) -> list[Trace]:
    """`count` traces, from the seeds after `split_traces`'s, that fine-tuning keeps its best weights on:
    never trained on, and apart from the validation traces, so validation stays an unbiased estimate."""
    first = settings.train_traces + settings.validation_traces
    seeds = np.random.SeedSequence(settings.seed).spawn(first + count)[first:]
    return [generate_trace(sc.preset, sc.catalog, s, arrivals=settings.arrivals) for s in seeds]


BACKENDS = ("sim", "k8s")

RUNS = {  # name: (speed model the RL trains on, start from the pretrained policy)
    "sl-rl": ("measured", True),
    "rl-only": ("measured", False),
    "offline-rl": ("analytical", True),
}


def finetune_run(name: str, settings: LearnSettings, rl: RLConfig, pretrained: DL2Policy | None, checkpoint: Path,
                 params_file: str | None = None, on_row=None, backend: str = "sim") -> tuple[DL2Policy, pd.DataFrame]:
    """One RL run of `RUNS`, resuming from `checkpoint` when it holds this very run; training on the simulator
    or the running Kubernetes testbed (`backend`), validation on the simulator with measured speeds. Returns
    the chosen policy (`RLConfig.select_traces`) and the validation history, whose `chosen` column marks
    the update it comes from. `pretrained` may be None for a run that starts from scratch (`rl-only`)."""
    from dl2.k8s.env import environment_factory

    speed_model, from_pretrained = RUNS[name]
    measured = scenario(settings, params_file)
    world = scenario(settings, params_file, speed_model)
    train, validation = split_traces(settings, measured)
    tag = repr((name, settings, rl, backend, _weights_digest(pretrained) if from_pretrained else None))
    trainer = None
    if checkpoint.is_file():
        trainer = Trainer.load(checkpoint)
        if trainer.tag != tag:
            trainer = None
    if trainer is None:
        torch.manual_seed(rl.seed)
        start = DL2Policy.load_state(pretrained) if from_pretrained else DL2Policy(network(settings), measured.preset.max_tasks, settings.assign_bundle)
        trainer = Trainer(start, train, validation, world, rl, validation_scenario=measured, tag=tag,
                          make_env=environment_factory(backend, name),
                          selection=selection_traces(settings, measured, rl.select_traces))
    history = trainer.train(checkpoint=checkpoint, on_row=on_row)
    return trainer.chosen_policy(), history.assign(run=name, chosen=history["update"] == trainer.chosen_update)


def finetune_all(plan: FinetunePlan, settings: LearnSettings, pretrained: DL2Policy, checkpoints: Path,
                 params_file: str | None = None, on_row: Callable[[str, dict], None] | None = None,
                 ) -> Iterator[tuple[str, int, DL2Policy, pd.DataFrame]]:
    """Every (run, seed) of `plan`, as (run, seed, policy, history) in plan order; `on_row(model, row)` per
    validation row. On the simulator, `plan.workers` runs train at once in separate processes (each run
    seeds itself, so the results are those of one process) and their rows are passed on as each run ends."""
    jobs = plan.items()
    workers = plan.workers if plan.backend == "sim" else 1
    live = on_row is not None and min(workers, len(jobs)) <= 1  # rows as they come, in this process
    args = [(name, settings, config, pretrained, checkpoints / f"{model_name(name, seed)}.ckpt", params_file,
             (lambda row, model=model_name(name, seed): on_row(model, row)) if live else None, plan.backend)
            for name, seed, config in jobs]
    for index, (policy, history) in run_jobs(finetune_run, args, workers):
        name, seed, _ = jobs[index]
        if on_row is not None and not live:
            for row in history.drop(columns=["run", "chosen"]).to_dict(orient="records"):
                on_row(model_name(name, seed), row)
        yield name, seed, policy, history


def _weights_digest(policy: DL2Policy) -> str:
    digest = hashlib.sha256()
    for tensor in policy.net.state_dict().values():
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()
