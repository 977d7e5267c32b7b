"""One interval of DL2's decisions in the Pollux world, shared by the environment (a decision per step)
and the policy (all of them inside `allocate`), so both allocate alike by construction.

The interval starts from an empty allocation. The window holds the first `window` active jobs in workload
(arrival) order. With `assign_one`, each window job first gets one GPU, in window order while GPUs last
(a job whose cap is 0 excepted), as DL2's PS/worker `assign_bundle` gives every job a bundle before the
policy acts and as Optimus+Oracle's own first step does; the policy then decides the further GPUs. An
action k < window gives window job k one more GPU, action `window` is void. "+1" is
legal while the job is below its GPU cap and a GPU is free; void, an illegal action, or no legal "+1" left
ends the interval's decisions. Placement is the world's own (Optimus's and Tiresias's in the artifact,
`dl2.pollux.policies.placement`): a job given as many GPUs as it holds keeps its nodes (no restart); the
others, fewest GPUs first (window order on a tie), take the nodes with the most free GPUs. Jobs outside
the window, and jobs given none, hold nothing this interval.

GPU caps (information every policy has: the workload's batch sizes and the applications' measured
per-GPU batches, as Optimus+Oracle's limit `dl2.pollux.policies.optimus.gpu_limit`), at most
`MAX_REPLICAS` (64):
- `tuned` (each job keeps the workload's batch size, as Optimus+Oracle and Tiresias run): the job's batch
  size over its smallest measured per-GPU batch, exactly Optimus's limit (every shipped workload's job asks
  Tiresias for no more);
- `pollux-batch` (each job picks its batch size by Pollux's goodput rule, `target_bsz` 0, fitted models):
  the application's largest batch size over its smallest per-GPU batch, Pollux's own cap without its
  exploration rule (at most twice the GPUs the job has measured), which belongs to Pollux's search.
ncf runs on one GPU in both, as in the artifact.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import njit

from dl2.errors import Dl2Error
from dl2.learn.pollux.features import AGE, APP, ATTAINED, GIVEN, HELD, NUM_JOB_FEATURES, PROGRESS, RESTARTS
from dl2.pollux import kernels
from dl2.pollux.apps import load_applications
from dl2.pollux.cluster import Allocations, ClusterView
from dl2.pollux.policies.optimus import gpu_limit
from dl2.pollux.policies.placement import keep_or_place
from dl2.pollux.policies.pollux import chosen_batch_sizes
from dl2.pollux.workload import MAX_REPLICAS, Workload

VARIANTS = ("tuned", "pollux-batch")


def check_settings(variant: str, window: int) -> None:
    """A `Dl2Error` naming the key for an unknown variant or a window below 1."""
    if variant not in VARIANTS:
        raise Dl2Error(f"variant: unknown variant {variant!r} (known: {', '.join(VARIANTS)})")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise Dl2Error(f"window: expected a whole number of jobs >= 1, got {window!r}")


@dataclass(frozen=True)
class Variant:
    """How a variant's jobs choose their batch size, and the GPU caps that follow (see the module)."""

    name: str  # the runs' policy name
    variant: str

    @property
    def fits_models(self) -> bool:
        return self.variant == "pollux-batch"

    def batch_sizes(self, workload: Workload) -> np.ndarray:
        return chosen_batch_sizes(workload) if self.fits_models else workload.batch_size.copy()

    def caps(self, workload: Workload) -> np.ndarray:
        """int64 GPU cap per job."""
        apps = load_applications()
        sizes = [apps[a].max_batch_size for a in workload.app] if self.fits_models else workload.batch_size.tolist()
        return np.array([min(gpu_limit(apps[a], int(b)), MAX_REPLICAS) for a, b in zip(workload.app, sizes)],
                        dtype=np.int64)


