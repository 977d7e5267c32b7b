"""The Pollux world's lower bound: each job alone on the cluster from its submission, at its best placement and
batch size in every epoch.

A job alone starts at the first interval boundary after its submission (the policy first sees it there), pays
the restart every first start pays, then trains each epoch at the highest true goodput any placement and
batch size give it in that epoch (`best_goodput`), changing them for free between epochs. The artifact's job
model (`dl2.pollux.kernels.advance`) ends an epoch on a whole second, so the bound takes half a second per
epoch off; no job under any policy finishes sooner (`tests/test_pollux_bound.py` checks every built-in policy).

What "any placement and batch size" covers: every arrangement of a job's GPUs over up to four nodes (the
measured placements and, where not measured, the interpolated ones), one arrangement per (nodes, GPUs) beyond
four nodes (all interpolated: the measurements know only (nodes, GPUs) there), every whole per-GPU batch
the measurements cover and every number of accumulation steps up to the largest total batch: every choice a
policy can make. A job whose batch size is fixed (`batch_sizes`) is also tried at its own batch split as the
artifact splits it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit
from numba.typed import List

from dl2.pollux import kernels
from dl2.pollux.apps import AppTables, app_tables, load_applications
from dl2.pollux.workload import Workload
from dl2.workload.presets import PolluxPreset

MEASURED_NODES = 4  # the measurements' placements span at most this many nodes


def placements(num_nodes: int, gpus_per_node: int) -> List:
    """GPUs per node of every placement the bound tries (see the module docstring), as a list compiled code takes."""
    out = List()

    def compose(prefix: list[int], nodes: int) -> None:
        if len(prefix) == nodes:
            out.append(np.asarray(prefix, dtype=np.int64))
            return
        for count in range(1, gpus_per_node + 1):
            compose([*prefix, count], nodes)

    for nodes in range(1, min(num_nodes, MEASURED_NODES) + 1):
        compose([], nodes)
    for nodes in range(MEASURED_NODES + 1, num_nodes + 1):  # never measured: only (nodes, GPUs) matters
        for gpus in range(nodes, nodes * gpus_per_node + 1):
            out.append(np.array([gpus // nodes + (k < gpus % nodes) for k in range(nodes)], dtype=np.int64))
    return out


def atomic_sizes(t: AppTables) -> np.ndarray:
    """The per-GPU batch sizes the bound tries for an application: every whole one the measurements cover."""
    return np.arange(int(t.min_local_bsz), int(t.max_local_bsz) + 1, dtype=np.int64)


@njit(cache=True)
def _fastest_pass(t: AppTables, counts_list, atomics: np.ndarray, seconds: np.ndarray) -> None:
    """`seconds[b]`: the fewest seconds one pass of total batch b takes over the placements, per-GPU batches
    (ascending) and accumulation steps tried (inf where none gives b)."""
    seconds[:] = np.inf
    max_bsz = int(t.max_bsz)
    for counts in counts_list:
        replicas = counts.sum()
        for atomic in atomics:
            if replicas * atomic > max_bsz:
                break
            step, sync = kernels.throughput(t, counts, float(atomic))
            if np.isnan(step):
                continue
            accum = 0
            while replicas * atomic * (accum + 1) <= max_bsz:
                batch = replicas * atomic * (accum + 1)
                pass_seconds = step + (step - sync) * accum
                if pass_seconds < seconds[batch]:
                    seconds[batch] = pass_seconds
                accum += 1


@njit(cache=True)
def _best_goodput(t: AppTables, seconds: np.ndarray, out: np.ndarray) -> None:
    """`out[e]`: the highest goodput (progress per second) in epoch e over the batches `seconds` holds."""
    out[:] = 0.0
    for batch in range(len(seconds)):
        if not np.isfinite(seconds[batch]):
            continue
        scale = batch / t.init_bsz
        for epoch in range(t.max_epochs):
            sqr, var = kernels.grad_stats(t, float(batch), epoch)
            if np.isnan(sqr):
                break
            goodput = (var + sqr) / (var / scale + sqr) / seconds[batch]
            if goodput > out[epoch]:
                out[epoch] = goodput


@njit(cache=True)
def _fixed_batch_seconds(t: AppTables, counts_list, batch_size: int, seconds: np.ndarray) -> None:
    """As `_fastest_pass`, for a job whose total batch is `batch_size`, split as the artifact splits it
    (`kernels.set_batch`) on each placement."""
    seconds[:] = np.inf
    for counts in counts_list:
        replicas = counts.sum()
        atomic, accum = kernels.split_batch(t, batch_size, replicas)
        atomic = min(atomic, int(t.max_bsz / (replicas * (accum + 1))))
        if atomic < 1:
            continue
        step, sync = kernels.throughput(t, counts, float(atomic))
        if np.isnan(step):
            continue
        batch = replicas * atomic * (accum + 1)
        pass_seconds = step + (step - sync) * accum
        if pass_seconds < seconds[batch]:
            seconds[batch] = pass_seconds


def _training_seconds(t: AppTables, goodput: np.ndarray) -> float:
    """Seconds to train every epoch at `goodput` per epoch, less half a second per epoch (whole-second epoch ends)."""
    progress = np.diff(t.progress_at[: t.max_epochs + 1])
    return float((progress / goodput).sum()) - 0.5 * t.max_epochs


@lru_cache(maxsize=8)
def _alone_seconds(num_nodes: int, gpus_per_node: int) -> tuple[float, ...]:
    """Per application: its training seconds alone at the best placement and batch size of every epoch."""
    tables = app_tables(load_applications())
    counts = placements(num_nodes, gpus_per_node)
    out = []
    for t in tables:
        seconds, goodput = np.empty(int(t.max_bsz) + 1), np.empty(t.max_epochs)
        _fastest_pass(t, counts, atomic_sizes(t), seconds)
        _best_goodput(t, seconds, goodput)
        out.append(_training_seconds(t, goodput))
    return tuple(out)


@lru_cache(maxsize=256)
def _fixed_alone_seconds(app: int, batch_size: int, num_nodes: int, gpus_per_node: int) -> float:
    t = app_tables(load_applications())[app]
    seconds, goodput = np.empty(int(t.max_bsz) + 1), np.empty(t.max_epochs)
    _fixed_batch_seconds(t, placements(num_nodes, gpus_per_node), batch_size, seconds)
    _best_goodput(t, seconds, goodput)
    return _training_seconds(t, goodput)


def lower_bound_jct(workload: Workload, preset: PolluxPreset) -> np.ndarray:
    """Per job, the seconds from its submission to its end alone on `preset`'s cluster (module docstring):
    no policy's job completes sooner."""
    alone = _alone_seconds(preset.num_nodes, preset.gpus_per_node)
    interval = preset.interval_seconds
    first_seen = np.maximum(interval, -(-workload.time // interval) * interval)
    training = np.array([min(alone[app], _fixed_alone_seconds(int(app), int(batch), preset.num_nodes, preset.gpus_per_node))
                         for app, batch in zip(workload.app, workload.batch_size, strict=True)])
    return (first_seen - workload.time) + preset.restart_seconds + training
