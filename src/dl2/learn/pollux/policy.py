"""DL2 as a policy of the Pollux world: a decision function run through the world's own `simulate`."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dl2.learn.pollux.decisions import IntervalDecisions, Variant, check_settings
from dl2.pollux.cluster import Allocations, ClusterView
from dl2.pollux.workload import Workload

Decide = Callable[[np.ndarray, np.ndarray], int]  # (raw window state, legal actions) -> action


class DL2PolluxPolicy:
    """A `dl2.pollux.cluster.PolluxPolicy` that asks `decide(state, mask)` for one action at a time over a
    window of `window` jobs, as `dl2.learn.pollux.env.PolluxDecisionEnv` does, under `variant` (with
    `assign_one`, after one GPU to each window job)."""

    def __init__(self, decide: Decide, variant: str, window: int, name: str = "dl2", assign_one: bool = False):
        check_settings(variant, window)
        self.decide, self.window, self.name, self.assign_one = decide, int(window), name, bool(assign_one)
        self.variant = Variant(name, variant)
        self.fits_models = self.variant.fits_models
        self._caps: np.ndarray | None = None
        self._workload: Workload | None = None

    def batch_sizes(self, workload: Workload) -> np.ndarray:
        return self.variant.batch_sizes(workload)

    def allocate(self, view: ClusterView) -> Allocations:
        if view.workload is not self._workload:
            self._workload, self._caps = view.workload, self.variant.caps(view.workload)
        decisions = IntervalDecisions(view, self._caps, self.window, self.assign_one)
        while decisions.open:
            decisions.step(int(self.decide(decisions.state, decisions.mask)))
        return decisions.allocations()
