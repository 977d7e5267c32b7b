"""dl2's jobs as Ray tasks (`executor.kind: ray`): each declares its CPUs and is rerun, up to
`executor.retries` times, when its worker or node dies; a job that raises is not rerun (the error is
dl2's to report). Ray is imported here, and only here and in `local_cluster`, so the
`local` executor never loads it."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dl2.distributed.executor import Executor
from dl2.errors import Dl2Error


def connect(executor: Executor) -> None:
    """Join the Ray cluster at `executor.address` (or `$RAY_ADDRESS`), or start one on this machine, bound
    to loopback, when neither names one. A driver that is already connected stays so. Workers run in
    their node's own environment: every node needs this dl2 installed (docs/ray.md)."""
    address = executor.address or os.environ.get("RAY_ADDRESS")
    where = "executor.address" if executor.address else "$RAY_ADDRESS"
    hint = "start one with `ray start --head` and pass the address it prints, or set executor.kind: local"
    if address and not _answers(address):  # Ray itself would retry for minutes
        raise Dl2Error(f"{where}: no Ray cluster answers at {address!r}; {hint}")
    if "ray" not in sys.modules and (not address or address.split(":")[0] in ("127.0.0.1", "localhost")):
        from dl2.distributed.local_cluster import loopback_ray

        loopback_ray()  # a cluster on this machine, reached on loopback
    import ray

    if ray.is_initialized():
        return
    try:
        if address:
            ray.init(address=address, logging_level="WARNING")
        else:
            ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise Dl2Error(f"{where}: cannot join the Ray cluster at {address!r} ({exc}); {hint}") from None


def _answers(address: str, timeout: float = 5.0) -> bool:
    """Whether something accepts connections at a `host:port` address, or a Ray Client one
    (`ray://host:port`); other forms, such as `auto`, pass."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return True
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError:
        return False
    return True


def driver_threads() -> dict[str, dict[str, str]]:
    """A runtime environment giving Ray's workers this process's BLAS and torch thread counts. numpy's
    BLAS solves the speed tables' fit with rounding that depends on its thread count, and Ray starts
    workers with one thread: without this, a job on Ray differs from the same job here in the last bits."""
    import torch
    from threadpoolctl import threadpool_info

    blas = max((lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"), default=1)
    return {"env_vars": {"OPENBLAS_NUM_THREADS": str(blas), "OMP_NUM_THREADS": str(torch.get_num_threads())}}


def run_ray_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], executor: Executor,
                 in_order: bool) -> Iterator[tuple[int, Any]]:
    """(index, fn(*jobs[index])) for every job, each a Ray task, yielded in job order or as each ends.
    Closing the iterator early (the driver stopped) cancels the tasks still running."""
    import ray

    connect(executor)
    task = ray.remote(num_cpus=executor.cpus_per_job, max_retries=executor.retries, retry_exceptions=False,
                      runtime_env=driver_threads())(fn)
    refs = [task.remote(*args) for args in jobs]
    index = {ref: i for i, ref in enumerate(refs)}
    finished: set[int] = set()
    try:
        pending = list(refs)
        while pending:
            if in_order:
                ready, pending = [pending[0]], pending[1:]
            else:
                ready, pending = ray.wait(pending, num_returns=1)
            finished.add(index[ready[0]])
            yield index[ready[0]], ray.get(ready[0])
    finally:
        for i, ref in enumerate(refs):
            if i not in finished:
                ray.cancel(ref, force=True)
