"""`dl2 bench --pipeline`'s bookkeeping: the CPU record `dl2 stage` leaves when asked, and each stage's wall and
CPU seconds from dvc's announcements and those records (the benchmark itself runs the whole main command)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dl2.bench_pipeline import USAGE_LOG, record_stage_usage, stage_rows
from dl2.errors import Dl2Error


def test_a_stage_records_its_cpu_seconds_with_its_childrens_only_when_asked(tmp_path, monkeypatch):
    log = tmp_path / "stages.jsonl"
    monkeypatch.delenv(USAGE_LOG, raising=False)
    record_stage_usage("traces")
    assert not log.exists()
    burn = "t = __import__('time').process_time()\nwhile __import__('time').process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)  # a child waited for: its CPU counts
    monkeypatch.setenv(USAGE_LOG, str(log))
    record_stage_usage("traces")
    record_stage_usage("ablate@model")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["traces", "ablate@model"]
    assert rows[0]["user_seconds"] + rows[0]["system_seconds"] >= 0.3


def test_stage_rows_time_each_stage_from_its_announcement_to_the_next(tmp_path):
    log = tmp_path / "stages.jsonl"
    log.write_text("".join(json.dumps({"stage": s, "user_seconds": u, "system_seconds": 1.0}) + "\n"
                           for s, u in (("traces", 10.0), ("baselines", 20.0))))
    rows = stage_rows([("traces", 5.0), ("baselines", 17.5)], 40.0, log)
    assert [(r["stage"], r["wall_seconds"], r["cpu_seconds"]) for r in rows] == [("traces", 12.5, 11.0), ("baselines", 22.5, 21.0)]


def test_a_stage_without_a_record_is_an_error(tmp_path):
    log = tmp_path / "stages.jsonl"
    log.write_text(json.dumps({"stage": "traces", "user_seconds": 1.0, "system_seconds": 0.0}) + "\n")
    with pytest.raises(Dl2Error, match="stage report left no CPU record"):
        stage_rows([("traces", 0.0), ("report", 3.0)], 5.0, log)
