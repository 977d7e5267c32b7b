"""`dl2 testbed check` on real pods: a validation trace replayed on kind and in the calibrated simulator, the
per-policy table and verdict written, and a second run keeping every finished replay instead of running it again."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import yaml

from dl2.paths import repo_root
from dl2.sim_to_real.check import CHECK_COLUMNS


def test_a_check_replays_on_kind_writes_its_verdict_and_resumes(cluster, tmp_path):
    params = yaml.safe_load((repo_root() / "params.yaml").read_text())
    params["presets"]["testbed"].update(num_jobs=2, max_epochs=4, slot_seconds=12)  # a trace of two short jobs
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.rmtree(cluster.folder / "replays", ignore_errors=True)  # replays an earlier run of this test kept
    out = tmp_path / "check"
    cmd = [sys.executable, "-m", "dl2.cli", "testbed", "check", f"--folder={cluster.folder}", f"--params={tmp_path / 'params.yaml'}",
           "--policies", "fifo", "drf", "--traces", "1", "--repeats", "1", f"--out={out}"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr
    verdict = json.loads(first.stdout)
    assert verdict["policies"] == ["fifo", "drf"] and verdict["traces"] == 1 and verdict["repeats"] == 1
    assert set(json.loads((out / "check.json").read_text())["policies"]) == {"fifo", "drf"}
    assert verdict["elastic"] is True and "surviving pods rejoin" in (out / "check.md").read_text()
    assert isinstance(verdict["passed"], bool) and verdict["restart_seconds"] == params["presets"]["testbed"]["restart_seconds"]
    table = pd.read_csv(out / "check.csv")
    assert list(table.columns) == CHECK_COLUMNS and (table.kind > 0).all() and (table.sim > 0).all()
    jobs = pd.read_csv(out / "jobs.csv")
    assert len(jobs) == 2 * 2 and jobs.jct_testbed.notna().all(), "both jobs finished under both policies"
    assert {"sim_to_real.png", "check.md", "slots.csv", "speed_error.csv"} <= {p.name for p in out.iterdir()}
    assert "kept from an earlier run" not in first.stderr

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("kept from an earlier run") == 2, "both replays kept, none run again"
    pd.testing.assert_frame_equal(pd.read_csv(out / "jobs.csv"), jobs)
    print(f"\ncheck on kind: {table.to_dict(orient='records')}")
