"""`dl2 testbed profile`: every job type's training speed measured on the kind testbed at each (#PS, #workers)
it allows, written as a speed table the simulator reads (`speed_table: testbed`, DESIGN §6).

For each job type and repeat, one DL2Job trains through the grid's configurations, one slot each: its pods
start, and once the configuration's PS 0 has written its first progress record, the measurement runs until
a record `seconds` later. The configuration's speed is the steps (worker batches) acknowledged between
those two records over the time between them, so start-up, rendezvous and the first checkpoint are left
out, and each training process's CPU use over the same window is read from /proc (a kind node's
processes are this host's). Then the next configuration resumes from the job's checkpoint; each repeat is a
fresh job. A job measures alone on the cluster, as the DL2 authors measured theirs.

Outputs, in `out` (each file written atomically, once every measurement is in; a profile of some job types
keeps the other job types' rows of the profile already there, so one job type can be profiled again):
- `speed.txt`: one row per configuration in the authors' format (`data/reference/README.md`), the mean over
  repeats: per-worker speed in batches/s (a sync step takes one batch from every worker, so the workers'
  shares are equal), per-PS and per-worker CPU use in cores;
- `profile.csv`: every measurement (model, num_ps, num_workers, repeat, steps_per_second, seconds, CPU use);
- `testbed.json`: the stand-ins' batches per epoch and batch sizes (the `testbed` catalog's epochs) and, per
  job type, how it was profiled: the configurations, the window, the repeats, the host's cores, the kind
  workers, the dl2 commit and the date.
Measurements are also appended to `profile.partial.csv` as they come, so an interrupted profile resumes at
the next (job type, repeat) when run again with the same settings.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dl2.backends.kube import KubeCluster
from dl2.backends.loop import run
from dl2.backends.workloads import Trained
from dl2.errors import Dl2Error
from dl2.kube.client import Kube
from dl2.kube.jobs import JobSpec
from dl2.kube.resources import PodRuntime
from dl2.paths import atomic_path, repo_root, write_csv_atomic, write_json_atomic
from dl2.sim.scenario import Scenario
from dl2.testbed.training.plan import Plan, read_plan
from dl2.testbed.training.progress import read_progress
from dl2.workload.catalog import load_catalog
from dl2.workload.presets import Preset
from dl2.workload.speed import measurement_row
from dl2.workload.traces import Trace

NAMESPACE = "dl2-profile"
DEMANDS = "public_release"  # the kind workers advertise the paper's node (8 CPU, 8 GPU slots) and its demands
COLUMNS = ["model", "num_ps", "num_workers", "repeat", "steps_per_second", "seconds", "steps", "ps_cpu", "worker_cpu",
           "startup_seconds"]
PARTIAL = "profile.partial.csv"
EPOCHS = 1e9  # a profiled job never finishes


@dataclass(frozen=True)
class ProfileGrid:
    """What to measure: job types, (#PS, #workers) configurations in order, repeats, and the window per measurement."""

    models: tuple[str, ...]
    configurations: tuple[tuple[int, int], ...]
    repeats: int = 3
    seconds: float = 10.0

    def __post_init__(self):
        if not self.models or not self.configurations:
            raise Dl2Error("profile: name at least one model and one (#PS, #workers) configuration")
        if self.repeats < 1 or self.seconds <= 0:
            raise Dl2Error(f"profile: --repeats must be >= 1 and --seconds > 0 (got {self.repeats} and {self.seconds:g})")
        if any(p < 1 or w < 1 for p, w in self.configurations):
            raise Dl2Error(f"profile: every configuration needs at least one PS and one worker, got {list(self.configurations)}")


def allowed_configurations(max_tasks: int, num_nodes: int, models: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """Every (#PS, #workers) in 1..max_tasks that the testbed's nodes hold for every job type in `models`."""
    catalog = load_catalog(DEMANDS)
    capacity = np.array([8, 8]) * num_nodes
    grid = []
    for p in range(1, max_tasks + 1):
        for w in range(1, max_tasks + 1):
            need = [p * catalog.ps_demand[catalog.index(m)] + w * catalog.worker_demand[catalog.index(m)] for m in models]
            if all((n <= capacity).all() for n in need):
                grid.append((p, w))
    return tuple(grid)


def training_processes(state_in_pod: str, role: str | None = None, index: int | None = None, plan: Plan | None = None) -> list[int]:
    """Host pids of a job's training processes (`python -m dl2.testbed.training --state STATE ...`), of one role and
    index if given: a kind node is a container, so the processes of its pods are this host's. An elastic job's
    process (`--member NAME`) has the role and index `plan` (the job's, read from its state folder) gives it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue
        if "dl2.testbed.training" not in args or "--state" not in args or args[args.index("--state") + 1] != state_in_pod:
            continue
        if "--member" in args:
            mine = plan.members.get(args[args.index("--member") + 1]) if plan is not None else None
            has_role, has_index = mine if mine is not None else (None, None)
        else:
            has_role, has_index = args[args.index("--role") + 1], int(args[args.index("--index") + 1])
        if (role is not None and has_role != role) or (index is not None and has_index != index):
            continue
        found.append(int(entry.name))
    return found


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a process (all its threads), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_cpu(state_in_pod: str, num_ps: int, num_workers: int, plan: Plan | None) -> dict[tuple[str, int], float | None]:
    """CPU seconds so far of each of the job's processes, by (role, index)."""
    out: dict[tuple[str, int], float | None] = {}
    for role, count in (("ps", num_ps), ("worker", num_workers)):
        for k in range(count):
            pids = training_processes(state_in_pod, role, k, plan)
            out[role, k] = _cpu_seconds(pids[0]) if len(pids) == 1 else None
    return out


@dataclass
class Measuring(Trained):
    """A `Trained` workload whose slot lasts until its one job's configuration has been measured (`seconds`)."""

    seconds: float = 10.0
    timeout: float = 300.0  # for a configuration to start and write its first progress record
    elastic: bool = False  # every configuration starts anew: its start-up is what `restart_seconds` models (True: a
    #                        resize's, what `rejoin_seconds` models for a shrink)
    measured: list[dict] = field(default_factory=list)

    def advance(self, kube: Kube, slot: int, jobs: list[dict], specs: list[JobSpec], nodes: set[str],
                slot_start: float) -> tuple[float, list[str]]:
        job, spec = jobs[0], specs[0]
        folder, in_pod = self.state_folder(job), str(self.state_folder(job, in_pod=True))
        first = self._record(folder, lambda r: r["generation"] == slot,
                             f"{spec.model}: the configuration started at slot {slot} wrote no progress within {self.timeout:g} s")
        cpu_before = _process_cpu(in_pod, first["num_ps"], first["num_workers"], read_plan(folder))
        last = self._record(folder, lambda r: r["generation"] == slot and r["time"] >= first["time"] + self.seconds,
                            f"{spec.model}: the configuration of slot {slot} stopped writing progress")
        cpu_after = _process_cpu(in_pod, last["num_ps"], last["num_workers"], read_plan(folder))
        window = last["time"] - first["time"]

        def cores(role: str, count: int) -> list[float]:
            used = [cpu_after[role, k] - cpu_before[role, k] if cpu_after[role, k] is not None and cpu_before[role, k] is not None
                    else float("nan") for k in range(count)]
            return [u / window for u in used]

        # the configuration trained (steps - start_step) / steps_per_second seconds before its first record
        rate = first["steps_per_second"]
        began = first["time"] - (first["steps"] - first["start_step"]) / rate if rate else first["time"]
        self.measured.append({"num_ps": last["num_ps"], "num_workers": last["num_workers"], "startup_seconds": began - slot_start,
                              "steps_per_second": (last["steps"] - first["steps"]) / window, "seconds": window,
                              "steps": last["steps"] - first["steps"], "ps_cpu": cores("ps", last["num_ps"]),
                              "worker_cpu": cores("worker", last["num_workers"])})
        return 0.0, []

    def _record(self, folder: Path, ready: Callable[[dict], bool], failure: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            record = read_progress(folder)
            if record is not None and ready(record):
                return record
            time.sleep(0.2)
        raise Dl2Error(failure)


class _Configurations:
    """A scheduler that gives job 0 the grid's configuration k at slot k, on the least-loaded nodes."""

    name = "profile"

    def __init__(self, configurations: Sequence[tuple[int, int]]):
        self.configurations = list(configurations)

    def schedule(self, obs):
        alloc = obs.allocation()
        num_ps, num_workers = self.configurations[obs.slot]
        for _ in range(num_ps):
            if not alloc.add_ps(0):
                raise Dl2Error(f"profile: {num_ps} PS and {num_workers} workers do not fit the testbed's nodes")
        for _ in range(num_workers):
            if not alloc.add_worker(0):
                raise Dl2Error(f"profile: {num_ps} PS and {num_workers} workers do not fit the testbed's nodes")
        return alloc


def _preset(num_nodes: int, max_tasks: int) -> Preset:
    """The scenario the profiling backend schedules with (its speed table is never used)."""
    return Preset(name="profile", num_nodes=num_nodes, num_jobs=1, max_arrivals=1, max_epochs=1, max_tasks=max_tasks,
                  speed_table=DEMANDS, bucket_to_model=False)


def measure(kube: Kube, runtime: PodRuntime, grid: ProfileGrid, num_nodes: int, done: pd.DataFrame | None = None,
            on_row: Callable[[dict], None] | None = None, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Every measurement of `grid` (`COLUMNS`), skipping the (model, repeat) pairs `done` holds; `on_row` gets
    each new row as it is measured."""
    catalog = load_catalog(DEMANDS)
    max_tasks = max(max(c) for c in grid.configurations)
    scenario = Scenario(_preset(num_nodes, max_tasks))
    workload = Measuring(NAMESPACE, catalog.names, runtime, slot_seconds=0.0, fine_grained=True, seconds=grid.seconds)
    backend = KubeCluster(kube, scenario, NAMESPACE, "dl2", workload=workload)
    rows = [] if done is None else done.to_dict(orient="records")
    finished = {(r["model"], int(r["repeat"])) for r in rows}
    total, count = len(grid.models) * grid.repeats * len(grid.configurations), len(rows)

    def keep(model: str, repeat: int, slot: int, reward: float, seconds: float) -> None:
        nonlocal count
        m = workload.measured[-1]
        row = {"model": model, "repeat": repeat, **m, "ps_cpu": json.dumps(_rounded(m["ps_cpu"])),
               "worker_cpu": json.dumps(_rounded(m["worker_cpu"]))}
        count += 1
        log(f"profile {count}/{total}: {model} ({m['num_ps']} PS, {m['num_workers']} workers), repeat {repeat}: "
            f"{m['steps_per_second']:.2f} steps/s over {m['seconds']:.1f} s; CPU cores: PS {_rounded(m['ps_cpu'])}, "
            f"workers {_rounded(m['worker_cpu'])}")
        rows.append(row)
        if on_row is not None:
            on_row(row)

    try:
        for model in grid.models:
            for repeat in range(grid.repeats):
                if (model, repeat) in finished:
                    continue
                trace = Trace(np.array([1]), np.array([0]), np.array([catalog.index(model)]), np.array([EPOCHS]), catalog.names)
                backend.restart(trace)
                workload.measured.clear()
                run(backend, _Configurations(grid.configurations), max_slots=len(grid.configurations), until_done=False,
                    on_slot=functools.partial(keep, model, repeat))
                backend.close()
    finally:
        backend.close()
        shutil.rmtree(runtime.shared_here / NAMESPACE, ignore_errors=True)
    return pd.DataFrame(rows, columns=COLUMNS)


def _rounded(values: Sequence[float]) -> list[float]:
    return [round(float(v), 3) for v in values]


def speed_rows(profile: pd.DataFrame) -> list[str]:
    """The speed table's lines: one per (model, configuration), the mean over repeats, in the authors' format."""
    from dl2.testbed.training.models import STANDINS  # torch: only where the stand-ins' batch sizes are needed

    lines = []
    for (model, num_ps, num_workers), group in profile.groupby(["model", "num_ps", "num_workers"], sort=False):
        total = float(group.steps_per_second.mean())
        ps_cpu = np.nanmean(np.array([json.loads(v) for v in group.ps_cpu], dtype=float), axis=0)
        worker_cpu = np.nanmean(np.array([json.loads(v) for v in group.worker_cpu], dtype=float), axis=0)
        lines.append(measurement_row(model, "sync", STANDINS[model].batch_size * num_workers, num_ps, num_workers,
                                     [total / num_workers] * num_workers, ps_cpu, worker_cpu))
    return lines


def spread(profile: pd.DataFrame) -> pd.DataFrame:
    """Per (model, configuration): mean and standard deviation of the speed over repeats, and their ratio."""
    table = profile.groupby(["model", "num_ps", "num_workers"], sort=False).steps_per_second.agg(["mean", "std", "count"])
    table = table.rename(columns={"mean": "steps_per_second", "std": "sd", "count": "repeats"}).reset_index()
    table["cv"] = table.sd / table.steps_per_second
    return table


def startup(profile: pd.DataFrame) -> dict[str, float]:
    """Per job type, the median seconds from a configuration's pods being created to its training (torch's import,
    the rendezvous, the checkpoint's load): what the simulator's `restart_seconds` models. Measurements made
    before it was recorded are left out."""
    known = profile.dropna(subset=["startup_seconds"])
    return {str(model): float(group.startup_seconds.median()) for model, group in known.groupby("model", sort=False)}


def facts(grid: ProfileGrid, workers: Sequence[str], before: dict | None = None, cpu_millis_per_slot: int = 0) -> dict:
    """`testbed.json`: the stand-ins' epochs (the `testbed` catalog's) and how each job type's speeds were
    measured (`before`'s entries for the job types `grid` leaves out are kept), with the CPU each task pod had
    per CPU slot (0: none, the pods shared the host)."""
    from dl2.testbed.training.models import STANDINS

    try:
        commit = subprocess.run(["git", "-C", str(repo_root()), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    how = {"configurations": [list(c) for c in grid.configurations], "repeats": grid.repeats, "seconds": grid.seconds,
           "host_cores": os.cpu_count(), "cpu_millis_per_slot": cpu_millis_per_slot, "kind_workers": list(workers), "commit": commit,
           "date": datetime.date.today().isoformat()}
    profiled = {**(before or {}).get("profiled", {}), **{model: how for model in grid.models}}
    return {"demands": DEMANDS, "mode": "sync", "speed_unit": "batches per second (one batch: one worker's step)",
            "steps_per_epoch": {m: s.steps_per_epoch for m, s in STANDINS.items()},
            "batch_size": {m: s.batch_size for m, s in STANDINS.items()},
            "profiled": {m: profiled[m] for m in STANDINS if m in profiled}}


def profile(kube: Kube, runtime: PodRuntime, workers: Sequence[str], grid: ProfileGrid, out: Path,
            log: Callable[[str], None] = print) -> pd.DataFrame:
    """Measure `grid` on the testbed and write `speed.txt`, `profile.csv` and `testbed.json` into `out` (module
    docstring); resumes from `out/profile.partial.csv` when it was left by a profile of the same grid."""
    out.mkdir(parents=True, exist_ok=True)
    partial, settings = out / PARTIAL, out / f"{PARTIAL}.json"
    key = {**asdict(grid), "configurations": [list(c) for c in grid.configurations]}
    done = None
    if partial.is_file() and settings.is_file() and json.loads(settings.read_text()) == key:
        done = pd.read_csv(partial)
        log(f"profile: resuming, {len(done)} measurements in {partial}")
        done = done[done.groupby(["model", "repeat"]).model.transform("size") == len(grid.configurations)]
    write_json_atomic(settings, key)
    rows = [] if done is None else done.to_dict(orient="records")

    def keep(row: dict) -> None:
        rows.append(row)
        write_csv_atomic(partial, pd.DataFrame(rows, columns=COLUMNS))

    measured = measure(kube, runtime, grid, len(workers), done, keep, log)
    previous = pd.read_csv(out / "profile.csv") if (out / "profile.csv").is_file() else pd.DataFrame(columns=COLUMNS)
    before = json.loads((out / "testbed.json").read_text()) if (out / "testbed.json").is_file() else None
    names = load_catalog(DEMANDS).names
    table = pd.concat([previous[~previous.model.isin(grid.models)], measured], ignore_index=True)
    table = table.sort_values("model", key=lambda m: m.map(names.index), kind="stable", ignore_index=True)
    with atomic_path(out / "speed.txt") as tmp:
        tmp.write_text("\n".join(speed_rows(table)) + "\n")
    write_csv_atomic(out / "profile.csv", table)
    write_json_atomic(out / "testbed.json", facts(grid, workers, before, runtime.cpu_millis_per_slot))
    partial.unlink(missing_ok=True)
    settings.unlink(missing_ok=True)
    return table
