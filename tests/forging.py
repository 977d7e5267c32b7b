"""Faulty schedulers that forge an allocation behind the `Allocation` API, and what every backend says of each
(`dl2.backends.observe.check_allocation`): shared by the simulator's and the Kubernetes backend's tests."""

from __future__ import annotations


class Forging:
    """A faulty scheduler: it allocates as FIFO would through the API, then `forge`s the allocation behind its back."""

    name = "forging"

    def __init__(self, forge):
        self.forge = forge

    def schedule(self, obs):
        alloc = obs.allocation()
        for j in range(len(obs.job_ids)):
            while alloc.add_bundle(j):
                pass
        if len(obs.job_ids):
            self.forge(alloc)
        return alloc


def _all_on_node_zero(alloc):
    alloc.cluster.task_node[:int(alloc.cluster.num_tasks[0])] = 0


def _one_worker_too_many(alloc):
    alloc.jobs.workers[0] = alloc.max_tasks + 1


def _a_task_not_counted(alloc):
    alloc.jobs.workers[0] -= 1


FORGERIES = {  # how an allocation is forged -> what every backend says of it (dl2.backends.observe.check_allocation)
    "every task on node 0": (_all_on_node_zero, "node 0 is over capacity"),
    "a job beyond max_tasks": (_one_worker_too_many, "a job gets more than max_tasks=2 workers or PS"),
    "a task without its count": (_a_task_not_counted, "placed tasks do not match the workers and PS counts"),
}
