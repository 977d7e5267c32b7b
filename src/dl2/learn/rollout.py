"""Running a policy over traces in batch: every trace in its own environment, all stepped together."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dl2.learn.agent import DL2Policy
from dl2.learn.env import DecisionEnv
from dl2.sim.scenario import Scenario
from dl2.workload.traces import Trace


@dataclass(frozen=True)
class RolloutResult:
    avg_jct: np.ndarray  # per trace
    decisions: int
    seconds: float

    @property
    def decisions_per_second(self) -> float:
        return self.decisions / self.seconds if self.seconds > 0 else float("inf")


def run_policy(policy: DL2Policy, traces: Sequence[Trace], scenario: Scenario, greedy: bool = False,
               seed: int = 0) -> RolloutResult:
    """Each trace once to completion under `policy`; average JCT per trace."""
    envs = [DecisionEnv([t], scenario, policy.config.window, shuffle=False) for t in traces]
    for env in envs:
        env.reset()
    rng = np.random.default_rng(seed)
    avg_jct = np.full(len(traces), np.nan)
    live = list(range(len(envs)))
    decisions, start = 0, time.perf_counter()
    while live:
        states = np.stack([envs[k].state for k in live])
        masks = np.stack([envs[k].mask for k in live])
        actions = policy.act(states, masks, greedy, rng)
        decisions += len(live)
        still = []
        for k, action in zip(live, actions):
            _, _, terminated, truncated, info = envs[k].step(int(action))
            if terminated:
                avg_jct[k] = float(np.mean(info["jct"]))
            elif truncated:
                avg_jct[k] = np.inf
            else:
                still.append(k)
        live = still
    return RolloutResult(avg_jct, decisions, time.perf_counter() - start)
