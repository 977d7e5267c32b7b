"""`Allocation`, the object a scheduler fills (docs/cli.md, "Bring your own scheduler"): `add_bundle`,
`add_worker`, `add_ps` and `place`, checked call by call against a plain recomputation."""

from __future__ import annotations

import re

import numpy as np
import pytest
from forging import FORGERIES, Forging
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2.backends.sim import simulate
from dl2.errors import Dl2Error
from dl2.schedulers.base import Allocation
from dl2.sim.scenario import Scenario
from dl2.sim.state import make_cluster, make_jobs
from dl2.workload.presets import Preset
from dl2.workload.traces import generate_trace

CAPACITY = (8, 8)
ROLE_TASKS = {"worker": ("worker",), "ps": ("ps",), "bundle": ("worker", "ps")}


def allocation(num_nodes: int, workers, ps, max_tasks: int) -> Allocation:
    n = len(workers)
    jobs = make_jobs(np.zeros(n, np.int64), np.zeros(n, np.int64), np.arange(1, n + 1), np.ones(n),
                     np.array(workers, np.int64).reshape(n, 2), np.array(ps, np.int64).reshape(n, 2))
    return Allocation(jobs, make_cluster(num_nodes, *CAPACITY), max_tasks)


class Recomputed:
    """The same rules in plain Python: the least-loaded node is the one with the fewest used slots over both
    types (ties: lower index); a task fits where both types stay within the node's capacity."""

    def __init__(self, num_nodes: int, workers, ps, max_tasks: int):
        self.used = [[0, 0] for _ in range(num_nodes)]
        self.demand = {"worker": [tuple(d) for d in workers], "ps": [tuple(d) for d in ps]}
        self.count = {"worker": [0] * len(workers), "ps": [0] * len(workers)}
        self.max_tasks = max_tasks
        self.tasks: list[tuple[int, int, int]] = []

    def least_loaded(self) -> int:
        return min(range(len(self.used)), key=lambda node: (sum(self.used[node]), node))

    def place(self, j: int, role: str, node: int | None = None) -> bool:
        roles = ROLE_TASKS[role]
        if any(self.count[r][j] + 1 > self.max_tasks for r in roles):
            return False
        node = self.least_loaded() if node is None else node
        need = [sum(self.demand[r][j][k] for r in roles) for k in range(2)]
        if any(self.used[node][k] + need[k] > CAPACITY[k] for k in range(2)):
            return False
        for k in range(2):
            self.used[node][k] += need[k]
        for r in roles:
            self.count[r][j] += 1
            self.tasks.append((j, 0 if r == "worker" else 1, node))
        return True


demands = st.tuples(st.integers(0, 5), st.integers(0, 5))
calls = st.tuples(st.sampled_from(["add_bundle", "add_worker", "add_ps", "place"]), st.integers(0, 3),
                  st.sampled_from(["worker", "ps", "bundle"]), st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(num_nodes=st.integers(1, 4), workers=st.lists(demands, min_size=1, max_size=4), max_tasks=st.integers(1, 4),
       data=st.data(), sequence=st.lists(calls, max_size=40))
def test_every_call_sequence_matches_a_plain_recomputation(num_nodes, workers, max_tasks, data, sequence):
    ps = data.draw(st.lists(demands, min_size=len(workers), max_size=len(workers)))
    alloc = allocation(num_nodes, workers, ps, max_tasks)
    plain = Recomputed(num_nodes, workers, ps, max_tasks)
    for method, j, role, node in sequence:
        j, node = j % len(workers), node % num_nodes
        if method == "place":
            assert alloc.place(j, role, node) == plain.place(j, role, node)
        else:
            assert getattr(alloc, method)(j) == plain.place(j, method.removeprefix("add_"))
        assert alloc.cluster.used.tolist() == plain.used
        assert alloc.workers.tolist() == plain.count["worker"] and alloc.ps.tolist() == plain.count["ps"]
        assert list(zip(*(a.tolist() for a in alloc.tasks()))) == plain.tasks


def test_placing_on_a_chosen_node_keeps_the_least_loaded_queue_right():
    alloc = allocation(2, [(2, 4), (2, 4)], [(2, 0), (2, 0)], max_tasks=8)
    assert alloc.place(0, "bundle", 0) and alloc.place(0, "bundle", 0)  # node 0 is full
    assert alloc.add_bundle(1)  # so node 1 is the least loaded
    assert alloc.cluster.used.tolist() == [[8, 8], [4, 4]]


def test_a_built_in_policy_leaves_the_queue_right_for_whoever_places_next():
    """Tetris places node by node without the queue; an allocation it filled still adds to the least-loaded node."""
    from dl2.backends.sim import SimulatedCluster
    from dl2.schedulers import get_scheduler
    from dl2.workload.traces import Trace

    preset = Preset("tiny", num_nodes=3, num_jobs=2, max_arrivals=2, max_epochs=100, max_tasks=1,
                    speed_table="public_release", bucket_to_model=False)
    scenario = Scenario(preset)
    trace = Trace(np.array([1, 2]), np.array([0, 0]), np.array([0, 1]), np.array([50.0, 50.0]), scenario.catalog.names)
    obs = SimulatedCluster(trace, scenario).observe()
    alloc = get_scheduler("tetris").schedule(obs)
    used = alloc.cluster.used.sum(axis=1)
    alloc.max_tasks = 8
    assert alloc.add_worker(0)
    after = alloc.cluster.used.sum(axis=1)
    grown = int(np.flatnonzero(after != used)[0])
    assert grown == min(range(3), key=lambda node: (used[node], node))


@pytest.mark.parametrize("call, message", [
    (lambda a: a.place(0, "bundle", 2), "node: expected 0..1, got 2"),
    (lambda a: a.place(0, "bundle", -1), "node: expected 0..1, got -1"),
    (lambda a: a.add_bundle(5), "job: expected a position 0..1"),
    (lambda a: a.place(0, "gpu", 0), "role: expected one of worker, ps, bundle, got 'gpu'"),
])
def test_a_bad_argument_is_a_dl2_error_and_places_nothing(call, message):
    alloc = allocation(2, [(2, 4), (2, 4)], [(2, 0), (2, 0)], max_tasks=8)
    with pytest.raises(Dl2Error, match=message):
        call(alloc)
    assert alloc.cluster.used.sum() == 0 and alloc.tasks()[0].size == 0


@pytest.mark.parametrize("forgery", FORGERIES)
def test_the_simulator_refuses_an_allocation_that_does_not_fit(forgery):
    forge, message = FORGERIES[forgery]
    preset = Preset("tiny", num_nodes=2, num_jobs=4, max_arrivals=4, max_epochs=1000, max_tasks=2,
                    speed_table="public_release", bucket_to_model=False)
    scenario = Scenario(preset)
    trace = generate_trace(preset, scenario.catalog, np.random.SeedSequence(0))
    with pytest.raises(Dl2Error, match=f"^slot {int(trace.arrival.min())}: {re.escape(message)}$"):
        simulate(trace, Forging(forge), scenario)
