"""`dl2 bench --ray`: what the Ray executor costs and gains. The same ablation group (the project's
`pretraining` axis, two seeds, at the reduced scale grown to cells of several seconds each) runs in this
process, then as Ray tasks on one and on two Ray nodes of one CPU each on this machine
(`dl2.distributed.local_cluster`). It reports the speedup of two nodes over one, Ray's overhead per task
(against the in-process run, and for an empty task), what starting the cluster and its workers costs,
and whether every run gave the in-process results."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from dl2.bench_record import finish, stamp

EMPTY_TASKS = 200
BENCH_SCALE = {"learn": {"train_traces": 2, "validation_traces": 2}, "pretrain": {"epochs": 2, "eval_every": 2},
               "finetune": {"updates": 48, "num_envs": 2, "rollout_length": 64, "batch_size": 32, "validate_every": 24,
                            "select_traces": 1, "checkpoint_every": 24}}  # about 7 s a cell on one core


def reduced_group(scale: dict | None = None) -> list:
    """The `pretraining` axis with seeds 0 and 1 at the reduced scale (eight cells of a fraction of a
    second each), or at the reduced scale changed by `scale` (a scale's sections, as in params.yaml)."""
    from dl2.stages import load_stage

    overrides: dict = {"ablations": {"scale": "reduced", "seeds": [0, 1]}}
    if scale is not None:
        overrides["ablations"]["scales"] = {"reduced": scale}
    plans = load_stage("ablate@model", overrides=overrides).config.plans
    return [next(p for p in plans if p.axis == "pretraining")]


def comparable(results: dict[str, list[dict]]) -> str:
    """`run_plans`'s results as JSON without wall times (each history's `seconds`): every float written
    exactly, and NaN equal to NaN."""
    return json.dumps({axis: [{**cell, "history": {k: v for k, v in cell["history"].items() if k != "seconds"}}
                              for cell in cells] for axis, cells in results.items()}, sort_keys=True)


def _timed_group(plans: list, folder: Path, executor) -> tuple[float, str]:
    from dl2.learn.ablations import cells

    start = time.perf_counter()
    results = cells.run_plans(plans, folder, workers=1, progress=False, executor=executor)
    return time.perf_counter() - start, comparable(results)


def _start_workers(folder: Path, executor, nodes: int) -> float:
    """Seconds to start one worker per node and load dl2 in it (a tiny cell each, at once)."""
    from dl2.distributed.ray_tasks import run_ray_jobs
    from dl2.learn.ablations.cells import run_cell

    cell = reduced_group()[0].cells[0]
    start = time.perf_counter()
    list(run_ray_jobs(run_cell, [(cell, 0, folder / f"worker-{k}" / "cells") for k in range(nodes)], executor, in_order=False))
    return time.perf_counter() - start


def _empty_task_seconds() -> float:
    """Mean seconds of one empty Ray task, submitted and awaited one after another."""
    import ray

    @ray.remote(num_cpus=1)
    def empty() -> None:
        return None

    ray.get(empty.remote())  # a worker started outside the timing
    start = time.perf_counter()
    for _ in range(EMPTY_TASKS):
        ray.get(empty.remote())
    return (time.perf_counter() - start) / EMPTY_TASKS


def ray_benchmark(out: str | Path | None = None) -> dict:
    """The group in-process and on 1 and 2 local Ray nodes (1 CPU each), workers started before the timing;
    written as JSON to `out`."""
    from dl2.distributed.executor import LOCAL, Executor
    from dl2.distributed.local_cluster import LocalRayCluster

    opened = stamp()
    plans = reduced_group(BENCH_SCALE)
    jobs = sum(len(p.cells) * len(p.seeds) for p in plans)
    with tempfile.TemporaryDirectory(prefix="dl2-bench-ray-") as tmp:
        folder = Path(tmp)
        _timed_group(reduced_group(), folder / "warm", LOCAL)  # imports and compiled code loaded outside the timing
        local_s, local = _timed_group(plans, folder / "local", LOCAL)
        runs = {}
        for nodes in (1, 2):
            start = time.perf_counter()
            with LocalRayCluster(nodes=nodes, cpus=1) as cluster:
                executor = Executor("ray", cluster.address, 1.0, 3, 0)
                up_s = time.perf_counter() - start
                workers_s = _start_workers(folder / f"start-{nodes}", executor, nodes)
                seconds, results = _timed_group(plans, folder / f"ray-{nodes}", executor)
                runs[nodes] = {"seconds": seconds, "cluster_start_seconds": up_s, "worker_start_seconds": workers_s,
                               "equal_to_local": results == local, "empty_task_seconds": _empty_task_seconds()}
    one, two = runs[1]["seconds"], runs[2]["seconds"]
    report = {
        **opened,
        "group": "pretraining axis, seeds [0, 1], reduced scale with BENCH_SCALE", "scale": BENCH_SCALE, "jobs": jobs,
        "local_seconds": local_s, "ray": {f"{n}-node": run for n, run in runs.items()},
        "speedup_2_vs_1_node": one / two,
        "overhead_per_task_seconds": (one - local_s) / jobs,  # one node runs the jobs one at a time, as this process does
        "equal_results": all(run["equal_to_local"] for run in runs.values()),
    }
    return finish(report, out)
