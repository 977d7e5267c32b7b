"""Running a policy over traces: each trace to completion in the decision environment, compiled."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dl2.learn.agent import DL2Policy
from dl2.learn.compiled import FrozenPolicy, run_episode
from dl2.learn.env import DONE, DecisionEnv
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
    """Each trace once to completion under `policy` (its most likely action, or sampled with a generator
    seeded from `seed` and the trace's position); average JCT per trace, inf if it ran out of slots."""
    frozen = FrozenPolicy(policy).frozen
    seeds = np.random.SeedSequence(seed).generate_state(max(len(traces), 1)) % (2**31)
    avg_jct = np.full(len(traces), np.nan)
    decisions, start = 0, time.perf_counter()
    for k, trace in enumerate(traces):
        env = DecisionEnv([trace], scenario, policy.config.window, shuffle=False)
        env.load(trace)
        status, made = run_episode(frozen, env.jobs, env.cluster, env.table, env.ctl, env.fine_grained, env.lost,
                                   env.trained, env.assign_bundle, env.max_slots, greedy, int(seeds[k]), env.state,
                                   env.window_jobs, env.mask)
        decisions += made
        avg_jct[k] = float(np.mean(env.jct())) if status == DONE else np.inf
    return RolloutResult(avg_jct, decisions, time.perf_counter() - start)
