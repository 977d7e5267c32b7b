"""The Pollux world's cluster, an interval at a time (the artifact's `simulator.py`): every job first
trains for the interval on what it holds, then the policy sees the submitted, uncompleted jobs and returns
a node id per GPU for each; a job whose list changed restarts (`restart_seconds` with no progress, also at
its first start). A run ends once every job has completed; JCTs are whole seconds.

A policy is any object with a `name`, the batch sizes its jobs keep (`batch_sizes(workload)`: the total
batch size per job, 0 where the job picks its own), whether jobs fit a throughput model for it to plan
with (`fits_models`), and `allocate(view) -> {job: [node per GPU]}`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from dl2.errors import Dl2Error
from dl2.pollux import kernels
from dl2.pollux.apps import Application, app_tables, load_applications
from dl2.pollux.perf_model import fit_profile
from dl2.pollux.workload import Workload
from dl2.workload.presets import PolluxPreset

Allocations = dict[int, list[int]]  # job index -> the node of each of its GPUs


@dataclass(frozen=True)
class ClusterView:
    """What a policy sees at the end of an interval."""

    time: int  # seconds since the start
    active: np.ndarray  # submitted, uncompleted jobs (indices into the workload), in workload order
    allocations: Allocations  # what the active jobs hold now
    jobs: kernels.JobArrays  # every job's state (read only)
    workload: Workload
    apps: tuple[Application, ...]
    num_nodes: int
    gpus_per_node: int
    restart_seconds: int


class PolluxPolicy(Protocol):
    name: str
    fits_models: bool  # jobs fit the throughput model (Pollux plans with it)

    def batch_sizes(self, workload: Workload) -> np.ndarray: ...

    def allocate(self, view: ClusterView) -> Allocations: ...


@dataclass(frozen=True)
class PolluxRun:
    """One workload under one policy: per job and per interval."""

    policy: str
    workload: Workload
    completion: np.ndarray  # int64 completion second per job
    restarts: np.ndarray  # int64 restarts per job
    gpus_used: np.ndarray  # GPUs allocated after each interval
    running: np.ndarray  # jobs holding GPUs after each interval
    interval_seconds: int
    num_gpus: int
    policy_seconds: float  # wall time spent in the policy
    model_seconds: float  # wall time spent fitting throughput models

    @property
    def jct(self) -> np.ndarray:
        return (self.completion - self.workload.time).astype(np.float64)

    @property
    def num_intervals(self) -> int:
        return len(self.gpus_used)


def placement_counts(nodes: list[int]) -> list[int]:
    """GPUs per node of a node-per-GPU list, consecutive equal nodes counted together, in list order."""
    counts: list[int] = []
    for k, node in enumerate(nodes):
        if k and node == nodes[k - 1]:
            counts[-1] += 1
        else:
            counts.append(1)
    return counts


class Cluster:
    """One workload's jobs on the cluster, an interval at a time: `train` the interval, then `view` what a
    policy sees and `apply` its allocations (the loop of `simulate`; a learning environment drives it a
    decision at a time). `run` gathers the result."""

    def __init__(self, workload: Workload, policy: PolluxPolicy, preset: PolluxPreset):
        self.workload, self.policy, self.preset = workload, policy, preset
        self.apps = load_applications()
        self.tables = app_tables(self.apps)
        self.jobs = kernels.make_jobs(workload.app, workload.time, policy.batch_sizes(workload))
        self.allocations: Allocations = {}
        self.time = 0
        self.left = np.zeros(len(workload), dtype=np.int64)
        self.clock = np.zeros(len(workload), dtype=np.int64)
        self.model_seconds = 0.0
        self.gpus_used: list[int] = []  # after each interval
        self.running: list[int] = []

    def train(self) -> None:
        """Every job trains for one interval; jobs that met a new configuration refit their model and go on."""
        seconds, measure = self.preset.interval_seconds, self.policy.fits_models
        try:
            kernels.advance_all(self.jobs, seconds, self.time, self.tables, measure, self.left, self.clock)
        except ValueError as exc:  # a placement or batch size outside the artifact's measurements
            raise Dl2Error(f"{self.policy.name} at {self.time} s: {exc}") from None
        for j in np.flatnonzero(self.left >= 0):
            left, clock = int(self.left[j]), int(self.clock[j])
            while left >= 0:
                self._refit(j)
                kernels.set_batch(self.jobs, j, self.tables[self.jobs.app[j]])
                paused, left, clock = kernels.advance(self.jobs, j, left, clock, self.tables[self.jobs.app[j]], measure)
                left = left if paused else -1
        self.time += seconds

    def _refit(self, j: int) -> None:
        start = time.perf_counter()
        self.jobs.perf[j] = fit_profile(self.jobs.profile[j, : self.jobs.profile_count[j]])
        self.jobs.has_perf[j] = True
        self.model_seconds += time.perf_counter() - start

    def schedule(self) -> None:
        """The policy's allocations for the active jobs (none asked when no job is active)."""
        view = self.view()
        self.apply(view, self.policy.allocate(view) if len(view.active) else {})

    def view(self) -> ClusterView:
        """What a policy sees now: the submitted, uncompleted jobs and what they hold."""
        jobs = self.jobs
        active = np.flatnonzero((jobs.submit <= self.time) & (jobs.completion < 0))
        held = {j: self.allocations[j] for j in active.tolist() if j in self.allocations}
        p = self.preset
        return ClusterView(self.time, active, held, jobs, self.workload, self.apps, p.num_nodes, p.gpus_per_node, p.restart_seconds)

    def apply(self, view: ClusterView, allocations: Allocations) -> None:
        """Allocations for `view`'s active jobs from now on: every job whose GPUs changed restarts."""
        self._check(allocations, set(view.active.tolist()))
        held = view.allocations
        for j in set(allocations) | set(held):
            if allocations.get(j) != held.get(j):
                self._reallocate(j, allocations.get(j, []))
        self.allocations = allocations
        self.gpus_used.append(sum(len(v) for v in allocations.values()))
        self.running.append(sum(1 for v in allocations.values() if v))

    @property
    def finished(self) -> bool:
        return bool((self.jobs.completion >= 0).all())

    def run(self, policy_seconds: float) -> PolluxRun:
        """The result so far, under the policy's name."""
        p, jobs = self.preset, self.jobs
        return PolluxRun(self.policy.name, self.workload, jobs.completion.copy(), np.maximum(jobs.restarts, 0),
                         np.asarray(self.gpus_used), np.asarray(self.running), p.interval_seconds,
                         p.num_nodes * p.gpus_per_node, policy_seconds, self.model_seconds)

    def _reallocate(self, j: int, nodes: list[int]) -> None:
        jobs = self.jobs
        if not nodes:
            jobs.nnodes[j] = 0
            jobs.atomic_bsz[j] = 0
            return
        counts = placement_counts(nodes)
        jobs.counts[j, :] = 0
        jobs.counts[j, : len(counts)] = counts
        jobs.nnodes[j] = len(counts)
        jobs.step_sync_bsz[j] = -1  # a new placement: its throughput is computed afresh
        kernels.set_batch(jobs, j, self.tables[jobs.app[j]])
        jobs.rescale[j] = self.preset.restart_seconds
        jobs.restarts[j] += 1  # -1 (never started) -> 0

    def _check(self, allocations: Allocations, active: set[int]) -> None:
        used = np.zeros(self.preset.num_nodes, dtype=np.int64)
        for j, nodes in allocations.items():
            if j not in active:
                raise Dl2Error(f"{self.policy.name} at {self.time} s: allocated GPUs to job {j}, which is not active")
            if len(set(nodes)) > kernels.MAX_PLACEMENT_NODES:
                raise Dl2Error(f"{self.policy.name} at {self.time} s: job {j} spans more than {kernels.MAX_PLACEMENT_NODES} nodes")
            np.add.at(used, np.asarray(nodes, dtype=np.int64), 1)
        if (used > self.preset.gpus_per_node).any():
            node = int(np.argmax(used > self.preset.gpus_per_node))
            raise Dl2Error(f"{self.policy.name} at {self.time} s: node {node} gets {used[node]} GPUs, it has {self.preset.gpus_per_node}")


