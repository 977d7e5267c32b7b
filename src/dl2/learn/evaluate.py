"""Evaluation: learned policies beside every heuristic on the same validation traces, with latency."""

from __future__ import annotations

import time
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from dl2.learn.agent import DL2Policy
from dl2.learn.rollout import run_policy
from dl2.metrics import lower_bound_jct
from dl2.sim.run import simulate
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace


def evaluate(learned: Mapping[str, DL2Policy], heuristics: Sequence[str], traces: Sequence[Trace],
             scenario: Scenario, seed: int = 0) -> pd.DataFrame:
    """One row per (policy, trace): average JCT and its ratio to the lower bound.

    A learned policy appears twice: sampling from its softmax (as the authors validate) and greedy.
    """
    bound = np.array([lower_bound_jct(t, scenario).mean() for t in traces])
    rows = []
    for name in heuristics:
        jct = np.array([simulate(t, name, scenario).jct.mean() for t in traces])
        rows += _rows(name, jct, bound)
    for name, policy in learned.items():
        rows += _rows(name, run_policy(policy, traces, scenario, greedy=False, seed=seed).avg_jct, bound)
        rows += _rows(f"{name}-greedy", run_policy(policy, traces, scenario, greedy=True).avg_jct, bound)
    return pd.DataFrame(rows)


def _rows(policy: str, jct: np.ndarray, bound: np.ndarray) -> list[dict]:
    return [{"policy": policy, "trace": i, "avg_jct": float(j), "lower_bound": float(b), "ratio_to_bound": float(j / b)}
            for i, (j, b) in enumerate(zip(jct, bound))]


def decision_latency(policy: DL2Policy, repeats: int = 200) -> float:
    """Seconds per single decision (batch of one, as a live scheduler decides), median over `repeats`."""
    window = policy.config.window
    rng = np.random.default_rng(0)
    states = np.zeros((1, window, 6), dtype=np.float32)
    states[0, :, 0] = rng.integers(1, 9, window)
    states[0, :, 2] = rng.random(window)
    masks = np.ones((1, 3 * window + 1), dtype=bool)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        policy.act(states, masks, greedy=False, rng=rng)
        times.append(time.perf_counter() - start)
    return float(np.median(times))
