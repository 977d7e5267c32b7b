"""Array state shared by the compiled simulator, the policies and the decision recorder.

Jobs are indexed in (arrival slot, job id) order, so "arrival order, ties by id" is index order; `idrank`
gives each job's rank by id for the orders that break ties by id alone.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

WORKER, PS, BUNDLE, VOID = 0, 1, 2, 3
NUM_FEATURES = 6  # job type, slots since arrival, remaining fraction, dominant share, #workers, #PS


class Jobs(NamedTuple):
    model: np.ndarray  # int64
    arrival: np.ndarray  # int64
    idrank: np.ndarray  # int64
    epochs: np.ndarray  # float64
    progress: np.ndarray  # float64
    worker_demand: np.ndarray  # int64 (n, 2)
    ps_demand: np.ndarray  # int64 (n, 2)
    workers: np.ndarray  # int64
    ps: np.ndarray  # int64
    active: np.ndarray  # bool: arrived and not completed
    end: np.ndarray  # float64 completion slot, nan before
    known_epochs: np.ndarray  # float64: the epochs schedulers are told (an estimate of `epochs`, the truth)


class Cluster(NamedTuple):
    capacity: np.ndarray  # int64 (2,) slots per node [cpu, gpu]
    used: np.ndarray  # int64 (nodes, 2)
    heap: np.ndarray  # int64 (nodes,) keys total_used * nodes + node, a min-heap
    task_job: np.ndarray  # int64 placements made this slot ...
    task_role: np.ndarray
    task_node: np.ndarray
    num_tasks: np.ndarray  # int64 (1,)


class Recorder(NamedTuple):
    """Decisions as (state, action) pairs in DL2's action space; capacity 0 records nothing."""

    states: np.ndarray  # float32 (capacity, window, NUM_FEATURES)
    actions: np.ndarray  # int64 (capacity,) 3*position + role, or 3*window for void
    slots: np.ndarray  # int64 (capacity,)
    count: np.ndarray  # int64 (1,) decisions recorded (may exceed capacity: then rerun bigger)
    outside_window: np.ndarray  # int64 (1,) decisions for jobs outside the window, not recordable


def make_jobs(model: np.ndarray, arrival: np.ndarray, job_id: np.ndarray, epochs: np.ndarray,
              worker_demand: np.ndarray, ps_demand: np.ndarray, known_epochs: np.ndarray | None = None) -> Jobs:
    """Jobs in the given order, which must be (arrival, id) order; schedulers are told `known_epochs`
    (default: the true `epochs`)."""
    n = len(model)
    idrank = np.empty(n, dtype=np.int64)
    idrank[np.argsort(job_id, kind="stable")] = np.arange(n)
    return Jobs(
        model=np.ascontiguousarray(model, dtype=np.int64),
        arrival=np.ascontiguousarray(arrival, dtype=np.int64),
        idrank=idrank,
        epochs=np.ascontiguousarray(epochs, dtype=np.float64),
        progress=np.zeros(n),
        worker_demand=np.ascontiguousarray(worker_demand, dtype=np.int64).reshape(n, 2),
        ps_demand=np.ascontiguousarray(ps_demand, dtype=np.int64).reshape(n, 2),
        workers=np.zeros(n, dtype=np.int64),
        ps=np.zeros(n, dtype=np.int64),
        active=np.zeros(n, dtype=np.bool_),
        end=np.full(n, np.nan),
        known_epochs=np.ascontiguousarray(epochs if known_epochs is None else known_epochs, dtype=np.float64),
    )


def make_cluster(num_nodes: int, node_cpu: int, node_gpu: int, max_tasks_per_slot: int | None = None) -> Cluster:
    """An empty cluster; room to record every task placed in one slot."""
    cap = max_tasks_per_slot if max_tasks_per_slot is not None else num_nodes * (node_cpu + node_gpu)
    return Cluster(
        capacity=np.array([node_cpu, node_gpu], dtype=np.int64),
        used=np.zeros((num_nodes, 2), dtype=np.int64),
        heap=np.arange(num_nodes, dtype=np.int64),
        task_job=np.zeros(cap, dtype=np.int64),
        task_role=np.zeros(cap, dtype=np.int64),
        task_node=np.zeros(cap, dtype=np.int64),
        num_tasks=np.zeros(1, dtype=np.int64),
    )


def make_recorder(capacity: int, window: int) -> Recorder:
    return Recorder(
        states=np.zeros((capacity, window, NUM_FEATURES), dtype=np.float32),
        actions=np.zeros(capacity, dtype=np.int64),
        slots=np.zeros(capacity, dtype=np.int64),
        count=np.zeros(1, dtype=np.int64),
        outside_window=np.zeros(1, dtype=np.int64),
    )
