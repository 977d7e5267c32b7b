"""Pollux as the artifact runs it (`pollux.py`, `simulator.py`): each job fits a throughput model to what
it measured and picks its own batch size for the GPUs it holds; every interval the scheduler searches
(NSGA-II, `nsga2`) for the allocation that maximises the power mean of the jobs' speedups over their fair
share, discounted for restarts, and takes the candidate of the final front with the best mean.

Jobs are ordered by attained service, then submission. A job may grow to twice the most GPUs it has
measured (at least 1, at most 64 and what its largest batch allows); ncf keeps its batch of 32768 on one
GPU, as in the artifact. The search starts from the previous interval's front, carried over as the
artifact carries it: the k-th job still active in the previous order takes the k-th still-active job's
place in the new order (so after a reordering, jobs inherit each other's candidates)."""

from __future__ import annotations

import math

import numpy as np

from dl2.pollux.apps import APP_NAMES
from dl2.pollux.cluster import Allocations, ClusterView
from dl2.pollux.kernels import best_batch
from dl2.pollux.policies.nsga2 import search
from dl2.pollux.workload import MAX_REPLICAS, Workload

_NCF = APP_NAMES.index("ncf")
NCF_BATCH = 32768


def chosen_batch_sizes(workload: Workload) -> np.ndarray:
    """Total batch sizes for `simulate` when jobs choose their own: 0 (the job picks) for all but ncf."""
    return np.where(workload.app == _NCF, NCF_BATCH, 0).astype(np.int64)


class Pollux:
    """Pollux: co-adaptive goodput-optimised scheduling, seeded."""

    name = "pollux"
    fits_models = True

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.front: np.ndarray | None = None  # the last search's non-dominated candidates
        self.order: list[int] = []  # the jobs (rows of `front`) in that search's order

    def batch_sizes(self, workload: Workload) -> np.ndarray:
        return chosen_batch_sizes(workload)

    def _max_replicas(self, view: ClusterView, j: int) -> int:
        jobs, app = view.jobs, view.apps[view.jobs.app[j]]
        if jobs.app[j] == _NCF:
            return 1
        measured = int(jobs.profile[j, : jobs.profile_count[j], 1].max()) if jobs.profile_count[j] else 0
        return min(max(2 * measured, 1), MAX_REPLICAS, app.max_batch_size // app.min_local_bsz)

    def _carried(self, order: list[int], num_nodes: int) -> np.ndarray:
        states = np.zeros((len(self.front), len(order), num_nodes), dtype=np.int64)
        now, before = set(order), set(self.order)
        src = [i for i, j in enumerate(self.order) if j in now]
        dst = [i for i, j in enumerate(order) if j in before]
        states[:, dst, :] = self.front[:, src, :]
        return states

    def allocate(self, view: ClusterView) -> Allocations:
        jobs = view.jobs
        order = sorted(view.active.tolist(), key=lambda j: (jobs.attained[j], jobs.submit[j]))
        num_jobs, num_nodes = len(order), view.num_nodes
        base_state = np.zeros((num_jobs, num_nodes), dtype=np.int64)
        for row, j in enumerate(order):
            for node in view.allocations.get(j, []):
                base_state[row, node] += 1
        initial = base_state[None] if self.front is None else self._carried(order, num_nodes)
        dominant_share = 1.0 / (num_nodes * view.gpus_per_node)
        fair_replicas = math.ceil(1.0 / dominant_share / num_jobs)
        fair_nodes = math.ceil(num_nodes * dominant_share)
        idx = np.array(order, dtype=np.int64)
        tables = tuple(a.tables for a in view.apps)
        base = np.array([best_batch(jobs.perf[j], jobs.grad[j], tables[jobs.app[j]], fair_nodes, fair_replicas)[0]
                         if jobs.has_perf[j] else float(fair_replicas) for j in order])
        restarts = np.maximum(jobs.restarts[idx], 0)
        age = view.time - jobs.submit[idx]
        delay = view.restart_seconds
        factor = np.maximum(age - restarts * delay, 0.0) / (age + delay)
        max_replicas = np.array([self._max_replicas(view, j) for j in order], dtype=np.int64)
        front, values = search(initial, base_state, max_replicas, factor, view.gpus_per_node, jobs.perf[idx],
                                     jobs.grad[idx], jobs.has_perf[idx], jobs.app[idx], tables, base, self.rng)
        self.front, self.order = front, order
        best = front[int(np.argmin(values[:, 0]))]
        return {j: [n for n in range(num_nodes) for _ in range(best[row, n])] for row, j in enumerate(order)}
