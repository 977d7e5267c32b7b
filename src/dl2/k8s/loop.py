"""The dl2 scheduler's loop: every slot, observe the cluster, ask any dl2 scheduler, apply, pace.

An API failure that outlasts the client's retries (or a conflict with another writer) does not end the
loop: the slot is tried again after a backoff, which is safe because a slot's allocation is committed
to the cluster before it is carried out and each job's progress is counted once per slot. With a
`Lease`, renewed from a background thread, the loop acts only while it holds it, so of several schedulers
of one namespace one acts; should a stalled holder wake after losing it, its writes carry the versions it
read and the API server refuses them (409).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dl2.k8s.backend import KubeCluster
from dl2.k8s.client import ApiError
from dl2.k8s.lease import Lease
from dl2.schedulers.base import Scheduler


def run_slot(backend: KubeCluster, scheduler: Scheduler) -> float:
    """One slot: a committed allocation (after a restart) is carried out as is; else the scheduler decides."""
    obs = backend.observe()
    if backend.committed is not None:
        return backend.resume()
    return backend.apply(scheduler.schedule(obs))


def run(backend: KubeCluster, scheduler: Scheduler, slot_seconds: float = 0.0, max_slots: int | None = None,
        until_done: bool = True, log: Callable[[str], None] = print, max_backoff: float = 5.0,
        progress: Callable[[str], None] | None = None, lease: Lease | None = None) -> int:
    """Run slots until every DL2Job is done (`until_done`) or `max_slots` ran; returns the slots run. `log`
    hears of API failures retried; `progress`, when given, gets one line per slot run, and one when the loop
    waits for the `lease` another scheduler holds."""
    ran, backoff, waiting = 0, 0.1, False
    if lease is not None:
        lease.keep(log)
    try:
        while max_slots is None or ran < max_slots:
            started = time.monotonic()
            try:
                if lease is not None and not lease.held:
                    if not waiting and progress is not None:
                        progress(f"waiting: another scheduler holds the lease of namespace {backend.namespace}")
                    waiting = True
                    time.sleep(min(1.0, lease.duration / 3))
                    continue
                waiting = False
                if until_done and backend.done:
                    break
                slot = backend.slot
                reward = run_slot(backend, scheduler)
                if progress is not None:
                    progress(slot_line(slot, reward, backend.census(), time.monotonic() - started))
            except ApiError as exc:
                log(f"{exc}; trying the slot again in {backoff:.1f} s")
                time.sleep(backoff)
                backoff = min(max_backoff, 2 * backoff)
                continue
            backoff = 0.1
            ran += 1
            time.sleep(max(0.0, started + slot_seconds - time.monotonic()))
    finally:
        if lease is not None:
            lease.stop()
    return ran


def slot_line(slot: int, reward: float, census: dict[str, int], seconds: float) -> str:
    """What an operator reads after each slot (`seconds`: the slot's wall-clock time)."""
    return (f"slot {slot}: {census['waiting']} waiting, {census['running']} running, {census['done']} done; "
            f"{census['tasks']} tasks placed; reward {reward:.3f}; {seconds:.1f} s")
