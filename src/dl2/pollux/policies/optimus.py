"""Optimus+Oracle as the Pollux artifact runs it (`optimus.py`): every active job gets one GPU, in workload
order while GPUs last; each further GPU goes to the job whose remaining time it shortens most, estimated
from the true (oracle) step times and the iterations left at the job's fixed batch size. Placement keeps
an allocation of the same size and puts new ones on the nodes with the most free GPUs."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from dl2.pollux import kernels
from dl2.pollux.apps import APP_NAMES, Application, load_applications
from dl2.pollux.cluster import Allocations, ClusterView
from dl2.pollux.policies.placement import keep_or_place
from dl2.pollux.workload import Workload

_NCF = APP_NAMES.index("ncf")


@lru_cache(maxsize=65536)
def _step_time(app: int, target_bsz: int, replicas: int, gpus_per_node: int) -> float:
    """Seconds per iteration of application `app` at `target_bsz` over `replicas` GPUs packed
    `gpus_per_node` to a node."""
    tables = load_applications()[app].tables
    counts = [gpus_per_node] * (replicas // gpus_per_node) + ([replicas % gpus_per_node] if replicas % gpus_per_node else [])
    local_bsz = math.ceil(target_bsz / replicas - kernels.EPS)
    accum = math.ceil(local_bsz / tables.max_local_bsz - kernels.EPS) - 1
    if replicas == 1:
        accum = max(1, accum)
    atomic = math.ceil(local_bsz / (accum + 1) - kernels.EPS)
    atomic = min(atomic, int(tables.max_bsz / (replicas * (accum + 1))))
    step, sync = kernels.throughput(tables, np.array(counts, dtype=np.int64), float(atomic))
    return step + (step - sync) * accum


def gpu_limit(app: Application, batch_size: int) -> int:
    """The most GPUs a job of `app` at total `batch_size` uses: one per smallest measured per-GPU batch
    (ncf, as in the artifact: one)."""
    return 1 if app.index == _NCF else batch_size // app.min_local_bsz


class Optimus:
    """Optimus+Oracle: greedy marginal GPU gain with the true step times."""

    name = "optimus"
    fits_models = False

    def batch_sizes(self, workload: Workload) -> np.ndarray:
        return workload.batch_size.copy()

    def allocate(self, view: ClusterView) -> Allocations:
        jobs, apps, workload = view.jobs, view.apps, view.workload
        tables = [a.tables for a in apps]
        remaining, limit = {}, {}
        for j in view.active.tolist():
            t, bsz = tables[jobs.app[j]], int(workload.batch_size[j])
            done_at = t.max_epochs - 1
            epoch = int(jobs.epoch[j])
            remaining[j] = 1 if done_at <= epoch else kernels.iterations(t, bsz, done_at) - kernels.iterations(t, bsz, epoch)
            limit[j] = gpu_limit(apps[jobs.app[j]], bsz)

        def gain(j: int, replicas: int, free: int) -> float:
            if replicas + 1 > limit[j] or free < 1:
                return 0
            app, bsz, per_node = int(jobs.app[j]), int(workload.batch_size[j]), view.gpus_per_node
            return (_step_time(app, bsz, replicas, per_node) - _step_time(app, bsz, replicas + 1, per_node)) * remaining[j]

        free = view.num_nodes * view.gpus_per_node
        replicas, gains = {}, {}
        for j in view.active.tolist():
            if free < 1:
                replicas[j], gains[j] = 0, 0
                continue
            replicas[j] = 1
            free -= 1
            gains[j] = gain(j, 1, free)
        while free > 0 and max(gains.values()) > 0:
            j = max(gains, key=gains.__getitem__)
            replicas[j] += 1
            gains[j] = gain(j, replicas[j], free)
            free -= 1
        return keep_or_place(view.allocations, replicas, view.num_nodes, view.gpus_per_node)
