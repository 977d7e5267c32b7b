"""What an operator of the testbeds reads (issue 34, item 7): the slot line while pods start, the scheduler's
final answer, the MLflow store's logging, the kind daemon's socket and the build's progress lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dl2.backends.loop import run, slot_line
from dl2.backends.sim import SimulatedCluster
from dl2.backends.workloads import Emulated, Trained
from dl2.kube.resources import GENERATION_LABEL, JOB_LABEL, PodRuntime
from dl2.schedulers import get_scheduler
from dl2.sim.scenario import Scenario
from dl2.testbed.build import Binaries
from dl2.testbed.kind import cluster as kind
from dl2.testbed.kind import images
from dl2.testbed.steps import timed_step
from dl2.testbed.training.progress import write_progress
from dl2.workload.presets import get_preset
from dl2.workload.traces import generate_trace

CENSUS = {"waiting": 1, "running": 2, "done": 0, "tasks": 5}


def test_the_slot_line_says_how_many_starting_pods_are_ready():
    plain = slot_line(4, 0.0, CENSUS, 20.04)
    assert plain == "slot 4: 1 waiting, 2 running, 0 done; 5 tasks placed; reward 0.000; 20.0 s"
    assert slot_line(4, 0.0, {**CENSUS, "starting": 0, "starting_ready": 0}, 20.04) == plain
    starting = slot_line(4, 0.0, {**CENSUS, "starting": 5, "starting_ready": 3}, 20.04)
    assert starting == "slot 4: 1 waiting, 2 running, 0 done; 5 tasks placed; pods starting: 3 of 5 ready; reward 0.000; 20.0 s"


def test_the_simulators_slot_lines_have_no_starting_pods():
    scenario = Scenario(replace(get_preset("paper"), num_jobs=6))
    trace = generate_trace(scenario.preset, scenario.catalog, seed=1)
    lines: list[str] = []
    run(SimulatedCluster(trace, scenario), get_scheduler("drf"), progress=lines.append)
    assert lines and all(line.startswith(f"slot {k}: ") for k, line in enumerate(lines))
    assert not any("starting" in line for line in lines)


def _job(name: str) -> dict:
    return {"metadata": {"name": name, "uid": f"{name}-0123456789"}}


def _pod(job: str, generation: int, ready: bool) -> dict:
    return {"metadata": {"name": f"{job}-g{generation}", "labels": {JOB_LABEL: job, GENERATION_LABEL: str(generation)}},
            "spec": {"nodeName": "w1"}, "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_trained_pods_start_until_their_configuration_acknowledges_a_step(tmp_path):
    runtime = PodRuntime("image", "python", [], [], "/dl2/shared", tmp_path)
    trained = Trained("ns", ("resnet-50",), runtime, slot_seconds=20.0, fine_grained=True)
    jobs = [_job("a"), _job("b")]
    pods = [_pod("a", 3, True), _pod("a", 3, False), _pod("b", 1, True), _pod("c", 1, True)]  # c: not a running job
    assert trained.starting(jobs, pods) == pods[:3], "no job has checkpointed yet"

    folder: Path = trained.state_folder(jobs[1])
    folder.mkdir(parents=True)
    write_progress(folder, {"generation": 1, "steps": 12})
    assert trained.starting(jobs, pods) == pods[:2], "b's configuration 1 has acknowledged a step"
    write_progress(folder, {"generation": 0, "steps": 12})
    assert trained.starting(jobs, pods) == pods[:3], "b's last record is an older configuration's"
    assert Emulated("ns", None, True).starting(jobs, pods) == []


STORE_SCRIPT = """
import logging
from dl2 import tracking
jobs = [{"metadata": {"name": "job-00001"}, "status": {"phase": "Succeeded", "jct": 2.5}}]
print(tracking.log_scheduler_run("ns", {"policy": "drf"}, jobs, cluster_slots=15, slots_run=5))
logging.getLogger("mlflow.store.db.utils").warning("a warning of the store")
"""


def test_a_new_mlflow_store_keeps_its_info_lines_out_of_stderr_but_not_its_warnings(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    done = subprocess.run([sys.executable, "-c", STORE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "INFO" not in done.stderr and "database tables" not in done.stderr, done.stderr
    assert "a warning of the store" in done.stderr
    run = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_run(done.stdout.split()[-1])
    assert run.data.metrics == {"cluster_slots": 15.0, "slots_run": 5.0, "jct.job-00001": 2.5, "avg_jct": 2.5}


def test_kind_json_gives_the_private_daemons_socket_and_the_docker_ps_that_uses_it(tmp_path):
    socket = "/run/dl2-kind-0123/docker.sock"
    state = {"folder": str(tmp_path), "name": "dl2", "ready": True, "daemon_pid": 4321, "daemon_socket": socket,
             "kubeconfig": str(tmp_path / "kubeconfig"), "server": "https://172.18.0.2:6443", "control_plane": "dl2-control-plane",
             "workers": ["dl2-worker"], "node_image": "n", "runtime_image": "r", "images_source": "built", "mounts": [], "timings": {}}
    (tmp_path / kind.STATE_FILE).write_text(json.dumps(state))
    access = {"socket": socket, "docker_host": f"unix://{socket}", "docker_ps": f"DOCKER_HOST=unix://{socket} docker ps"}
    assert kind.load(tmp_path).docker == access
    shown = kind.status(tmp_path)  # no daemon runs here: the record still says where it listened
    assert (shown["daemon"], shown["daemon_pid"], shown["docker"]) == (False, 4321, access)


def test_a_long_step_logs_its_start_a_heartbeat_and_its_elapsed_time():
    lines: list[str] = []
    with timed_step(lines.append, "[build] node rootfs: debootstrap", "log: build.log", heartbeat_s=0.05) as took:
        time.sleep(0.3)
    assert lines[0] == "[build] node rootfs: debootstrap (started; log: build.log)"
    beats = lines[1:-1]
    assert 2 <= len(beats) <= 6 and all(re.fullmatch(r"\[build\] node rootfs: debootstrap: still running after 0\.\d s", b) for b in beats)
    assert 0.3 <= took.seconds < 5 and lines[-1] == f"[build] node rootfs: debootstrap: done in {took.seconds:.1f} s"
    quiet: list[str] = []
    with pytest.raises(ValueError), timed_step(quiet.append, "[up] kind create cluster", heartbeat_s=0):
        time.sleep(0.1)
        raise ValueError("kind failed")
    assert quiet[0] == "[up] kind create cluster (started)" and re.fullmatch(r"\[up\] kind create cluster: failed after 0\.\d s", quiet[1])
    assert len(quiet) == 2


def test_each_image_build_step_logs_when_it_starts_and_how_long_it_took(tmp_path):
    lines: list[str] = []
    builder = images._Builder(tmp_path, Binaries(tmp_path / "bin", 0.0), "http://deb.example/debian", lines.append)
    builder.step("node-rootfs", "debootstrap the node rootfs", lambda: time.sleep(0.2), 2, 7)
    builder.step("node-rootfs", "debootstrap the node rootfs", lambda: pytest.fail("a step done is not done again"), 2, 7)
    assert lines == [f"[images 2/7] debootstrap the node rootfs (started; log: {tmp_path / 'build.log'})",
                     f"[images 2/7] debootstrap the node rootfs: done in {builder.steps['node-rootfs']:.1f} s"]
    assert json.loads((tmp_path / "steps.json").read_text()) == builder.steps and builder.steps["node-rootfs"] >= 0.2
