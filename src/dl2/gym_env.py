"""dl2's decision environment as a Gymnasium environment, for any RL library's agent.

    import gymnasium, dl2.gym_env
    env = gymnasium.make("dl2/Cluster-v0", preset="dev")

(or `gymnasium.make("dl2.gym_env:dl2/Cluster-v0", ...)`, which imports this module itself, as RLlib's
env runners need). Each step is one of DL2's decisions: action `3*i + r` gives the window's i-th job one
more worker (r=0), parameter server (r=1) or bundle of both (r=2); action `3*window` (void) ends the slot.
An action that is not legal now (an empty position, a job at its limit, a full cluster) is taken as void.
The legal actions are in `info["action_mask"]` and `action_masks()`, where masking agents look for them.

The reward (`reward="jct"`, the default) is minus the time jobs spend in the system, divided by the
number of jobs: an episode's return is minus its average JCT in slots, the objective itself.
`reward="dl2"` pays the paper's slot reward instead (each job's share of its epochs trained in the slot).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from dl2.errors import Dl2Error
from dl2.learn.env import DecisionEnv
from dl2.learn.workflow import MAX_SLOTS  # as fine-tuning's episodes
from dl2.sim.scenario import Scenario, SimOptions
from dl2.sim.state import NUM_FEATURES
from dl2.workload.presets import PS_WORKER, get_preset
from dl2.workload.traces import generate_trace

ENV_ID = "dl2/Cluster-v0"
REWARDS = ("jct", "dl2")


class ClusterEnv(gymnasium.Env):
    """One simulated cluster of `preset`, running `traces` generated traces (from `trace_seed`), a random
    one per episode; `window` jobs are visible at a time. Observations are the raw window (window, 6):
    model + 1 (0 for an empty row), slots since arrival, remaining fraction of epochs, dominant share,
    workers, PS."""

    metadata = {"render_modes": []}

    def __init__(self, preset: str = "dev", window: int = 20, traces: int = 16, trace_seed: int = 0,
                 reward: str = "jct", assign_bundle: bool = True, arrivals: str = "ali"):
        if reward not in REWARDS:
            raise Dl2Error(f"reward: expected one of {', '.join(REWARDS)}, got {reward!r}")
        if window < 1 or traces < 1:
            raise Dl2Error(f"window and traces: expected at least 1, got window={window!r}, traces={traces!r}")
        scenario = Scenario(get_preset(preset, world=PS_WORKER), SimOptions(assign_bundle=assign_bundle, max_slots=MAX_SLOTS))
        seeds = np.random.SeedSequence(trace_seed).spawn(traces)
        self.sim = DecisionEnv([generate_trace(scenario.preset, scenario.catalog, s, arrivals=arrivals) for s in seeds],
                               scenario, window)
        self.reward_kind = reward
        p = scenario.preset
        high = np.array([len(scenario.catalog.names), MAX_SLOTS, 1.0, 1.0, p.max_tasks, p.max_tasks], np.float32)
        self.observation_space = spaces.Box(np.zeros((window, NUM_FEATURES), np.float32), np.tile(high, (window, 1)))
        self.action_space = spaces.Discrete(self.sim.num_actions)
        self._time_in_system = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """A new episode on the next trace (`seed` reseeds which traces come)."""
        super().reset(seed=seed)
        state, _ = self.sim.reset(seed=seed)
        self._time_in_system = 0.0
        return state.copy(), self._info(slot_end=False)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        state, slot_reward, terminated, truncated, info = self.sim.step(int(action))
        reward = slot_reward if self.reward_kind == "dl2" else self._jct_reward()
        out = self._info(slot_end=info["slot_end"])
        if terminated:
            out["jct"] = float(np.mean(info["jct"]))
        return state.copy(), float(reward), terminated, truncated, out

    def action_masks(self) -> np.ndarray:
        """The legal actions now (bool, one per action)."""
        return self.sim.mask.copy()

    def _info(self, slot_end: bool) -> dict[str, Any]:
        return {"action_mask": self.sim.mask.astype(np.int8), "slot": self.sim.slot, "slot_end": slot_end}

    def _jct_reward(self) -> float:
        """Minus the time in the system jobs gained since the last step, over the number of jobs: finished
        jobs count their JCT, others the slots since they arrived. The sum over an episode that ends is
        minus the average JCT."""
        jobs, slot = self.sim.jobs, self.sim.slot
        arrived = jobs.arrival <= slot
        finished = ~np.isnan(jobs.end)
        spent = np.where(finished, jobs.end - jobs.arrival + 1.0, np.where(arrived, slot - jobs.arrival, 0.0))
        total = float(spent.sum())
        gained, self._time_in_system = total - self._time_in_system, total
        return -gained / len(jobs.arrival)


def register() -> None:
    """Register `ENV_ID` with Gymnasium (done when this module is imported)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(ENV_ID, entry_point=ClusterEnv)


register()
