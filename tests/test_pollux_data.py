"""The Pollux artifact's data in `data/reference/pollux/`: every file as its manifest lists it, the
workloads in the artifact's format, and expected results whose means follow from their per-workload values."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from dl2.paths import repo_root

POLLUX = repo_root() / "data" / "reference" / "pollux"
APPLICATIONS = {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}
LOADS = {"0.5": "workloads-0.5", "1.0": "workloads", "1.5": "workloads-1.5", "2.0": "workloads-2.0"}


def test_every_file_is_in_the_manifest_with_its_checksum():
    listed = {}
    for line in (POLLUX / "MANIFEST.sha256").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[Path(name).as_posix().removeprefix("./")] = digest
    present = {p.relative_to(POLLUX).as_posix() for p in POLLUX.rglob("*") if p.is_file()} - {"MANIFEST.sha256", "README.md"}
    assert present == set(listed)
    for name, digest in listed.items():
        assert hashlib.sha256((POLLUX / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("load, folder", LOADS.items())
def test_each_load_has_eight_workloads_in_the_artifacts_format(load, folder):
    files = sorted((POLLUX / folder).glob("workload-*.csv"))
    assert [f.name for f in files] == [f"workload-{k}.csv" for k in range(1, 9)]
    for f in files:
        with open(f, newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert list(rows[0]) == ["name", "time", "application", "num_replicas", "batch_size"]
        assert len(rows) == round(160 * float(load)) and {r["application"] for r in rows} <= APPLICATIONS
        times = [int(r["time"]) for r in rows]
        assert times == sorted(times) and times[0] >= 0


def test_every_application_has_its_throughput_and_gradient_measurements():
    assert {p.name for p in (POLLUX / "traces").iterdir() if p.is_dir()} == APPLICATIONS
    for app in APPLICATIONS:
        folder = POLLUX / "traces" / app
        assert (folder / "placements.csv").read_text().startswith("placement,local_bsz,step_time,sync_time")
        assert (folder / "scalability.csv").read_text().startswith("num_nodes,num_replicas,local_bsz,step_time,sync_time")
        assert len(list(folder.glob("validation-*.csv"))) >= 6


def test_expected_means_follow_from_the_per_workload_values_and_match_the_readme():
    results = json.loads((POLLUX / "expected_results.json").read_text())["results"]
    assert set(results) == {"optimus", "tiresias", "pollux"}
    for loads in results.values():
        assert set(loads) == set(LOADS)
        for cell in loads.values():
            assert list(cell["avgs"]) == [f"workload-{k}" for k in range(1, 9)]
            assert cell["mean"] == pytest.approx(np.mean(list(cell["avgs"].values())), rel=1e-12)
    at_1x = {policy: round(loads["1.0"]["mean"], 1) for policy, loads in results.items()}
    assert at_1x == {"pollux": 2751.1, "optimus": 5681.9, "tiresias": 4038.2}  # as the README quotes them
    assert round(100 * (1 - results["pollux"]["1.0"]["mean"] / results["optimus"]["1.0"]["mean"]), 1) == 51.6
