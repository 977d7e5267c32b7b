"""The DL2 decision environment of the Pollux world (issue 35): one workload under DL2, a decision at a time.

Each 60-s interval the world first trains (`dl2.pollux.cluster.Cluster.train`, the loop of `simulate`), then
the environment asks for decisions over a window of the active jobs (`dl2.learn.pollux.decisions`: with
`assign_one`, after one GPU to each window job; "+1 GPU to window job k", masked at the job's GPU cap and
when no GPU is free, or void). When the interval's decisions end, the world applies the placement
(restarting every job whose GPUs changed) and trains the next interval. Intervals with nothing to decide
(no active job, or no legal "+1") run without asking. The reward is paid on the step that ends an
interval's decisions: the progress the next interval gained, summed over jobs as epochs gained over the
job's epochs to completion (restarts cost progress, so they are paid for); other steps pay 0. An
episode's rewards sum to the number of jobs.
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np
from threadpoolctl import ThreadpoolController

from dl2.errors import Dl2Error
from dl2.learn.pollux.decisions import VARIANTS, IntervalDecisions, Variant, check_settings, epochs_fraction
from dl2.learn.pollux.features import NUM_JOB_FEATURES
from dl2.pollux.cluster import Cluster, ClusterView, PolluxRun
from dl2.pollux.workload import Workload
from dl2.workload.presets import PolluxPreset

__all__ = ["VARIANTS", "PolluxDecisionEnv"]


@lru_cache(maxsize=1)
def _blas() -> ThreadpoolController:
    """The process's thread pools, found once (finding them costs milliseconds, limiting them microseconds)."""
    return ThreadpoolController()


class PolluxDecisionEnv:
    """One workload under DL2 in the Pollux world, one decision at a time: `reset()` -> (state, mask),
    `step(action)` -> (state, mask, reward, done), `result()` after done. States are raw
    (window, NUM_JOB_FEATURES) float64 (`dl2.learn.pollux.features`); masks (window + 1,) bool, void last.
    An episode that reaches `max_seconds` (as `simulate`'s limit) ends with `truncated` set. `assign_one`:
    each interval first gives every window job one GPU (`dl2.learn.pollux.decisions`)."""

    def __init__(self, workload: Workload, preset: PolluxPreset, variant: str, window: int, name: str = "dl2",
                 max_seconds: int = 10_000_000, assign_one: bool = False):
        check_settings(variant, window)
        self.workload, self.preset, self.window, self.max_seconds = workload, preset, int(window), max_seconds
        self.assign_one = bool(assign_one)
        self.variant = Variant(name, variant)
        self.num_actions = self.window + 1
        self._done_state = np.zeros((self.window, NUM_JOB_FEATURES))
        self._done_mask = np.zeros(self.num_actions, dtype=np.bool_)
        self._done_mask[self.window] = True
        self.cluster: Cluster | None = None
        self.world_seconds = 0.0  # wall time in the world's own steps since made (training, views, placements applied)

    @property
    def view(self) -> ClusterView:
        """What the open interval's decisions see (the world's view of the active jobs)."""
        return self.decisions.view

    def reset(self, workload: Workload | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Start the episode (of `workload`, if given, from now on) and run to the first decision."""
        if workload is not None:
            self.workload = workload
        self.caps = self.variant.caps(self.workload)
        self.cluster = Cluster(self.workload, self.variant, self.preset)
        self.policy_seconds, self.truncated, self.done = 0.0, False, False
        self.done = not self._next_decision()
        self._progress = self._total_progress()
        return self._observe()

    def step(self, action: int) -> tuple[np.ndarray, np.ndarray, float, bool]:
        """Apply one action; (state, mask, reward, done)."""
        if self.done:
            raise Dl2Error("step: the episode is over; call reset()")
        if self.decisions.step(int(action)):
            return self.decisions.state.copy(), self.decisions.mask.copy(), 0.0, False
        allocations = self.decisions.allocations()
        start = time.perf_counter()
        self.policy_seconds += start - self._asked_at
        self.cluster.apply(self.decisions.view, allocations)
        self.world_seconds += time.perf_counter() - start
        before = self._progress
        self.done = not self._next_decision()
        self._progress = self._total_progress()
        state, mask = self._observe()
        return state, mask, self._progress - before, self.done

    def result(self) -> PolluxRun:
        """The run, as `dl2.pollux.cluster.simulate` returns it (policy time: from each interval's first
        question to its last answer)."""
        if not self.done:
            raise Dl2Error("result: the episode is not over")
        if self.truncated:
            raise Dl2Error(f"{self.variant.name}: the workload did not finish within {self.max_seconds} s")
        return self.cluster.run(self.policy_seconds)

    def _total_progress(self) -> float:
        """Every job's epochs done over its epochs, summed (what the open interval computed, if one is open)."""
        progress = epochs_fraction(self.cluster.jobs) if self.done else self.decisions.progress
        return float(progress.sum())

    def _observe(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies: the interval's own arrays change with its next decision."""
        if self.done:
            return self._done_state.copy(), self._done_mask.copy()
        return self.decisions.state.copy(), self.decisions.mask.copy()

    def _next_decision(self) -> bool:
        """Run intervals until one asks for a decision (True) or the episode ends (False)."""
        cluster = self.cluster
        while not cluster.finished:
            if cluster.time >= self.max_seconds:
                self.truncated = True
                return False
            start = time.perf_counter()
            self._train()
            view = cluster.view()
            self.world_seconds += time.perf_counter() - start
            allocations = {}
            if len(view.active):
                self.decisions = IntervalDecisions(view, self.caps, self.window, self.assign_one)
                if self.decisions.open:
                    self._asked_at = time.perf_counter()
                    return True
                allocations = self.decisions.allocations()  # one GPU each, with `assign_one`; else none
            cluster.apply(view, allocations)
        return False

    def _train(self) -> None:
        if self.variant.fits_models:  # refits: single-threaded BLAS, as `simulate` runs them
            with _blas().limit(limits=1, user_api="blas"):
                self.cluster.train()
        else:
            self.cluster.train()
