"""Tiresias as the Pollux artifact runs it (`tiresias.py`): two-queue least-attained-service with gang
scheduling. A new job enters the first queue; once it has run for `QUEUE_THRESHOLD` GPU-seconds (its
running seconds times the GPUs it asks for) it moves to the second. Each interval the queues are walked in
order and a job runs if all the GPUs it asks for are still free (so a smaller job further back may fill
in); a job that does not fit is preempted. A running job keeps its GPUs; a started one gets the nodes with
the most free GPUs."""

from __future__ import annotations

import numpy as np

from dl2.pollux.cluster import Allocations, ClusterView
from dl2.pollux.policies.placement import free_gpus, place_on_most_free
from dl2.pollux.workload import Workload

QUEUE_THRESHOLD = 16 * 3600  # GPU-seconds of running before a job moves to the second queue


class Tiresias:
    """Tiresias with the artifact's threshold and no starvation handling."""

    name = "tiresias"
    fits_models = False

    def __init__(self) -> None:
        self.queues: tuple[list[int], list[int]] = ([], [])
        self.running: set[int] = set()
        self.executed: dict[int, int] = {}  # seconds run, for the queue threshold
        self.checked: dict[int, int] = {}  # when each job's time was last counted

    def batch_sizes(self, workload: Workload) -> np.ndarray:
        return workload.batch_size.copy()

    def allocate(self, view: ClusterView) -> Allocations:
        now, asked = view.time, view.workload.num_replicas
        active = set(view.active.tolist())
        self.queues = tuple([j for j in q if j in active] for q in self.queues)
        self.running &= active
        for j in view.active.tolist():
            if j not in self.executed:
                self.executed[j], self.checked[j] = 0, 0
                self.queues[0].append(j)
        for j in view.active.tolist():
            if j in self.running:
                self.executed[j] += now - self.checked[j]
                if j in self.queues[0] and self.executed[j] * int(asked[j]) >= QUEUE_THRESHOLD:
                    self.queues[0].remove(j)
                    self.queues[1].append(j)
            self.checked[j] = now
        allocations = dict(view.allocations)
        free = view.num_nodes * view.gpus_per_node
        for j in self.queues[0] + self.queues[1]:
            if asked[j] <= free:
                self.running.add(j)
                free -= int(asked[j])
            else:
                self.running.discard(j)
                allocations.pop(j, None)
        room = free_gpus(view.num_nodes, view.gpus_per_node, allocations)
        for j in self.queues[0] + self.queues[1]:
            if j in self.running and not allocations.get(j):
                allocations[j] = place_on_most_free(room, int(asked[j]))
        return allocations
