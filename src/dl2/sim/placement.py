"""Placing tasks on nodes: the load-balancing node queue of DESIGN §3, and per-job bookkeeping.

The node queue is a min-heap of keys `total_used * nodes + node`, so ties go to the lower node index.
"Try on the least-loaded node" pops the minimum and pushes it back with its new total, success or not:
the key only grows, so that is one sift-down from the root.

A placement on a chosen node (`place_on_node`) raises that node's key where it sits in the heap, so the
queue always holds every node's current total. The hot helpers take plain arrays (compiled code passing
whole state tuples into helpers is slow); `place_least_loaded`, `place_on_node` and `dominant_share` wrap
them for the state tuples.
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
def fits(used: np.ndarray, capacity: np.ndarray, node: int, cpu: int, gpu: int) -> bool:
    return used[node, 0] + cpu <= capacity[0] and used[node, 1] + gpu <= capacity[1]


@njit(cache=True, inline="always")
def try_least_loaded(heap: np.ndarray, used: np.ndarray, capacity: np.ndarray, cpu: int, gpu: int) -> int:
    """Take demand (cpu, gpu) on the least-loaded node: its index, or -1 if it does not fit there."""
    num_nodes = heap.shape[0]
    node = heap[0] % num_nodes
    if not fits(used, capacity, node, cpu, gpu):
        return -1
    used[node, 0] += cpu
    used[node, 1] += gpu
    heap[0] = (used[node, 0] + used[node, 1]) * num_nodes + node
    _sift_down(heap, 0)
    return node


@njit(cache=True, inline="always")
def try_on_node(used: np.ndarray, capacity: np.ndarray, node: int, cpu: int, gpu: int) -> bool:
    """Take demand (cpu, gpu) on `node` if it fits there. The node queue is left as it was: call
    `requeue` for this node, or `rebuild_queue` once, before the queue is used again."""
    if not fits(used, capacity, node, cpu, gpu):
        return False
    used[node, 0] += cpu
    used[node, 1] += gpu
    return True


@njit(cache=True)
def requeue(heap: np.ndarray, used: np.ndarray, node: int) -> None:
    """Give `node` its current total in the queue (its key only grows, so one sift-down from its place)."""
    num_nodes = heap.shape[0]
    for pos in range(num_nodes):
        if heap[pos] % num_nodes == node:
            heap[pos] = (used[node, 0] + used[node, 1]) * num_nodes + node
            _sift_down(heap, pos)
            return


@njit(cache=True)
def rebuild_queue(heap: np.ndarray, used: np.ndarray) -> None:
    """Every node's key from its current total (a sorted array is a valid heap)."""
    num_nodes = heap.shape[0]
    for node in range(num_nodes):
        heap[node] = (used[node, 0] + used[node, 1]) * num_nodes + node
    heap.sort()


@njit(cache=True, inline="always")
def demand(worker_demand: np.ndarray, ps_demand: np.ndarray, i: int, role: int) -> tuple[int, int]:
    """[cpu, gpu] slots of one task of job `i` in `role` (a bundle is a worker plus a PS)."""
    if role == WORKER:
        return worker_demand[i, 0], worker_demand[i, 1]
    if role == PS:
        return ps_demand[i, 0], ps_demand[i, 1]
    return worker_demand[i, 0] + ps_demand[i, 0], worker_demand[i, 1] + ps_demand[i, 1]


@njit(cache=True, inline="always")
def task_log(cl: Cluster) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The cluster's record of placements: (task_job, task_role, task_node, num_tasks)."""
    return cl.task_job, cl.task_role, cl.task_node, cl.num_tasks


@njit(cache=True, inline="always")
def commit(workers: np.ndarray, ps: np.ndarray, tasks: tuple, i: int, role: int, node: int) -> None:
    """Count a placed worker, PS or bundle of job `i` on `node` (resources already taken) and log its tasks."""
    task_job, task_role, task_node, num_tasks = tasks
    k = num_tasks[0]
    if role == WORKER or role == BUNDLE:
        workers[i] += 1
        task_job[k], task_role[k], task_node[k] = i, WORKER, node
        k += 1
    if role == PS or role == BUNDLE:
        ps[i] += 1
        task_job[k], task_role[k], task_node[k] = i, PS, node
        k += 1
    num_tasks[0] = k


@njit(cache=True)
def place_least_loaded(jobs: Jobs, cl: Cluster, i: int, role: int) -> bool:
    """Try one worker, PS or bundle of job `i` on the least-loaded node."""
    cpu, gpu = demand(jobs.worker_demand, jobs.ps_demand, i, role)
    node = try_least_loaded(cl.heap, cl.used, cl.capacity, cpu, gpu)
    if node < 0:
        return False
    commit(jobs.workers, jobs.ps, task_log(cl), i, role, node)
    return True


@njit(cache=True)
def place_on_node(jobs: Jobs, cl: Cluster, i: int, role: int, node: int) -> bool:
    """Try one worker, PS or bundle of job `i` on a given node; the node queue follows."""
    cpu, gpu = demand(jobs.worker_demand, jobs.ps_demand, i, role)
    if not try_on_node(cl.used, cl.capacity, node, cpu, gpu):
        return False
    requeue(cl.heap, cl.used, node)
    commit(jobs.workers, jobs.ps, task_log(cl), i, role, node)
    return True


@njit(cache=True, inline="always")
def share_of(workers: np.ndarray, ps: np.ndarray, worker_demand: np.ndarray, ps_demand: np.ndarray,
             totals: np.ndarray, i: int) -> float:
    """Dominant share of job `i`, given the cluster's total [cpu, gpu] slots `totals` (nodes * capacity)."""
    best = 0.0
    for k in range(2):
        used = workers[i] * worker_demand[i, k] + ps[i] * ps_demand[i, k]
        share = used / totals[k]
        if share > best:
            best = share
    return best


@njit(cache=True)
def dominant_share(jobs: Jobs, cl: Cluster, i: int) -> float:
    """max over resource types of the job's share of the whole cluster."""
    totals = cl.used.shape[0] * cl.capacity
    return share_of(jobs.workers, jobs.ps, jobs.worker_demand, jobs.ps_demand, totals, i)
