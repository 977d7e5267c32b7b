"""`dl2 bench --pipeline`: the main command, `uv run --locked dvc repro`, as a new user meets it: in a fresh
clone of this checkout's commit (a new virtual environment from uv's cache, numba compiling the simulator
once, an empty MLflow store, no stored ablation or Pollux cells), on this machine.

It reports the wall and CPU seconds of the whole command and of each stage. CPU seconds are user + system
time of a process and of every child it waited for (the notebook's kernel, its pool of workers), so they
count the work whatever else the machine runs; wall seconds grow with the machine's load, which the JSON
records beside them. A stage's wall time runs from dvc announcing it to dvc announcing the next (the last
to the command's end): it includes dvc saving the stage's outputs. Its CPU time is what `dl2 stage` itself
measured (`record_stage_usage`); what the stages leave of the total is uv creating the environment and dvc.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dl2.bench_record import finish, stamp
from dl2.errors import Dl2Error
from dl2.paths import repo_root

COMMAND = ("uv", "run", "--locked", "dvc", "repro")
USAGE_LOG = "DL2_STAGE_USAGE"  # set: `dl2 stage` appends its CPU seconds to this file, one JSON line a stage
# what the caller's environment says about its own checkout, which the clone must not inherit
CALLER_ONLY = ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "MLFLOW_TRACKING_URI", "DL2_ROOT", "DL2_TESTBED_DATA", "PYTHONPATH")
RUNNING = re.compile(r"Running stage '([^']+)'")


def record_stage_usage(stage: str) -> None:
    """Append stage `stage`'s CPU seconds (this process and the children it waited for, since it started) to the
    file `$DL2_STAGE_USAGE` names; nothing when it is unset."""
    path = os.environ.get(USAGE_LOG)
    if not path:
        return
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    row = {"stage": stage, "user_seconds": own.ru_utime + children.ru_utime, "system_seconds": own.ru_stime + children.ru_stime}
    with open(path, "a") as log:
        log.write(json.dumps(row) + "\n")


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise Dl2Error(f"dl2 bench --pipeline: git {' '.join(args)} in {cwd}: {done.stderr.strip()}")
    return done.stdout.strip()


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")  # `uv run` tells its children where it is
    if not uv:
        raise Dl2Error("dl2 bench --pipeline: uv is not on PATH (the main command is `uv run --locked dvc repro`)")
    return uv


def _seconds(user: float, system: float, wall: float | None = None) -> dict:
    row = {"cpu_seconds": round(user + system, 2), "user_seconds": round(user, 2), "system_seconds": round(system, 2)}
    return row if wall is None else {"wall_seconds": round(wall, 2), **row}


def run_main_command(clone: Path, log: Path, usage_log: Path) -> tuple[float, resource.struct_rusage, list[tuple[str, float]]]:
    """Run `COMMAND` in `clone` with its output in `log` and the stages' CPU records in `usage_log`: its wall
    seconds, its process tree's resource usage, and when (seconds from the start) dvc announced each stage."""
    env = {k: v for k, v in os.environ.items() if k not in CALLER_ONLY}
    env.update({USAGE_LOG: str(usage_log), "PYTHONUNBUFFERED": "1"})
    announced = []
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([_uv(), *COMMAND[1:]], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        for line in proc.stdout:
            out.write(line)
            if match := RUNNING.search(line):
                announced.append((match.group(1), time.perf_counter() - start))
                print(f"{announced[-1][1]:7.1f} s  {match.group(1)}", flush=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
        raise Dl2Error(f"dl2 bench --pipeline: `{' '.join(COMMAND)}` failed (exit {proc.returncode}); clone and log kept in "
                       f"{clone.parent}:\n{tail}")
    return wall, usage, announced


def stage_rows(announced: list[tuple[str, float]], wall: float, usage_log: Path) -> list[dict]:
    """Each stage's wall seconds (from its announcement to the next, the last to the end `wall`) and the CPU
    seconds its `dl2 stage` recorded in `usage_log`."""
    cpu = {row["stage"]: row for row in map(json.loads, usage_log.read_text().splitlines())}
    rows = []
    for (name, began), ended in zip(announced, [t for _, t in announced[1:]] + [wall]):
        if name not in cpu:
            raise Dl2Error(f"dl2 bench --pipeline: stage {name} left no CPU record in {usage_log}")
        rows.append({"stage": name, **_seconds(cpu[name]["user_seconds"], cpu[name]["system_seconds"], ended - began)})
    return rows


def pipeline_benchmark(out: str | Path | None = None) -> dict:
    """Time `uv run --locked dvc repro` in a fresh clone of this checkout's commit; written as JSON to `out`."""
    root = repo_root()
    commit = _git("rev-parse", "HEAD", cwd=root)
    uncommitted = bool(_git("status", "--porcelain", "--untracked-files=no", cwd=root))
    work = Path(tempfile.mkdtemp(prefix="dl2-bench-pipeline-"))
    clone, log, usage_log = work / "clone", work / "repro.log", work / "stages.jsonl"
    _git("clone", "--quiet", str(root), str(clone), cwd=root)
    _git("checkout", "--quiet", commit, cwd=clone)
    results = stamp(python_writes_bytecode=not sys.flags.dont_write_bytecode)
    wall, usage, announced = run_main_command(clone, log, usage_log)
    stages = stage_rows(announced, wall, usage_log)
    shutil.rmtree(work)
    in_stages = {k: sum(s[k] for s in stages) for k in ("wall_seconds", "user_seconds", "system_seconds")}
    results.update({
        "command": " ".join(COMMAND), "commit": commit,
        "uncommitted_changes_left_out": uncommitted,  # the clone holds the commit, not this checkout's edits
        "total": _seconds(usage.ru_utime, usage.ru_stime, wall),
        # wall: before the first stage (uv creating the environment, dvc starting); CPU: uv and dvc throughout
        "outside_stages": _seconds(usage.ru_utime - in_stages["user_seconds"], usage.ru_stime - in_stages["system_seconds"],
                                   wall - in_stages["wall_seconds"]),
        "stages": stages,
    })
    return finish(results, out)
