"""The built-in heuristics behind the scheduler protocol; the simulator runs them compiled end to end."""

from __future__ import annotations

from dl2.schedulers.base import Allocation, Observation
from dl2.sim.policies import POLICY_IDS, run_policy
from dl2.sim.state import make_recorder

BUILTIN_POLICIES = tuple(POLICY_IDS)
_NO_RECORDING = make_recorder(0, 1)


class BuiltinScheduler:
    """FIFO, SRTF, DRF, Tetris or Optimus exactly as DESIGN §3 defines them."""

    def __init__(self, name: str):
        self.name = name
        self.policy_id = POLICY_IDS[name]

    def schedule(self, obs: Observation) -> Allocation:
        alloc = obs.allocation()
        run_policy(self.policy_id, alloc.jobs, alloc.cluster, _NO_RECORDING, obs.slot, obs.max_tasks, obs.epochs_table)
        return alloc

    def __repr__(self) -> str:
        return f"BuiltinScheduler({self.name!r})"
