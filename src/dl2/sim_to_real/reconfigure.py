"""What a resize costs a trained job: the seconds from the change of its configuration to the new configuration's
first acknowledged step, measured with the trainer's processes run on this machine (no cluster).

Per job type and change (a grow adds a worker, a shrink removes one), two ways: `elastic`, as the `Trained`
workload resizes now (the controller writes the new plan; survivors checkpoint, leave the old world and join
the new one without restarting; an added process starts; a removed one is stopped with SIGTERM as its
deleted pod would be), and `restart`, as a whole new configuration (every old process is stopped with
SIGTERM and, once all have exited, as the backend waits for them, every process of the new configuration
starts). The simulator's `restart_seconds` models a configuration that adds a task, its `rejoin_seconds` one
that only removes some (`dl2.sim.engine.starting_fraction`).

    python -m dl2.sim_to_real.reconfigure [--models M ...] [--repeats N] [--out FILE.csv]

On kind, `dl2 testbed profile` measures a whole restart's start-up (`startup.csv`); a profile with an elastic
`Measuring` workload (its `elastic` field) measures the elastic one there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from dl2.paths import write_csv_atomic
from dl2.testbed.training.plan import Plan, write_plan
from dl2.testbed.training.progress import read_progress

CHANGES = {"grow": ((1, 1), (1, 2)), "shrink": ((1, 2), (1, 1))}  # (P, W) before and after
WAYS = ("elastic", "restart")
MODELS = ("cnn-text-classification", "resnet-50")


class LocalJob:
    """A job's member processes on this machine, in one state folder; each logs to `<folder>/<name>.log`."""

    def __init__(self, folder: Path, model: str, timeout: float):
        self.folder, self.state, self.timeout, self.procs = folder, folder / "state", timeout, {}
        self.args = ["--job", "job", "--model", model, "--state", str(self.state), "--epochs", "1000000", "--checkpoint-every", "1",
                     "--checkpoint-seconds", "0", "--log-seconds", "0", "--timeout", str(timeout), "--stop-timeout", "30"]

    def plan(self, generation: int, names: dict[str, tuple[str, int]], num_ps: int, num_workers: int) -> None:
        write_plan(self.state, Plan(generation, num_ps, num_workers, names))

    def start(self, names: list[str]) -> None:
        for name in names:
            with open(self.folder / f"{name}.log", "w") as out:
                self.procs[name] = subprocess.Popen([sys.executable, "-m", "dl2.testbed.training", "--member", name, *self.args],
                                                    stdout=out, stderr=subprocess.STDOUT)

    def stop(self, names: list[str]) -> None:
        """SIGTERM `names` and wait for them to exit."""
        for name in names:
            self.procs[name].terminate()
        for name in names:
            self.procs.pop(name).wait(timeout=self.timeout)

    def first_step(self, generation: int) -> float:
        """The Unix time generation `generation` wrote its first progress record with an acknowledged step."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            record = read_progress(self.state)
            if record is not None and record["generation"] == generation and record["steps"] > record["start_step"]:
                return float(record["time"])
            if any(p.poll() is not None for p in self.procs.values()):
                break
            time.sleep(0.01)
        raise RuntimeError(f"generation {generation} acknowledged no step; logs in {self.folder}")


def members(generation: int, num_ps: int, num_workers: int, keep: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """The plan's members: those of `keep` that fit (by role, in order) and new ones for the rest."""
    out: dict[str, tuple[str, int]] = {}
    for role, count in (("ps", num_ps), ("worker", num_workers)):
        names = [n for n, (r, _) in sorted(keep.items(), key=lambda kv: kv[1]) if r == role][:count]
        names += [f"{role}-{generation}-{k}" for k in range(count - len(names))]
        out.update((n, (role, i)) for i, n in enumerate(names))
    return out


def measure_once(folder: Path, model: str, change: str, way: str, timeout: float = 300.0) -> float:
    """Seconds from the change to the new configuration's first acknowledged step (module docstring)."""
    (p0, w0), (p1, w1) = CHANGES[change]
    job = LocalJob(folder, model, timeout)
    try:
        before = members(1, p0, w0, {})
        job.plan(1, before, p0, w0)
        job.start(list(before))
        job.first_step(1)
        time.sleep(1.0)  # training, not starting
        began = time.time()
        if way == "elastic":
            after = members(2, p1, w1, before)
            job.plan(2, after, p1, w1)
            job.stop([n for n in before if n not in after])
            job.start([n for n in after if n not in before])
        else:
            job.stop(list(before))
            after = members(2, p1, w1, {})
            job.plan(2, after, p1, w1)
            job.start(list(after))
        return job.first_step(2) - began
    finally:
        for proc in job.procs.values():
            proc.kill()
            proc.wait()


def measure(models: tuple[str, ...] = MODELS, repeats: int = 1, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Every (model, change, way), `repeats` times: a row each with its seconds."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="dl2-reconfigure-") as tmp:
        for model in models:
            for repeat in range(repeats):
                for change in CHANGES:
                    for way in WAYS:
                        seconds = measure_once(Path(tmp) / f"{model}-{change}-{way}-{repeat}", model, change, way)
                        log(f"{model} {change} {way}: {seconds:.2f} s")
                        rows.append({"model": model, "change": change, "way": way, "repeat": repeat, "seconds": round(seconds, 3)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dl2.sim_to_real.reconfigure", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", type=Path, help="write the measurements here (CSV)")
    a = p.parse_args(argv)
    table = measure(tuple(a.models), a.repeats)
    print(table.groupby(["model", "change", "way"], sort=False).seconds.median().to_string())
    if a.out:
        write_csv_atomic(a.out, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
