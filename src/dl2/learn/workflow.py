"""The learning stages' building blocks, shared by their notebooks and the ablation cells: the learning
world and network from `LearnSettings`, its traces, and fine-tuning runs.

Training, validation and selection traces come from one seed and never overlap.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dl2.distributed.executor import LOCAL, Executor
from dl2.distributed.jobs import run_jobs
from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy, weights_digest
from dl2.learn.architecture import NetConfig, net_config
from dl2.learn.env import DecisionEnv
from dl2.learn.learners import make_trainer
from dl2.learn.settings import RUNS, FinetunePlan, LearnerSettings, LearnSettings
from dl2.learn.trainer import Trainer
from dl2.sim.scenario import Scenario, SimOptions
from dl2.workload.traces import Trace, generate_trace

EnvFactory = Callable[..., DecisionEnv]  # make_env(traces, scenario, window, seed=...), as `Trainer` takes it
MAX_SLOTS = 2000  # a training or validation episode still running then is truncated


def model_name(run: str, seed: int) -> str:
    """The file stem of a fine-tuned model and its checkpoint: `sl-rl-s0`."""
    return f"{run}-s{seed}"


def network(settings: LearnSettings) -> NetConfig:
    return net_config(settings.network, window=settings.window, hidden=settings.hidden, one_hot=settings.one_hot,
                      batch_norm=settings.batch_norm)


def scenario(settings: LearnSettings, speed_model: str = "measured") -> Scenario:
    """The learning scenario; `speed_model="analytical"` is OfflineRL's training world."""
    options = SimOptions(assign_bundle=settings.assign_bundle, speed_model=speed_model, max_slots=MAX_SLOTS,
                         speed_noise=settings.speed_noise, epoch_error=settings.epoch_error)
    return Scenario(settings.preset, options)


def _trace_seeds(settings: LearnSettings, count: int) -> list[np.random.SeedSequence]:
    """The first `count` trace seeds of `settings.seed`: training, then validation, then selection traces."""
    return np.random.SeedSequence(settings.seed).spawn(count)


def split_traces(settings: LearnSettings, sc: Scenario) -> tuple[list[Trace], list[Trace]]:
    """(training, validation) traces from `settings.seed`: disjoint seeds, so disjoint traces."""
    seeds = _trace_seeds(settings, settings.train_traces + settings.validation_traces)
    traces = [generate_trace(sc.preset, sc.catalog, s, arrivals=settings.arrivals) for s in seeds]
    return traces[: settings.train_traces], traces[settings.train_traces:]


def validation_seeds(settings: LearnSettings) -> list[np.random.SeedSequence]:
    """The seeds `split_traces` draws the validation traces from (to draw shifted versions of them)."""
    return _trace_seeds(settings, settings.train_traces + settings.validation_traces)[settings.train_traces:]


def selection_traces(settings: LearnSettings, sc: Scenario, count: int) -> list[Trace]:
    """`count` traces, from the seeds after `split_traces`'s, that fine-tuning keeps its best weights on:
    never trained on, and apart from the validation traces, so validation stays an unbiased estimate."""
    first = settings.train_traces + settings.validation_traces
    return [generate_trace(sc.preset, sc.catalog, s, arrivals=settings.arrivals) for s in _trace_seeds(settings, first + count)[first:]]


def simulator_environments(run: str) -> EnvFactory:
    """`finetune_all`'s environments on the simulator: every run trains on `DecisionEnv`s."""
    return DecisionEnv


