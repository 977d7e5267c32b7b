"""Several Pollux decision environments stepped together, each starting its next episode as one ends."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dl2.errors import Dl2Error
from dl2.learn.pollux.env import PolluxDecisionEnv
from dl2.learn.pollux.features import NUM_JOB_FEATURES
from dl2.pollux.cluster import PolluxRun
from dl2.pollux.workload import Workload


class PolluxVecEnv:
    """`reset()` -> (states (E, window, F), masks (E, actions)); `step(actions)` -> (states, masks, rewards,
    dones). An environment whose episode ends (done) starts the next of `workloads` (round robin over all
    environments), or its own workload again without them; `finished` collects (env index, run) of every
    episode completed (a truncated one is not)."""

    def __init__(self, envs: Sequence[PolluxDecisionEnv], workloads: Sequence[Workload] | None = None):
        if not envs:
            raise Dl2Error("envs: PolluxVecEnv needs at least one environment")
        if len({e.window for e in envs}) > 1:
            raise Dl2Error("envs: every environment needs the same window")
        self.envs = list(envs)
        self.workloads = list(workloads) if workloads else None
        self._next_workload = 0
        self.finished: list[tuple[int, PolluxRun]] = []
        window = envs[0].window
        self.states = np.zeros((len(envs), window, NUM_JOB_FEATURES))
        self.masks = np.zeros((len(envs), window + 1), dtype=np.bool_)

    def reset(self) -> tuple[np.ndarray, np.ndarray]:
        for k, env in enumerate(self.envs):
            self.states[k], self.masks[k] = env.reset()
        return self.states.copy(), self.masks.copy()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One action per environment."""
        rewards = np.zeros(len(self.envs))
        dones = np.zeros(len(self.envs), dtype=np.bool_)
        for k, (env, action) in enumerate(zip(self.envs, np.asarray(actions).tolist())):
            state, mask, rewards[k], dones[k] = env.step(action)
            if dones[k]:
                if not env.truncated:
                    self.finished.append((k, env.result()))
                state, mask = env.reset(self._workload())
            self.states[k], self.masks[k] = state, mask
        return self.states.copy(), self.masks.copy(), rewards, dones

    def _workload(self) -> Workload | None:
        if self.workloads is None:
            return None
        workload = self.workloads[self._next_workload % len(self.workloads)]
        self._next_workload += 1
        return workload
