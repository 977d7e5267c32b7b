"""`dl2 bench --pollux-env`: how fast DL2's decision environment of the Pollux world runs (issue 35, item 4).
16 environments stepped together (`PolluxVecEnv`) over the artifact's eight 1x-load workloads, random legal
actions drawn in one batch per step, per variant and action rule: "random" (uniform over the legal actions,
void included) and "fill" (void only when nothing else is legal, so every interval hands out its GPUs).
Decisions and intervals per second, and the share of the wall time spent in the world's own steps (training
the intervals, with pollux-batch's throughput-model refits, and applying placements). Then PPO end to end
(`ppo_end_to_end`): one rollout and clipped update of the full run's shape (params.yaml `pollux_dl2.run`:
8 environments x 256 decisions, 4 epochs of 512-decision minibatches, the 2x128 per-job network, one torch
thread). Then greedy decisions (`greedy_decisions`): torch's pass a decision against the compiled one
(`dl2.learn.pollux.fast_greedy`), on the same states in a run's order. The date, commit and the machine's
load are recorded beside: on the shared 2-core machine the numbers move with the load."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from dl2.bench_record import finish, stamp
from dl2.learn.pollux.demonstrations import teacher_decisions
from dl2.learn.pollux.env import VARIANTS, PolluxDecisionEnv
from dl2.learn.pollux.fast_greedy import FastGreedy
from dl2.learn.pollux.finetune import finetune
from dl2.learn.pollux.model import PolluxNets, pollux_net_config
from dl2.learn.pollux.pretrain import Demonstrations, fit
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.learn.pollux.vec import PolluxVecEnv
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


def ppo_end_to_end(variant: str = "tuned", seed: int = 0) -> dict:
    """Seconds and decisions/s of one PPO update at the full run's shape (rollout, then update), on the
    artifact's 1x-load workloads, after an untimed update (numba compiled, the environments started)."""
    settings = PolluxTrainSettings(variant=variant, ppo_updates=1)
    workloads = [read_workload(POLLUX_DATA / "workloads" / f"workload-{k}.csv") for k in range(1, 9)]
    previous = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        torch.manual_seed(seed)
        nets = PolluxNets(pollux_net_config(settings))
        finetune(nets, workloads, get_preset(POLLUX), settings, np.random.default_rng(seed))
        start = time.perf_counter()
        history = finetune(nets, workloads, get_preset(POLLUX), settings, np.random.default_rng(seed))
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)
    decisions = int(history["decisions"].iloc[-1])
    return {"decisions": decisions, "seconds": seconds, "decisions_per_second": decisions / seconds,
            "num_envs": settings.num_envs, "rollout_length": settings.rollout_length, "ppo_epochs": settings.ppo_epochs,
            "ppo_batch_size": settings.ppo_batch_size, "hidden": list(settings.hidden)}


def greedy_decisions(seed: int = 0, jobs: int | None = None) -> dict:
    """Microseconds a greedy decision, torch's pass (`PolluxNets.greedy`) against the compiled one
    (`FastGreedy`, with its near ties asked of torch), over Optimus+Oracle's states of the artifact's 1x-load
    workload 1 in the run's order, for the full run's network after 2 SL epochs on them (decisive logits, as
    a trained policy's), or its first `jobs`; both decide every state alike (checked)."""
    settings = PolluxTrainSettings(sl_epochs=2)
    workload = read_workload(POLLUX_DATA / "workloads" / "workload-1.csv")
    states, masks, actions = teacher_decisions([workload if jobs is None else workload.first(jobs)],
                                               get_preset(POLLUX), "optimus", settings.variant, settings.window,
                                               settings.assign_one)
    previous = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        torch.manual_seed(seed)
        nets = PolluxNets(pollux_net_config(settings))
        fit(nets, Demonstrations.encode(nets, states, masks, actions), settings, torch.Generator().manual_seed(seed))
        fast, torch_decide = FastGreedy(nets), nets.greedy()
        fast(states[0], masks[0])  # compiled before the clock starts
        fast = FastGreedy(nets)
        timed = {}
        for name, decide in (("torch", torch_decide), ("compiled", fast)):
            start = time.perf_counter()
            timed[name] = [decide(s, m) for s, m in zip(states, masks)]
            timed[f"{name}_seconds"] = time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)
    if timed["torch"] != timed["compiled"]:
        raise AssertionError("greedy_decisions: the compiled pass decided otherwise than torch")
    return {"decisions": len(states), "window": settings.window, "hidden": list(settings.hidden),
            "torch_us_per_decision": 1e6 * timed["torch_seconds"] / len(states),
            "compiled_us_per_decision": 1e6 * timed["compiled_seconds"] / len(states),
            "speedup": timed["torch_seconds"] / timed["compiled_seconds"], "asked_torch": fast.asked_torch}


def pollux_env_benchmark(out: str | Path | None = None) -> dict:
    """Every variant under every action rule, then PPO end to end; written as JSON to `out`
    (published: data/published/bench/pollux_env.json)."""
    results: dict = {**stamp(), "envs": 16, "window": 20, "workloads": "artifact's workloads 1-8 at 1x load", "runs": {}}
    for variant in VARIANTS:
        for rule in RULES:
            results["runs"][f"{variant}/{rule}"] = measure(variant, rule, STEPS[variant])
    results["ppo_end_to_end"] = {"tuned": ppo_end_to_end("tuned")}
    results["greedy_decisions"] = greedy_decisions()
    return finish(results, out)
