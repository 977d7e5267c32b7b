"""`dl2 score --kind`: the suite's kind trace replayed on the kind testbed through the evaluate stage's testbed
path, beside the simulator on the profiled table, as one more row of the score.

Run with `-s` to read the score's table."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd

from dl2.backends.sim import simulate
from dl2.score import suite
from dl2.score.kind import kind_scenario
from dl2.workload.traces import read_trace


def test_a_score_with_kind_replays_the_suites_trace_on_the_testbed(cluster, tmp_path):
    out = tmp_path / "score"
    cmd = [sys.executable, "-m", "dl2.cli", "score", "drf", "--kind", f"--kind-folder={cluster.folder}", f"--out={out}", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    print(f"\n{done.stdout}")
    score = json.loads((out / "score.json").read_text())
    kind = score["parts"][suite.KIND_PART]
    assert kind["status"] == "scored" and kind["runs"] == 1 and kind["rank"] is None, kind
    sc = kind_scenario()
    trace = read_trace(suite.KIND_TRACE, sc.catalog)
    assert kind["avg_jct"] > 0 and np.isfinite(simulate(trace, "drf", sc).jct).all()
    assert all(score["parts"][p.label]["status"] == "scored" for p in suite.PS_WORKER_PARTS)
    row = next(line for line in done.stdout.splitlines() if line.startswith(f"| {suite.KIND_PART} "))
    assert "no built-ins here" in row
    assert not pd.isna(kind["avg_jct"])
