"""Workloads of the Pollux world: a CSV with a header and one job per row, in the artifact's format
`name,time,application,num_replicas,batch_size` (extra columns are ignored). `time` is the submission
second; `num_replicas` and `batch_size` are the GPUs and total batch size the job's user asked for, which
Tiresias (both) and Optimus+Oracle (the batch size) keep and Pollux chooses anew. Anything else is an error
naming the file, the line and the field."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dl2.errors import Dl2Error
from dl2.paths import atomic_path
from dl2.pollux.apps import APP_NAMES, Application, load_applications
from dl2.workload.traces import csv_rows, parse_int

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
MAX_REPLICAS = 64  # the artifact's cluster holds 64 GPUs


@dataclass(frozen=True)
class Workload:
    """Jobs of one workload, one array entry per job, in file order."""

    name: tuple[str, ...]
    time: np.ndarray  # int64 submission second >= 0
    app: np.ndarray  # int64 index into APP_NAMES
    num_replicas: np.ndarray  # int64 GPUs asked for
    batch_size: np.ndarray  # int64 total batch size asked for

    def __len__(self) -> int:
        return len(self.name)

    def first(self, count: int) -> Workload:
        """The first `count` jobs."""
        return Workload(self.name[:count], self.time[:count], self.app[:count], self.num_replicas[:count], self.batch_size[:count])

    def stats(self) -> dict:
        """Counts a person would check first."""
        counts = np.bincount(self.app, minlength=len(APP_NAMES))
        return {
            "num_jobs": len(self),
            "first_submission": int(self.time.min()),
            "last_submission": int(self.time.max()),
            "gpus_asked": int(self.num_replicas.sum()),
            "jobs_per_application": {n: int(k) for n, k in zip(APP_NAMES, counts) if k},
        }


def _check_batch(app: Application, batch_size: int, replicas: int, where: str) -> None:
    if not app.init_batch_size <= batch_size <= app.max_batch_size:
        raise Dl2Error(f"{where}: batch_size: {app.name} was measured at total batch sizes "
                       f"{app.init_batch_size}..{app.max_batch_size}, got {batch_size}")
    if math.ceil(batch_size / replicas - 1e-8) < app.min_local_bsz:
        raise Dl2Error(f"{where}: batch_size: {batch_size} over {replicas} GPUs is less than {app.name}'s smallest "
                       f"measured batch per GPU ({app.min_local_bsz})")


def read_workload(path: str | Path) -> Workload:
    """Read and validate a workload CSV; the first problem found is raised as a `Dl2Error`."""
    apps = load_applications()
    names: list[str] = []
    times, app_ids, replicas, batches = [], [], [], []
    seen: dict[str, str] = {}
    for where, row in csv_rows(path, COLUMNS, "workload"):
        name = row["name"].strip()
        if not name:
            raise Dl2Error(f"{where}: name: expected a job name, got an empty field")
        if name in seen:
            raise Dl2Error(f"{where}: name: duplicate job {name!r} (first on line {seen[name]})")
        seen[name] = where.rpartition(":")[2]
        app = row["application"].strip()
        if app not in APP_NAMES:
            raise Dl2Error(f"{where}: application: unknown application {app!r} (known: {', '.join(APP_NAMES)})")
        num_replicas = parse_int(row["num_replicas"], where, "num_replicas", 1)
        if num_replicas > MAX_REPLICAS:
            raise Dl2Error(f"{where}: num_replicas: expected at most {MAX_REPLICAS} GPUs, got {num_replicas}")
        batch_size = parse_int(row["batch_size"], where, "batch_size", 1)
        _check_batch(apps[APP_NAMES.index(app)], batch_size, num_replicas, where)
        names.append(name)
        times.append(parse_int(row["time"], where, "time", 0))
        app_ids.append(APP_NAMES.index(app))
        replicas.append(num_replicas)
        batches.append(batch_size)
    if not names:
        raise Dl2Error(f"{path}: no jobs (only a header)")
    return Workload(tuple(names), np.asarray(times, dtype=np.int64), np.asarray(app_ids, dtype=np.int64),
                    np.asarray(replicas, dtype=np.int64), np.asarray(batches, dtype=np.int64))


def write_workload(workload: Workload, path: str | Path) -> None:
    """Write `workload` as CSV in the artifact's format, atomically."""
    with atomic_path(path) as tmp:
        with tmp.open("w", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(COLUMNS)
            for k in range(len(workload)):
                writer.writerow((workload.name[k], int(workload.time[k]), APP_NAMES[workload.app[k]],
                                 int(workload.num_replicas[k]), int(workload.batch_size[k])))
