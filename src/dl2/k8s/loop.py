"""The dl2 scheduler's loop: every slot, observe the cluster, ask any dl2 scheduler, apply, pace.

An API failure that outlasts the client's retries (or a conflict with another writer) does not end the
loop: the slot is tried again after a backoff, which is safe because a slot's allocation is committed
to the cluster before it is carried out and each job's progress is counted once per slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dl2.k8s.backend import KubeCluster
from dl2.k8s.client import ApiError
from dl2.schedulers.base import Scheduler


def run_slot(backend: KubeCluster, scheduler: Scheduler) -> float:
    """One slot: a committed allocation (after a restart) is carried out as is; else the scheduler decides."""
    obs = backend.observe()
    if backend.committed is not None:
        return backend.resume()
    return backend.apply(scheduler.schedule(obs))


def run(backend: KubeCluster, scheduler: Scheduler, slot_seconds: float = 0.0, max_slots: int | None = None,
        until_done: bool = True, log: Callable[[str], None] = print, max_backoff: float = 5.0) -> int:
    """Run slots until every DL2Job is done (`until_done`) or `max_slots` ran; returns the slots run."""
    ran, backoff = 0, 0.1
    while max_slots is None or ran < max_slots:
        started = time.monotonic()
        try:
            if until_done and backend.done:
                break
            run_slot(backend, scheduler)
        except ApiError as exc:
            log(f"{exc}; trying the slot again in {backoff:.1f} s")
            time.sleep(backoff)
            backoff = min(max_backoff, 2 * backoff)
            continue
        backoff = 0.1
        ran += 1
        time.sleep(max(0.0, slot_seconds - (time.monotonic() - started)))
    return ran