def simulate(workload: Workload, policy: PolluxPolicy, preset: PolluxPreset, progress: bool = False,
             max_seconds: int = 10_000_000) -> PolluxRun:
    """`workload` to completion under `policy` on `preset`'s cluster. BLAS runs single-threaded meanwhile:
    the world's only BLAS work is the throughput fits' tiny vectors, and idle BLAS threads spinning between
    them made the fits 3x slower on two cores, and 20x beside a second run."""
    with threadpool_limits(limits=1, user_api="blas"):
        return _simulate(workload, policy, preset, progress, max_seconds)


def _simulate(workload: Workload, policy: PolluxPolicy, preset: PolluxPreset, progress: bool, max_seconds: int) -> PolluxRun:
    cluster = Cluster(workload, policy, preset)
    policy_seconds = 0.0
    with tqdm(total=len(workload), desc=f"{policy.name}", unit="job", disable=not progress, leave=False) as bar:
        while not cluster.finished:
            if cluster.time >= max_seconds:
                raise Dl2Error(f"{policy.name}: the workload did not finish within {max_seconds} s")
            done = int((cluster.jobs.completion >= 0).sum())
            cluster.train()
            start = time.perf_counter()
            cluster.schedule()
            policy_seconds += time.perf_counter() - start
            bar.update(int((cluster.jobs.completion >= 0).sum()) - done)
    return cluster.run(policy_seconds)
