"""`dl2 bench`: simulator throughput and time per trace per policy, for `paper` and `paper-large`, and
the learning targets: rollout decisions per second (compiled, every trace to completion), one slot's
decisions for a 40-job window (untrained, DRF-pretrained, and that policy never choosing void), and pretraining
time to within 5% of its teacher's validation JCT."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dl2.backends.sim import SimulatedCluster, simulate
from dl2.bench_record import finish, stamp
from dl2.schedulers import policy_names
from dl2.sim.scenario import Scenario
from dl2.workload.presets import get_preset
from dl2.workload.traces import Trace, generate_trace

if TYPE_CHECKING:
    from dl2.learn.agent import DL2Policy

PRESETS = ("paper", "paper-large")


def run_benchmark(out: str | Path | None = None, repeats: int = 20, num_traces: int = 5, learn: bool = True) -> dict:
    """Median milliseconds per trace and slots per second, per preset and policy; written as JSON to `out`."""
    results: dict = {**stamp(), "repeats": repeats, "traces": num_traces, "presets": {}}
    for name in PRESETS:
        scenario = Scenario(get_preset(name))
        traces = [generate_trace(scenario.preset, scenario.catalog, s) for s in np.random.SeedSequence(0).spawn(num_traces)]
        per_policy = {}
        for policy in policy_names():
            simulate(traces[0], policy, scenario)  # compile / load from cache outside the timing
            times, slots = [], 0
            for trace in traces:
                for _ in range(repeats):
                    start = time.perf_counter()
                    result = simulate(trace, policy, scenario)
                    times.append(time.perf_counter() - start)
                slots += result.num_slots * repeats
            per_policy[policy] = {
                "ms_per_trace_median": 1e3 * float(np.median(times)),
                "ms_per_trace_p90": 1e3 * float(np.percentile(times, 90)),
                "slots_per_second": slots / float(np.sum(times)),
            }
        drf = per_policy["drf"]["ms_per_trace_median"]
        for row in per_policy.values():
            row["time_vs_drf"] = row["ms_per_trace_median"] / drf
        results["presets"][name] = {"num_jobs": scenario.preset.num_jobs, "num_nodes": scenario.preset.num_nodes, "policies": per_policy}
    if learn:
        results["learn"] = learn_benchmark()
    return finish(results, out)


def learn_benchmark(num_traces: int = 16, window: int = 40, networks: tuple[str, ...] = ("paper", "per-job")) -> dict:
    """The learning targets with the project's `learn` and `pretrain` settings (params.yaml), per network,
    measured in one run."""
    import torch

    from dl2.learn import workflow
    from dl2.learn.agent import DL2Policy
    from dl2.learn.pretrain import pretrain
    from dl2.learn.rollout import run_policy
    from dl2.stages import load_stage

    torch.set_num_threads(1)
    project = load_stage("pretrain").config
    results = {}
    for network in networks:
        settings = replace(project.learn, network=network, hidden=None, one_hot=None, batch_norm=None)
        scenario = workflow.scenario(settings)
        train, validation = workflow.split_traces(settings, scenario)
        torch.manual_seed(0)
        policy = DL2Policy(workflow.network(settings), scenario.preset.max_tasks, scenario.options.assign_bundle)
        run_policy(policy, validation[:1], scenario)  # load compiled code outside the timing
        rollout = run_policy(policy, (train * num_traces)[:num_traces], scenario, seed=0)
        wide_settings = replace(settings, window=window)
        wide = DL2Policy(workflow.network(wide_settings), scenario.preset.max_tasks, scenario.options.assign_bundle)
        slot_latency(wide, scenario, repeats=2)
        latency = slot_latency(wide, scenario, repeats=50)
        # A trained policy adds more tasks per slot than random weights: time one that imitates DRF at the wide window.
        wide_trained, _ = pretrain(train, validation[:1], scenario, workflow.network(wide_settings),
                                   replace(project.pretrain, epochs=1, eval_every=1))
        trained_latency = slot_latency(wide_trained, scenario, repeats=50)
        no_void_latency = slot_latency(_never_void(wide_trained), scenario, repeats=50)
        _, history = pretrain(train, validation, scenario, workflow.network(settings),
                              replace(project.pretrain, epochs=3, eval_every=1))
        within = history[(history.val_jct_greedy - history.val_jct_teacher).abs() <= 0.05 * history.val_jct_teacher]
        results[network] = {
            "rollouts": {"traces": num_traces, "decisions": rollout.decisions,
                         "decisions_per_second": rollout.decisions_per_second},
            "slot_latency": _latency_row(latency, window, "untrained"),
            "slot_latency_trained": _latency_row(trained_latency, window, "pretrained on DRF, 1 epoch"),
            "slot_latency_no_void": _latency_row(no_void_latency, window,
                                                 "the same, never choosing void: decides until a task no longer fits"),
            "pretrain": {"teacher": "drf", "epochs": int(history.epoch.max()), "seconds": float(history.seconds.max()),
                         "seconds_to_within_5pct_of_teacher": float(within.seconds.min()) if len(within) else None,
                         "final_val_jct_ratio_to_teacher": float(history.val_jct_greedy.iloc[-1] / history.val_jct_teacher.iloc[-1])},
        }
    return results


def _latency_row(latency: SlotLatency, window: int, policy: str) -> dict:
    """One slot-latency measurement as a JSON row."""
    return {"window": window, "jobs": window, "policy": policy, "ms_median": 1e3 * latency.seconds,
            "decisions_per_slot": latency.decisions, "us_per_decision": 1e6 * latency.seconds / max(latency.decisions, 1.0)}


def _never_void(policy: DL2Policy) -> DL2Policy:
    """A copy of `policy` whose void logit (the last action) is pushed far down, so a slot ends only when a task fails
    to fit or nothing is legal: a slot of many decisions."""
    import torch

    from dl2.learn.agent import DL2Policy

    copy = DL2Policy.load_state(policy)
    head = copy.net.pool_head if hasattr(copy.net, "pool_head") else copy.net.body[-1]
    with torch.no_grad():
        head.bias[-1] -= 1e4
    return copy


@dataclass(frozen=True)
class SlotLatency:
    seconds: float  # median time to make one slot's decisions
    decisions: float  # mean decisions per slot


def slot_latency(policy: DL2Policy, scenario: Scenario, num_jobs: int | None = None, repeats: int = 20,
                 seed: int = 0) -> SlotLatency:
    """Time for `DL2Scheduler` to make one whole slot's decisions with `num_jobs` (default: the window) jobs
    waiting, as a live scheduler would: one decision at a time, each placed before the next."""
    from dl2.learn.agent import DL2Scheduler

    num_jobs = num_jobs or policy.config.window
    rng = np.random.default_rng(seed)
    names = scenario.catalog.names
    trace = Trace(job_id=np.arange(1, num_jobs + 1), arrival=np.zeros(num_jobs, dtype=np.int64),
                  model=rng.integers(0, len(names), num_jobs), num_epochs=rng.uniform(100, 3000, num_jobs),
                  model_names=tuple(names))
    observation = SimulatedCluster(trace, scenario).observe()
    scheduler = DL2Scheduler(policy, greedy=False, seed=seed)
    times, decisions = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        scheduler.schedule(observation)
        times.append(time.perf_counter() - start)
        decisions.append(scheduler.decisions)
    return SlotLatency(float(np.median(times)), float(np.mean(decisions)))
