"""What every `dl2 bench` JSON records beside its numbers: the date, the commit, the machine and its load."""

from __future__ import annotations

import json
from datetime import datetime

from dl2.bench_record import finish, stamp
from dl2.checkout import git_commit


def test_stamp_names_this_checkouts_commit_and_the_machine():
    opened = stamp(cpus=2)
    assert opened["commit"] == git_commit() != "unknown"
    assert datetime.fromisoformat(opened["date"]).tzinfo is not None
    machine = opened["machine"]
    assert {"cores", "processor", "python", "load_average_1min_before"} <= set(machine) and machine["cpus"] == 2
    assert "load_average_1min_after" not in machine


def test_finish_adds_the_load_after_and_writes_the_json(tmp_path):
    results = {**stamp(), "value": 1.5}
    out = tmp_path / "bench" / "x.json"
    assert finish(results, out) is results
    written = json.loads(out.read_text())
    assert written == results and isinstance(written["machine"]["load_average_1min_after"], float)
    assert [p.name for p in out.parent.iterdir()] == ["x.json"]  # no temporary file left beside it


def test_finish_without_a_path_writes_nothing(tmp_path):
    results = finish({**stamp(), "value": 1}, None)
    assert "load_average_1min_after" in results["machine"] and list(tmp_path.iterdir()) == []
