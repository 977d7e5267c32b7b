"""`dl2 bench --clusters`: the paper's "x parallel clusters converge x times faster", in wall time, with a
CPU per cluster.

PPO's training clusters step on Ray actors (`executor.cluster_actors`), one actor per cluster on a local Ray
cluster of one node of one CPU per actor, as they would with a machine per cluster. For each count x the
learner times `STEPS` updates (rollout and update; no validation), after `WARMUP` untimed ones, with the
project's `finetune` and `learn` parameters; and, for comparison, the same x clusters stepped one after
another in the learner's process, as the published clusters axis ran them.

How long x clusters take to reach a quality is then the updates they need times the seconds of an update.
The published clusters axis (`data/published/ablations/clusters/curves.csv`) measured the updates
(`tables.convergence`), so the report projects each count's wall time to that target from both.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

from dl2.bench_record import finish, stamp
from dl2.paths import DATA_DIR

STEPS = 20
WARMUP = 2
PUBLISHED_CURVES = DATA_DIR / "published" / "ablations" / "clusters" / "curves.csv"


def finetune_stage():
    """The project's `finetune` stage configuration (`FinetuneStage`), its learner PPO: the benchmark's learners
    follow it."""
    from dl2.stages import load_stage

    return load_stage("finetune", overrides={"finetune": {"algorithm": "ppo", "replay": "off", "exploration": "off"}}).config


def _trainer(stage, clusters: int):
    """A PPO learner of `stage` (`finetune_stage`) with `clusters` training clusters, never validating."""
    from dl2.learn import workflow
    from dl2.learn.agent import DL2Policy
    from dl2.learn.learners import make_trainer

    settings = stage.learn
    measured = workflow.scenario(settings)
    train, validation = workflow.split_traces(settings, measured)
    torch.manual_seed(0)
    policy = DL2Policy(workflow.network(settings), measured.preset.max_tasks, settings.assign_bundle)
    never = 10**9
    config = replace(stage.finetune.learner, num_envs=clusters,
                     updates=never, validate_every=never, checkpoint_every=never, select_traces=0)
    return make_trainer(policy, train, validation, measured, config, 0)


def seconds_per_update(stage, clusters: int, executor=None, steps: int = STEPS, warmup: int = WARMUP) -> dict[str, float]:
    """Mean wall seconds of one update of `stage`'s learner with `clusters` clusters, on `executor`'s actors or
    in this process: in all, and its two parts, the rollout (the clusters' decisions) and the learner's update."""
    trainer = _trainer(stage, clusters)
    try:
        if executor is not None:
            trainer.use_cluster_actors(executor)
        trainer.train(stop_after=warmup)  # the actors' start and the compiled simulator's loading, untimed
        rollout = update = 0.0
        for _ in range(steps):  # `PPOTrainer.step`, its two parts timed apart
            start = time.perf_counter()
            collected = trainer._collect()
            middle = time.perf_counter()
            trainer._update(collected)
            rollout, update = rollout + middle - start, update + time.perf_counter() - middle
        return {"total": (rollout + update) / steps, "rollout": rollout / steps, "update": update / steps}
    finally:
        trainer.close()


def updates_to_target(curves: Path = PUBLISHED_CURVES) -> dict[int, float]:
    """Per cluster count, the mean over seeds of the updates the published clusters axis needed to reach its
    common target (`tables.convergence`); empty when the curves are not there."""
    from dl2.learn.ablations import tables

    if not curves.is_file():
        return {}
    means = tables.convergence(pd.read_csv(curves, dtype={"cell": str})).groupby("cell")["update"].mean()
    return {int(cell): float(updates) for cell, updates in means.items()}


def projection(timings: dict[int, float], updates: dict[int, float]) -> dict[str, dict]:
    """Per count measured and published: the projected wall seconds to the target and the speed-up over one
    cluster, against the paper's x."""
    counts = sorted(set(timings) & set(updates))
    if 1 not in counts:
        return {}
    one = updates[1] * timings[1]
    return {str(x): {"updates_to_target": updates[x], "seconds_to_target": updates[x] * timings[x],
                     "speedup_vs_1": one / (updates[x] * timings[x]), "speedup_in_updates": updates[1] / updates[x],
                     "paper_speedup": float(x)} for x in counts}


def clusters_benchmark(out: str | Path | None = None, counts: tuple[int, ...] = (1, 2), steps: int = STEPS) -> dict:
    """Seconds per update for each count of clusters, on one actor (and CPU) each and in one process, and the
    wall time to the published target they imply; written as JSON to `out`."""
    from dl2.distributed.executor import Executor
    from dl2.distributed.local_cluster import LocalRayCluster
    from dl2.errors import Dl2Error

    cpus = len(os.sched_getaffinity(0))
    if not counts or min(counts) < 1 or max(counts) > cpus:
        raise Dl2Error(f"--counts: cluster counts from 1 to this machine's {cpus} CPUs, one CPU per cluster (got {list(counts)})")
    counts = tuple(sorted(set(counts) | {1}))
    opened = stamp(cpus=cpus)
    stage = finetune_stage()
    in_process = {x: seconds_per_update(stage, x, steps=steps) for x in counts}
    on_actors = {}
    for x in counts:
        with LocalRayCluster(nodes=x, cpus=1) as cluster:
            on_actors[x] = seconds_per_update(stage, x, Executor("ray", cluster.address, 1.0, 0, x), steps=steps)
    report = {
        **opened,
        "steps": steps, "decisions_per_cluster_and_update": stage.finetune.learner.rollout_length,
        "seconds_per_update": {"actors": {str(x): s for x, s in on_actors.items()},
                               "in_process": {str(x): s for x, s in in_process.items()}},
        # decisions per second over one cluster's: x if a rollout of x clusters on x CPUs took one cluster's time
        "rollout_speedup_vs_1": {str(x): x * on_actors[1]["rollout"] / on_actors[x]["rollout"] for x in counts},
        "sampling_speedup_vs_1": {str(x): x * on_actors[1]["total"] / on_actors[x]["total"] for x in counts},
        "to_published_target": projection({x: s["total"] for x, s in on_actors.items()}, updates_to_target()),
    }
    return finish(report, out)
