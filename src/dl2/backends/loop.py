"""The one slot loop, for every backend and every scheduler: observe, let the scheduler allocate (unless the
backend holds an allocation committed before a restart), apply, pace; and the line an operator reads after
each slot. `simulate`, the Kubernetes scheduler, sim-to-real replay and profiling all run it.

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

from dl2.kube.client import ApiError
from dl2.kube.lease import Lease
from dl2.schedulers.base import Backend, Scheduler

SlotDone = Callable[[int, float, float], None]  # (slot, reward, wall-clock seconds the slot took)


def run_slot(backend: Backend, scheduler: Scheduler) -> float:
    """One slot: an allocation the backend committed before a restart is carried out as is; else the scheduler decides."""
    obs = backend.observe()
    reward = backend.resume()
    return backend.apply(scheduler.schedule(obs)) if reward is None else reward


def run(backend: Backend, scheduler: Scheduler, slot_seconds: float = 0.0, max_slots: int | None = None,
        until_done: bool = True, log: Callable[[str], None] = print, max_backoff: float = 5.0,
        progress: Callable[[str], None] | None = None, lease: Lease | None = None, on_slot: SlotDone | None = None) -> int:
    """Run slots until every job is done (`until_done`) or `max_slots` ran, each taking at least `slot_seconds`;
    returns the slots run. `log` hears of API failures retried; `progress`, when given, gets one line per slot
    run (`slot_line`), and one when the loop waits for the `lease` another scheduler holds; `on_slot` is called
    after each slot."""
    ran, backoff, waiting = 0, 0.1, False
    if lease is not None:
        lease.keep(log)
    try:
        while max_slots is None or ran < max_slots:
            started = time.monotonic()
            try:
                if lease is not None and not lease.held:
                    if not waiting and progress is not None:
                        progress(f"waiting: another scheduler holds the lease of namespace {lease.namespace}")
                    waiting = True
                    time.sleep(min(1.0, lease.duration / 3))
                    continue
                waiting = False
                if until_done and backend.done:
                    break
                slot = backend.slot
                reward = run_slot(backend, scheduler)
                seconds = time.monotonic() - started
                if on_slot is not None:
                    on_slot(slot, reward, seconds)
                if progress is not None:
                    progress(slot_line(slot, reward, backend.census(), seconds))
            except ApiError as exc:
                log(f"{exc}; trying the slot again in {backoff:.1f} s")
                time.sleep(backoff)
                backoff = min(max_backoff, 2 * backoff)
                continue
            backoff = 0.1
            ran += 1
            if slot_seconds > 0:
                time.sleep(max(0.0, started + slot_seconds - time.monotonic()))
    finally:
        if lease is not None:
            lease.stop()
    return ran


def slot_line(slot: int, reward: float, census: dict[str, int], seconds: float) -> str:
    """What an operator reads after each slot (`seconds`: the slot's wall-clock time). Where the backend has
    pods still starting (`starting` in its census, `starting_ready` of them Ready), the line says so, so that
    a slot with no training yet does not read like a hang."""
    starting = f"pods starting: {census['starting_ready']} of {census['starting']} ready; " if census.get("starting") else ""
    return (f"slot {slot}: {census['waiting']} waiting, {census['running']} running, {census['done']} done; "
            f"{census['tasks']} tasks placed; {starting}reward {reward:.3f}; {seconds:.1f} s")
