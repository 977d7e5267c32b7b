"""`dl2 bench --score`: how long `dl2 score` takes, as a user runs it: the whole command in a fresh process
(Python's start, imports, numba loading its compiled code from the on-disk cache, the runs, the files), for a
built-in heuristic that plays both simulated worlds (Optimus: the PS/worker parts and the Pollux grid, run
rather than read from the published results) and for the documented example class (`EXAMPLE`, PS/worker
only, slot by slot through the scheduler protocol). The seconds each part took come from the score.json the
command wrote. Wall seconds grow with the machine's load: its 1-minute load average before each run is
recorded beside them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dl2.bench_record import finish, stamp
from dl2.errors import Dl2Error

EXAMPLE = '''import numpy as np


class ShortestFirst:
    name = "shortest-first"

    def schedule(self, obs):
        alloc = obs.allocation()
        for j in np.argsort(obs.num_epochs - obs.progress, kind="stable"):
            while alloc.add_bundle(j):
                pass
        return alloc
'''
SCHEDULERS = {"optimus": "optimus", "example": "bench_example:ShortestFirst"}


def timed_score(spec: str, folder: Path) -> dict:
    """One `dl2 score spec` in a fresh process: its wall seconds, the machine's load before it, each part's seconds."""
    out = folder / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dl2.cli", "score", spec, "--out", str(out), "--quiet"], env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise Dl2Error(f"dl2 score {spec} failed: {done.stderr.strip()[-2000:]}")
    parts = json.loads((out / "score.json").read_text())["parts"]
    return {"wall_seconds": wall, "load_before": load,
            "part_seconds": {part: entry["seconds"] for part, entry in parts.items() if entry["status"] == "scored"}}


def score_benchmark(out: str | Path | None = None) -> dict:
    """`dl2 score` timed for each of `SCHEDULERS`; written as JSON to `out`."""
    results: dict = {**stamp(), "schedulers": {}}
    with tempfile.TemporaryDirectory(prefix="dl2-bench-score-") as tmp:
        folder = Path(tmp)
        (folder / "bench_example.py").write_text(EXAMPLE)
        for label, spec in SCHEDULERS.items():
            row = timed_score(spec, folder)
            row["ps_worker_seconds"] = sum(s for p, s in row["part_seconds"].items() if p.startswith("ps-worker/"))
            row["pollux_seconds"] = sum(s for p, s in row["part_seconds"].items() if p.startswith("pollux/"))
            results["schedulers"][label] = {"scheduler": spec, **row}
    return finish(results, out)
