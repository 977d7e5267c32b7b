"""Shared fixtures: presets from the project's params.yaml and small hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from dl2.config import Preset, get_preset
from dl2.sim.scenario import Scenario, SimOptions
from dl2.sim.state import make_cluster, make_jobs, make_recorder
from dl2.sim import engine
from dl2.sim.policies import POLICY_IDS


@pytest.fixture(scope="session")
def paper() -> Scenario:
    return Scenario(get_preset("paper"))


def tiny_preset(num_nodes: int = 2, max_tasks: int = 2, num_jobs: int = 6) -> Preset:
    return Preset("tiny", num_nodes=num_nodes, num_jobs=num_jobs, max_arrivals=2, max_epochs=30000,
                  max_tasks=max_tasks, speed_table="public_release", bucket_to_model=False)


def run_by_hand(policy: str, arrivals, epochs, table_fn, num_nodes: int = 2, max_tasks: int = 2,
                fine_grained: bool = True, worker=(2, 4), ps=(2, 0)) -> np.ndarray:
    """Run the compiled loop on jobs of one model with a hand-made speed table; returns JCT per job."""
    n = len(arrivals)
    size = max_tasks + 2
    table = np.zeros((1, size, size))
    for p in range(1, size):
        for w in range(1, size):
            table[0, p, w] = table_fn(p, w)
    jobs = make_jobs(np.zeros(n, np.int64), np.asarray(arrivals), np.arange(1, n + 1), np.asarray(epochs, float),
                     np.tile(worker, (n, 1)), np.tile(ps, (n, 1)))
    cluster = make_cluster(num_nodes, 8, 8)
    stats = np.empty((1000, engine.NUM_STATS))
    slots = engine.run_builtin(POLICY_IDS[policy], jobs, cluster, make_recorder(0, 1), table, table, max_tasks,
                               fine_grained, False, stats)
    assert slots > 0
    return jobs.end - jobs.arrival + 1


__all__ = ["run_by_hand", "tiny_preset", "SimOptions"]