def finetune_run(name: str, seed: int, settings: LearnSettings, learner: LearnerSettings, pretrained: DL2Policy | None,
                 checkpoint: Path, make_env: EnvFactory = DecisionEnv, backend: str = "sim",
                 on_row: Callable[[dict], None] | None = None, executor: Executor = LOCAL) -> tuple[DL2Policy, pd.DataFrame]:
    """One RL run of `RUNS` seeded `seed`, its learner's settings `learner`, resuming from `checkpoint` when it
    holds this very run (else starting over); training in the environments `make_env` builds (`backend`
    names them: a checkpoint of another backend is not resumed), validation on the simulator with measured
    speeds. Returns the chosen policy (`LearnerSettings.select_traces`) and the validation history, whose
    `chosen` column marks the update it comes from. `pretrained` may be None for a run that starts from
    scratch (`rl-only`). With `executor.cluster_actors`, the training clusters live on Ray actors (the
    same results)."""
    run = RUNS[name]
    measured = scenario(settings)
    world = scenario(settings, run.speed_model)
    train, validation = split_traces(settings, measured)
    tag = repr((name, seed, settings, learner, backend, weights_digest(pretrained) if run.pretrained else None))
    trainer = None
    if checkpoint.is_file():
        try:
            trainer = Trainer.load(checkpoint)
        except Dl2Error as exc:  # written by another version of dl2: the run starts over, as for another run's
            warnings.warn(f"{exc}; training anew", stacklevel=2)
        if trainer is not None and trainer.tag != tag:
            trainer = None
    if trainer is None:
        torch.manual_seed(seed)
        start = DL2Policy.load_state(pretrained) if run.pretrained else \
            DL2Policy(network(settings), measured.preset.max_tasks, settings.assign_bundle)
        trainer = make_trainer(start, train, validation, world, learner, seed, validation_scenario=measured, tag=tag,
                               make_env=make_env, selection=selection_traces(settings, measured, learner.select_traces))
    trainer, history = _train(trainer, checkpoint, on_row, executor)
    return trainer.chosen_policy(), history.assign(run=name, chosen=history["update"] == trainer.chosen_update)


def _train(trainer: Trainer, checkpoint: Path, on_row: Callable[[dict], None] | None,
           executor: Executor) -> tuple[Trainer, pd.DataFrame]:
    """The trainer that finished, and its history: `trainer.train()`, its clusters on Ray actors with
    `executor.cluster_actors`. When an actor dies, the run resumes from its checkpoint on new actors, up to
    `executor.retries` times (the rows since the checkpoint are passed to `on_row` again)."""
    from dl2.learn.cluster_actors import ClustersLost

    retries = executor.retries if executor.cluster_actors else 0
    while True:
        if executor.cluster_actors:
            trainer.use_cluster_actors(executor)
        try:
            return trainer, trainer.train(checkpoint=checkpoint, on_row=on_row)
        except ClustersLost as exc:
            if retries == 0 or not checkpoint.is_file():
                raise
            retries -= 1
            warnings.warn(f"{exc}; resuming from {checkpoint}", stacklevel=2)
        finally:
            trainer.close()
        trainer = Trainer.load(checkpoint)


def finetune_all(plan: FinetunePlan, settings: LearnSettings, pretrained: DL2Policy, checkpoints: Path,
                 environments: Callable[[str], EnvFactory] = simulator_environments,
                 on_row: Callable[[str, dict], None] | None = None,
                 executor: Executor = LOCAL) -> Iterator[tuple[str, int, DL2Policy, pd.DataFrame]]:
    """Every (run, seed) of `plan`, as (run, seed, policy, history) in plan order, each run training in the
    environments `environments(run)` builds; `on_row(model, row)` per validation row. On the simulator,
    the runs go to `executor`: `plan.processes` at a time in separate processes, or as Ray tasks (each run
    seeds itself, so the results are those of one process), and their rows are passed on as each run ends;
    with `executor.cluster_actors`, one after another here, each learner's clusters on Ray actors.
    On a testbed, the runs train one after another in this process."""
    jobs = [(run, seed) for run in plan.runs for seed in plan.seeds]
    workers = plan.processes if plan.backend == "sim" else 1
    executor = executor if plan.backend == "sim" else LOCAL
    runs_on, actors = executor, LOCAL
    if executor.cluster_actors:  # runs one after another in this process, each over Ray actors
        runs_on, actors, workers = LOCAL, executor, 1
    live = on_row is not None and runs_on.kind == "local" and min(workers, len(jobs)) <= 1  # rows as they come, here
    args = [(name, seed, settings, plan.learner, pretrained, checkpoints / f"{model_name(name, seed)}.ckpt", environments(name),
             plan.backend, functools.partial(on_row, model_name(name, seed)) if live else None, actors)
            for name, seed in jobs]
    for index, (policy, history) in run_jobs(finetune_run, args, workers, executor=runs_on):
        name, seed = jobs[index]
        if on_row is not None and not live:
            for row in history.drop(columns=["run", "chosen"]).to_dict(orient="records"):
                on_row(model_name(name, seed), row)
        yield name, seed, policy, history
