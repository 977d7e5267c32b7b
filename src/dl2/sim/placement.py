"""Placing tasks on nodes: the load-balancing node queue of DESIGN §3, and per-job bookkeeping.

The node queue is a min-heap of keys `total_used * nodes + node`, so ties go to the lower node index.
"Try on the least-loaded node" pops the minimum and pushes it back with its new total, success or not:
the key only grows, so that is one sift-down from the root.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl2.sim.state import BUNDLE, PS, WORKER, Cluster, Jobs


@njit(cache=True)
def reset_cluster(cl: Cluster) -> None:
    """Free every node and clear the slot's placements."""
    cl.used[:] = 0
    for i in range(cl.heap.shape[0]):
        cl.heap[i] = i
    cl.num_tasks[0] = 0


@njit(cache=True, inline="always")
def _sift_down(heap: np.ndarray, pos: int) -> None:
    n = heap.shape[0]
    item = heap[pos]
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= item:
            break
        heap[pos] = heap[child]
        pos = child
    heap[pos] = item


@njit(cache=True, inline="always")
def fits(cl: Cluster, node: int, cpu: int, gpu: int) -> bool:
    return cl.used[node, 0] + cpu <= cl.capacity[0] and cl.used[node, 1] + gpu <= cl.capacity[1]


@njit(cache=True, inline="always")
def try_least_loaded(cl: Cluster, cpu: int, gpu: int) -> int:
    """Take demand (cpu, gpu) on the least-loaded node: its index, or -1 if it does not fit there."""
    num_nodes = cl.heap.shape[0]
    node = cl.heap[0] % num_nodes
    if not fits(cl, node, cpu, gpu):
        return -1
    cl.used[node, 0] += cpu
    cl.used[node, 1] += gpu
    cl.heap[0] = (cl.used[node, 0] + cl.used[node, 1]) * num_nodes + node
    _sift_down(cl.heap, 0)
    return node


@njit(cache=True, inline="always")
def _record_task(cl: Cluster, job: int, role: int, node: int) -> None:
    k = cl.num_tasks[0]
    cl.task_job[k] = job
    cl.task_role[k] = role
    cl.task_node[k] = node
    cl.num_tasks[0] = k + 1


@njit(cache=True, inline="always")
def demand(jobs: Jobs, i: int, role: int) -> tuple[int, int]:
    """[cpu, gpu] slots of one task of job `i` in `role` (a bundle is a worker plus a PS)."""
    if role == WORKER:
        return jobs.worker_demand[i, 0], jobs.worker_demand[i, 1]
    if role == PS:
        return jobs.ps_demand[i, 0], jobs.ps_demand[i, 1]
    return (jobs.worker_demand[i, 0] + jobs.ps_demand[i, 0], jobs.worker_demand[i, 1] + jobs.ps_demand[i, 1])


@njit(cache=True, inline="always")
def commit(jobs: Jobs, cl: Cluster, i: int, role: int, node: int) -> None:
    """Count a placed worker, PS or bundle of job `i` on `node` (resources already taken)."""
    if role == WORKER or role == BUNDLE:
        jobs.workers[i] += 1
        _record_task(cl, i, WORKER, node)
    if role == PS or role == BUNDLE:
        jobs.ps[i] += 1
        _record_task(cl, i, PS, node)


@njit(cache=True, inline="always")
def place_least_loaded(jobs: Jobs, cl: Cluster, i: int, role: int) -> bool:
    """Try one worker, PS or bundle of job `i` on the least-loaded node."""
    cpu, gpu = demand(jobs, i, role)
    node = try_least_loaded(cl, cpu, gpu)
    if node < 0:
        return False
    commit(jobs, cl, i, role, node)
    return True


@njit(cache=True, inline="always")
def place_on_node(jobs: Jobs, cl: Cluster, i: int, role: int, node: int) -> bool:
    """Try one worker, PS or bundle of job `i` on a given node (the node queue is not used)."""
    cpu, gpu = demand(jobs, i, role)
    if not fits(cl, node, cpu, gpu):
        return False
    cl.used[node, 0] += cpu
    cl.used[node, 1] += gpu
    commit(jobs, cl, i, role, node)
    return True


@njit(cache=True, inline="always")
def dominant_share(jobs: Jobs, cl: Cluster, i: int) -> float:
    """max over resource types of the job's share of the whole cluster."""
    num_nodes = cl.used.shape[0]
    best = 0.0
    for k in range(2):
        used = jobs.workers[i] * jobs.worker_demand[i, k] + jobs.ps[i] * jobs.ps_demand[i, k]
        share = used / (num_nodes * cl.capacity[k])
        if share > best:
            best = share
    return best
