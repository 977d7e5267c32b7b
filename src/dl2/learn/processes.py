"""Independent training jobs, in this process or in a pool of fresh ones (spawned: no state leaks between
jobs, so a job's result is the one it would give alone)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any


def run_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], workers: int, in_order: bool = True) -> Iterator[tuple[int, Any]]:
    """(index, fn(*jobs[index])) for every job: in this process when `workers` <= 1, else `workers` at a
    time in spawned processes, yielded in job order (`in_order`) or as each job ends."""
    workers = min(workers, len(jobs))
    if workers <= 1:  # in this process: no interpreter to start
        for index, args in enumerate(jobs):
            yield index, fn(*args)
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(fn, *args): index for index, args in enumerate(jobs)}
        for future in (futures if in_order else as_completed(futures)):
            yield futures[future], future.result()
