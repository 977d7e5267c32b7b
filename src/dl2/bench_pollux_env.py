"""`dl2 bench --pollux-env`: how fast DL2's decision environment of the Pollux world runs (issue 35, item 4).
16 environments stepped together (`PolluxVecEnv`) over the artifact's eight 1x-load workloads, random legal
actions drawn in one batch per step, per variant and action rule: "random" (uniform over the legal actions,
void included) and "fill" (void only when nothing else is legal, so every interval hands out its GPUs).
Decisions and intervals per second, and the share of the wall time spent in the world's own steps (training
the intervals, with pollux-batch's throughput-model refits, and applying placements)."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np

from dl2.learn.pollux.env import VARIANTS, PolluxDecisionEnv
from dl2.learn.pollux.vec import PolluxVecEnv
from dl2.paths import write_json_atomic
from dl2.pollux.grid import POLLUX_DATA
from dl2.pollux.workload import read_workload
from dl2.workload.presets import POLLUX, get_preset

STEPS = {"tuned": 160_000, "pollux-batch": 16_000}  # decisions per measurement (pollux-batch refits for seconds)
RULES = ("random", "fill")


def measure(variant: str, rule: str, steps: int, num_envs: int = 16, window: int = 20, seed: int = 0) -> dict:
    """Decisions and intervals per second of `num_envs` environments under `rule`, after a first step each."""
    preset = get_preset(POLLUX)
    workloads = [read_workload(POLLUX_DATA / "workloads" / f"workload-{k}.csv") for k in range(1, 9)]
    envs = [PolluxDecisionEnv(workloads[k % len(workloads)], preset, variant, window) for k in range(num_envs)]
    vec = PolluxVecEnv(envs, workloads)
    rng = np.random.default_rng(seed)
    _, masks = vec.reset()
    intervals = sum(len(env.cluster.gpus_used) for env in envs)
    world = sum(env.world_seconds for env in envs)
    start = time.perf_counter()
    for _ in range(steps // num_envs):
        draws = rng.random(masks.shape) * masks
        if rule == "fill":
            draws[:, -1] *= 1e-9
        _, masks, _, _ = vec.step(draws.argmax(axis=1))
    seconds = time.perf_counter() - start
    intervals = sum(len(env.cluster.gpus_used) for env in envs) + sum(run.num_intervals for _, run in vec.finished) - intervals
    decisions = steps // num_envs * num_envs
    return {"decisions": decisions, "seconds": seconds, "decisions_per_second": decisions / seconds,
            "intervals_per_second": intervals / seconds, "decisions_per_interval": decisions / intervals,
            "world_share": (sum(env.world_seconds for env in envs) - world) / seconds}


def pollux_env_benchmark(out: str | Path | None = None) -> dict:
    """Every variant under every action rule; written as JSON to `out`."""
    results: dict = {"machine": {"python": platform.python_version(), "processor": platform.machine()},
                     "envs": 16, "window": 20, "workloads": "artifact's workloads 1-8 at 1x load", "runs": {}}
    for variant in VARIANTS:
        for rule in RULES:
            results["runs"][f"{variant}/{rule}"] = measure(variant, rule, STEPS[variant])
    if out is not None:
        write_json_atomic(out, results)
    return results
