"""The Philly job table and the workload generator of the Pollux world: the artifact's 32 shipped workloads
regenerated field for field, the configurations the artifact computes, the statistics of a workload drawn
with other arguments, and errors naming the file, line and field or the argument."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dl2.errors import Dl2Error
from dl2.paths import repo_root
from dl2.pollux.apps import APP_NAMES, load_applications
from dl2.pollux.philly import PHILLY_CSV, configurations, generate_workload, load_philly
from dl2.pollux.workload import read_workload, write_workload

POLLUX = repo_root() / "data" / "reference" / "pollux"
LOADS = {0.5: "workloads-0.5", 1.0: "workloads", 1.5: "workloads-1.5", 2.0: "workloads-2.0"}
HEADER = "timestamp,duration,num_gpus,gpu_time,cluster"

# Computed once with the artifact's `APPLICATIONS[name].get_configurations(0.5, 0.8)` (and other bounds
# where named) at commit c793c7089bd307462686339d29707925c461f9a9 (numpy 1.23, pandas 1.5, scipy), printed
# with repr.
ARTIFACT_CONFIGURATIONS = {
    "bert": [(6, 384, 3055.742467689515), (8, 384, 2480.2910247802733), (12, 384, 1589.2041198349),
             (16, 384, 1334.8948572921754)],
    "cifar10": [(6, 2048, 854.1746212567923), (8, 2048, 826.0653644154864), (12, 4096, 573.1811690802842),
                (16, 4096, 449.44677816772463)],
    "deepspeech2": [(6, 320, 4153.243330422102), (8, 320, 3500.8491632938385), (12, 640, 2572.667703477074)],
    "imagenet": [(24, 3200, 31395.6258264795), (32, 6400, 26207.431019401552), (48, 6400, 18879.603194638094)],
    "ncf": [(1, 32768, 32.99644393920895)],
    "yolov3": [(4, 64, 12869.86397508073)],
}
CIFAR10_03_09 = [(2, 512, 2220.4643435223898), (4, 1024, 1161.9380512892403), (6, 2048, 854.1746212567923),
                 (8, 2048, 826.0653644154864), (12, 4096, 573.1811690802842), (16, 4096, 449.44677816772463),
                 (24, 4096, 449.60455039132313)]
IMAGENET_09_10 = [(1, 200, 532438.6455255747)]  # none kept: the one-GPU choice


@pytest.fixture(scope="module")
def philly() -> pd.DataFrame:
    return load_philly()


@pytest.fixture(scope="module")
def apps():
    return {a.name: a for a in load_applications()}


def _fields(workload) -> tuple:
    return (workload.name, workload.time.tolist(), workload.app.tolist(), workload.num_replicas.tolist(),
            workload.batch_size.tolist())


def test_the_table_is_the_artifacts_job_log(philly):
    assert PHILLY_CSV == POLLUX / "traces" / "philly.csv"
    assert list(philly.columns) == ["timestamp", "duration", "num_gpus", "gpu_time"]
    assert len(philly) == 82247  # every non-blank row (the file ends with a blank line)
    first = philly.iloc[0]
    assert (str(first.timestamp), first.duration, first.num_gpus, first.gpu_time) == ("2017-10-09 07:01:55", 66.0, 1, 66.0)
    assert philly.num_gpus.dtype == np.int64 and philly.num_gpus.min() >= 1
    assert (philly.duration >= 0).all() and (philly.gpu_time >= 0).all()


@pytest.mark.parametrize("load, folder", LOADS.items())
def test_every_shipped_workload_is_regenerated_field_for_field(load, folder, philly):
    for k in range(1, 9):
        shipped = read_workload(POLLUX / folder / f"workload-{k}.csv")
        generated = generate_workload(round(160 * load), seed=k, philly=philly)
        assert _fields(generated) == _fields(shipped), f"{folder}/workload-{k}.csv"


def test_configurations_match_the_artifact(apps):
    for name, expected in ARTIFACT_CONFIGURATIONS.items():
        assert configurations(apps[name]) == expected, name
    assert configurations(apps["cifar10"], 0.3, 0.9) == CIFAR10_03_09
    assert configurations(apps["imagenet"], 0.9, 1.0) == IMAGENET_09_10


def test_a_workload_of_another_size_and_window_has_the_tables_statistics(philly, apps, tmp_path):
    workload = generate_workload(40, seed=11, start_hour=0, duration_hours=24, philly=philly)
    assert len(workload) == 40
    assert (np.diff(workload.time) >= 0).all() and workload.time.min() >= 0 and workload.time.max() < 24 * 3600
    assert set(workload.app.tolist()) <= set(range(len(APP_NAMES)))
    assert workload.name == tuple(f"{APP_NAMES[a]}-{k}" for k, a in enumerate(workload.app))
    for app, replicas, batch in zip(workload.app, workload.num_replicas, workload.batch_size):
        asked = {(n, b) for n, b, _ in configurations(apps[APP_NAMES[app]])}
        assert (int(replicas), int(batch)) in asked
    write_workload(workload, tmp_path / "w.csv")
    assert _fields(read_workload(tmp_path / "w.csv")) == _fields(workload)
    assert _fields(generate_workload(40, seed=11, start_hour=0, duration_hours=24, philly=philly)) == _fields(workload)
    assert _fields(generate_workload(40, seed=12, start_hour=0, duration_hours=24, philly=philly)) != _fields(workload)


def test_applications_follow_the_gpu_time_of_the_drawn_jobs(philly):
    # Over the whole day, the share of jobs under 1 GPU-hour (cifar10 or ncf) and under 10 (deepspeech2,
    # half of them turned bert) among 3000 drawn is the share in the table, and each half is about half.
    kept = philly[(philly.duration >= 60) & (philly.gpu_time < 1000 * 3600)]
    short = float((kept.gpu_time < 3600).mean())
    medium = float(((kept.gpu_time >= 3600) & (kept.gpu_time < 36000)).mean())
    workload = generate_workload(3000, seed=5, start_hour=0, duration_hours=24, philly=philly)
    count = dict(zip(APP_NAMES, np.bincount(workload.app, minlength=len(APP_NAMES)) / len(workload)))
    assert count["cifar10"] + count["ncf"] == pytest.approx(short, abs=0.03)
    assert count["deepspeech2"] + count["bert"] == pytest.approx(medium, abs=0.03)
    assert count["cifar10"] == pytest.approx(count["ncf"], abs=0.04)
    assert count["bert"] == pytest.approx(count["deepspeech2"], abs=0.03)
    assert count["yolov3"] > count["imagenet"] > 0


def test_the_window_keeps_the_hours_asked_for(philly):
    workload = generate_workload(50, seed=3, start_hour=22, duration_hours=3, philly=philly)
    assert workload.time.max() < 3 * 3600
    # a job at 23:30 lands 1.5 hours into a window opening at 22:00
    table = pd.DataFrame({"timestamp": pd.to_datetime(["2017-10-01 23:30:00"]), "duration": [100.0],
                          "num_gpus": [1], "gpu_time": [100.0]})
    one = generate_workload(1, seed=0, start_hour=22, duration_hours=3, philly=table)
    assert one.time.tolist() == [5400] and APP_NAMES[one.app[0]] in ("cifar10", "ncf")


def _write(tmp_path, name: str, *lines: str):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_table_missing_a_column_names_the_file_and_column(tmp_path):
    path = _write(tmp_path, "cols.csv", "timestamp,duration,num_gpus,cluster", "2017-10-09 07:01:55,66.0,1,ab")
    with pytest.raises(Dl2Error, match=r"cols\.csv:1: missing column 'gpu_time'"):
        load_philly(path)


@pytest.mark.parametrize("field, row, shown", [
    ("timestamp", "2017-13-09 07:01:55,66.0,1,66.0,ab", "2017-13-09 07:01:55"),
    ("timestamp", "yesterday,66.0,1,66.0,ab", "yesterday"),
    ("duration", "2017-10-09 07:01:55,sixty,1,66.0,ab", "sixty"),
    ("gpu_time", "2017-10-09 07:01:55,66.0,1,-5,ab", "-5"),
    ("num_gpus", "2017-10-09 07:01:55,66.0,1.5,66.0,ab", "1.5"),
])
def test_a_bad_field_names_the_file_line_and_field(tmp_path, field, row, shown):
    # line 3 is blank and skipped; the bad row is line 5 of the file
    path = _write(tmp_path, "bad.csv", HEADER, "2017-10-09 07:01:55,66.0,1,66.0,ab", "",
                  "2017-10-09 06:13:03,2951.0,2,5902.0,cd", row)
    with pytest.raises(Dl2Error, match=rf"bad\.csv:5: {field}: expected .*got '{shown}'"):
        load_philly(path)


def test_a_missing_or_empty_table_is_named(tmp_path):
    with pytest.raises(Dl2Error, match=r"nowhere\.csv: Philly job table file not found"):
        load_philly(tmp_path / "nowhere.csv")
    with pytest.raises(Dl2Error, match=r"header\.csv: no jobs"):
        load_philly(_write(tmp_path, "header.csv", HEADER))


def test_a_window_with_too_few_jobs_names_the_argument(tmp_path, philly):
    path = _write(tmp_path, "few.csv", HEADER, "2017-10-09 03:01:55,66.0,1,66.0,ab",
                  "2017-10-09 04:00:00,30.0,1,30.0,ab",  # ran under 60 s: never drawn
                  "2017-10-09 12:00:00,66.0,1,66.0,ab")  # outside 02:00-10:00
    table = load_philly(path)
    assert len(generate_workload(1, seed=1, philly=table)) == 1
    with pytest.raises(Dl2Error, match=r"num_jobs: 2 jobs asked for, but only 1 "):
        generate_workload(2, seed=1, philly=table)
    with pytest.raises(Dl2Error, match=r"num_jobs: 100000 jobs asked for"):
        generate_workload(100000, seed=1, start_hour=0, duration_hours=1, philly=philly)


@pytest.mark.parametrize("kwargs, argument", [
    ({"num_jobs": 0}, "num_jobs"),
    ({"start_hour": -1}, "start_hour"),
    ({"duration_hours": 0}, "duration_hours"),
    ({"duration_hours": 25}, "duration_hours"),
])
def test_bad_arguments_are_named(kwargs, argument, philly):
    arguments = {"num_jobs": 10, "seed": 1, "philly": philly} | kwargs
    with pytest.raises(Dl2Error, match=rf"^{argument}: expected"):
        generate_workload(**arguments)


def test_a_table_frame_missing_a_column_is_named(philly):
    with pytest.raises(Dl2Error, match=r"philly: missing column 'gpu_time'"):
        generate_workload(10, seed=1, philly=philly.drop(columns="gpu_time"))
