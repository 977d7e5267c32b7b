"""Independent jobs (ablation cells, fine-tuning runs, evaluations, the Pollux world's grid cells), run
where the `executor` section says: in this process or a pool of fresh ones (`kind: local`), or as tasks on
a Ray cluster (`kind: ray`, `dl2.distributed.ray_tasks`). Every job seeds itself, so a job's result is the one it would give alone,
wherever it ran; the driver alone writes results to files and MLflow."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any

from dl2.distributed.executor import LOCAL, Executor


def run_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], workers: int, in_order: bool = True,
             executor: Executor = LOCAL) -> Iterator[tuple[int, Any]]:
    """(index, fn(*jobs[index])) for every job, yielded in job order (`in_order`) or as each job ends:
    as Ray tasks (`executor.kind: ray`), else in this process when `workers` <= 1, else `workers` at a
    time in spawned processes (no state leaks between jobs)."""
    if executor.kind == "ray":
        from dl2.distributed.ray_tasks import run_ray_jobs

        yield from run_ray_jobs(fn, jobs, executor, in_order)
        return
    workers = min(workers, len(jobs))
    if workers <= 1:  # in this process: no interpreter to start
        for index, args in enumerate(jobs):
            yield index, fn(*args)
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                             initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(fn, *args): index for index, args in enumerate(jobs)}
        for future in (futures if in_order else as_completed(futures)):
            yield futures[future], future.result()


def exit_with_parent(parent: int, every: float = 1.0) -> None:
    """Pool initializer: end this worker within `every` seconds of its driver `parent` dying (a stage killed
    with SIGTERM or SIGKILL would otherwise leave its workers training, and writing checkpoints, as orphans)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