@lru_cache(maxsize=1)
def _progress_at() -> tuple[np.ndarray, np.ndarray]:
    """(applications, most epochs + 1) the progress that completes each number of epochs (the last repeated
    past an application's own), and each application's epochs."""
    tables = [a.tables for a in load_applications()]
    epochs = np.array([t.max_epochs for t in tables], dtype=np.int64)
    table = np.empty((len(tables), epochs.max() + 1))
    for k, t in enumerate(tables):
        table[k, : t.max_epochs + 1] = t.progress_at
        table[k, t.max_epochs + 1:] = t.progress_at[-1]
    return table, epochs


def epochs_fraction(jobs: kernels.JobArrays) -> np.ndarray:
    """Each job's epochs done (the part of the current epoch included) over its epochs to completion."""
    table, epochs = _progress_at()
    out = np.empty(len(jobs.app))
    _fill_epochs_fraction(jobs.app, jobs.epoch, jobs.progress, table, epochs, out)
    return out


@njit(cache=True)
def _fill_epochs_fraction(app: np.ndarray, epoch: np.ndarray, progress: np.ndarray, table: np.ndarray,
                          epochs: np.ndarray, out: np.ndarray) -> None:
    for j in range(len(app)):
        a, total = app[j], epochs[app[j]]
        e = min(epoch[j], total)
        within = 0.0
        if e < total:
            start, end = table[a, e], table[a, e + 1]
            within = min(max((progress[j] - start) / (end - start if end > start else 1.0), 0.0), 1.0)
        out[j] = (e + within) / total


class IntervalDecisions:
    """The decisions of the interval that `view` opens: `state`, `mask`, `step(action)`, then `allocations()`
    (`open` False from the start: nothing left to decide, `allocations()` is the interval's already)."""

    def __init__(self, view: ClusterView, caps: np.ndarray, window: int, assign_one: bool = False):
        self.view, self.window = view, window
        self.jobs_in_window = view.active[:window]
        n = len(self.jobs_in_window)
        jobs, idx = view.jobs, self.jobs_in_window
        self.caps = caps[idx]
        self.given = np.zeros(n, dtype=np.int64)
        self.held = np.array([len(view.allocations.get(j, ())) for j in idx.tolist()], dtype=np.int64)
        self.free = view.num_nodes * view.gpus_per_node
        self.state = np.zeros((window, NUM_JOB_FEATURES))
        self.state[:n, APP] = jobs.app[idx] + 1
        self.state[:n, AGE] = view.time - jobs.submit[idx]
        self.progress = epochs_fraction(jobs)  # every job's, for the environment's reward
        self.state[:n, PROGRESS] = self.progress[idx]
        self.state[:n, HELD] = self.held
        self.state[:n, RESTARTS] = np.maximum(jobs.restarts[idx], 0)
        self.state[:n, ATTAINED] = jobs.attained[idx]
        if assign_one:
            self._assign_one()
        self.mask = np.zeros(window + 1, dtype=np.bool_)
        self.mask[:n] = (self.given < self.caps) & (self.free > 0)
        self.mask[window] = True
        self.legal = int(self.mask[:n].sum())  # legal "+1" actions
        self.open = self.legal > 0

    def _assign_one(self) -> None:
        """One GPU to each window job whose cap allows one, in window order while GPUs last."""
        self.given[np.flatnonzero(self.caps > 0)[: self.free]] = 1
        self.state[: len(self.given), GIVEN] = self.given
        self.free -= int(self.given.sum())

    def step(self, action: int) -> bool:
        """Apply one action; whether the interval asks for another."""
        if not (0 <= action < self.window and self.mask[action]):
            self.open = False
            return False
        self.given[action] += 1
        self.state[action, GIVEN] += 1
        self.free -= 1
        if self.free == 0:
            self.mask[: self.window] = False
            self.legal = 0
        elif self.given[action] == self.caps[action]:
            self.mask[action] = False
            self.legal -= 1
        self.open = self.legal > 0
        return self.open

    def allocations(self) -> Allocations:
        """The interval's node per GPU of every job given GPUs, placed by the world's rule."""
        view = self.view
        counts = dict(zip(self.jobs_in_window.tolist(), self.given.tolist()))  # window (arrival) order
        return keep_or_place(view.allocations, counts, view.num_nodes, view.gpus_per_node)
