"""Real training on the kind testbed: DL2Jobs whose PS and worker pods train (`dl2.k8s.training`), scheduled
slot by slot; progress is the steps the pods checkpointed.

Each test prints what it measured (JCTs, steps, losses): run with `-s` to read them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightkube.resources.core_v1 import Pod
from mlflow.tracking import MlflowClient

from dl2.k8s import kind
from dl2.k8s.backend import KubeCluster
from dl2.k8s.jobs import submit_trace
from dl2.k8s.loop import run
from dl2.k8s.resources import GENERATION_LABEL, JOB_LABEL, ROLE_LABEL, DL2Job
from dl2.k8s.training.models import STANDINS
from dl2.k8s.workloads import Trained
from dl2.learn.nets import net_config
from dl2.learn.pretrain import PretrainConfig, pretrain
from dl2.paths import PACKAGE_DIR
from dl2.sim.scenario import Scenario, SimOptions
from dl2.workload.presets import load_presets
from dl2.workload.traces import generate_trace, read_trace

from .conftest import pod_log, wait_for

EXAMPLE = PACKAGE_DIR.parents[1] / "deploy" / "kind-example"  # the README's trace and preset: 3 jobs, 3 workers
PRESET = load_presets(EXAMPLE / "params.yaml")["kind"]
SLOT_SECONDS = 20  # a configuration's pods start (import torch, rendezvous) in 5-20 s on 2 cores, then train


def scenario(assign_bundle: bool = False) -> Scenario:
    return Scenario(PRESET, SimOptions(assign_bundle=assign_bundle))


def dl2_model(path: Path) -> Path:
    """A DL2 policy pretrained in the simulator on DRF's decisions for PRESET (seconds on a CPU)."""
    sc = scenario(assign_bundle=True)
    traces = [generate_trace(sc.preset, sc.catalog, np.random.SeedSequence(s)) for s in range(8)]
    config = PretrainConfig(teacher="drf", epochs=10, batch_size=64, lr=0.005, seed=0, eval_every=10, label_smoothing=0.0)
    before = torch.get_num_threads()
    policy, _ = pretrain(traces[:6], traces[6:], sc, net_config("paper", hidden=(64, 64), window=10), config)
    torch.set_num_threads(before)
    policy.save(path)
    return path


def scheduler(cluster, ns: str, policy: str, params: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dl2.cli", "k8s-scheduler", "run", "--kind", f"--kind-folder={cluster.folder}",
           f"--namespace={ns}", f"--policy={policy}", f"--preset={PRESET.name}", f"--params={params}", "--trained",
           f"--slot-seconds={SLOT_SECONDS}", "--until-done", "--lease-seconds=6", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = 420) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return json.loads(out)


@pytest.mark.parametrize("policy", ["drf", "dl2"])
def test_a_trace_trains_to_completion_with_jcts_in_status_and_mlflow(cluster, kube, namespace, tmp_path, mlflow_store, policy):
    trace, params = EXAMPLE / "trace.csv", EXAMPLE / "params.yaml"
    submit_trace(kube, read_trace(trace, scenario().catalog), scenario().catalog, namespace)
    extra = ("--assign-bundle",) if policy == "dl2" else ()
    name = str(dl2_model(tmp_path / "dl2.pt")) if policy == "dl2" else policy
    first = scheduler(cluster, namespace, name, params, *extra)
    restarted_at = None
    if policy == "drf":  # the scheduler killed mid-trace, then started again: no job lost, every job completes
        line = wait_for("the scheduler's slot 1", lambda: (first.stderr.readline() or "").startswith("slot 1:") or None,
                        timeout=240, every=0.05)
        assert line
        first.send_signal(signal.SIGKILL)
        first.wait()
        restarted_at = int(kube.get(DL2Job, "job-00001", namespace)["status"]["progressSlot"]) + 1
        first = scheduler(cluster, namespace, name, params, *extra)
    result = finish(first)

    jobs = {j["metadata"]["name"]: j for j in kube.list(DL2Job, namespace)}
    assert {j["status"]["phase"] for j in jobs.values()} == {"Succeeded"}
    rows = read_trace(trace, scenario().catalog)
    for job_id, model, epochs in zip(rows.job_id, rows.model, rows.num_epochs):
        status = jobs[f"job-{job_id:05d}"]["status"]
        steps_per_epoch = STANDINS[rows.model_names[model]].steps_per_epoch
        assert status["training"]["steps"] >= epochs * steps_per_epoch, status  # progress is what the pods trained
        assert status["progress"] == epochs
        assert status["training"]["loss"] < status["training"]["firstLoss"], status
    jct = {name: float(j["status"]["jct"]) for name, j in jobs.items()}
    assert result["jct"] == jct
    metrics = MlflowClient(mlflow_store).get_run(result["mlflow_run"]).data.metrics
    assert {k.removeprefix("jct."): v for k, v in metrics.items() if k.startswith("jct.")} == jct
    assert metrics["avg_jct"] == pytest.approx(np.mean(list(jct.values())))
    assert kube.list(Pod, namespace, labels={JOB_LABEL: None}) == [], "completed jobs keep no pods"
    print(f"\n{policy}: JCTs (slots of {SLOT_SECONDS} s) {jct}, average {np.mean(list(jct.values())):.3f}; "
          f"steps {({n: j['status']['training']['steps'] for n, j in jobs.items()})}"
          + (f"; scheduler killed and restarted at slot {restarted_at}" if restarted_at is not None else ""))


class Script:
    """Job 0 gets (PS, workers) = PLAN[slot] (the last entry after the plan ends), on the least-loaded nodes."""

    name = "script"
    PLAN = [(1, 1), (1, 1), (2, 2), (2, 2), (2, 2), (1, 2)]  # resizes at slots 2 and 5

    def __init__(self):
        self.slot = 0

    def schedule(self, obs):
        alloc = obs.allocation()
        num_ps, num_workers = self.PLAN[min(self.slot, len(self.PLAN) - 1)]
        for _ in range(num_ps):
            assert alloc.add_ps(0)
        for _ in range(num_workers):
            assert alloc.add_worker(0)
        self.slot += 1
        return alloc


KILL_BEFORE = 3  # PS 0 is killed after slot 2, while the (2, 2) configuration started at slot 2 trains


def training_processes(job_state: str, role: str, index: int) -> list[int]:
    """Host pids of a job's training process (kind nodes are containers: their processes are this host's)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        text = [c.decode(errors="replace") for c in cmd]
        if "dl2.k8s.training" in text and job_state in text and text[text.index("--role") + 1] == role \
                and text[text.index("--index") + 1] == str(index):
            found.append(int(entry.name))
    return found


def start_step(kube, namespace: str, generation: int) -> int | None:
    """The step generation `generation` of job-00001 started at, from its PS 0's log (None before it says)."""
    found = re.search(r"start at step (\d+)", pod_log(kube, namespace, f"job-00001-g{generation}-ps-0"))
    return int(found.group(1)) if found else None


def test_a_resize_keeps_steps_and_loss_and_a_killed_pod_resumes_from_its_checkpoint(cluster, kube, namespace, tmp_path):
    sc = scenario()
    (tmp_path / "long.csv").write_text("job_id,arrival_slot,model,num_epochs\n1,0,resnet-50,1000\n")
    rows = read_trace(tmp_path / "long.csv", sc.catalog)
    submit_trace(kube, rows, sc.catalog, namespace)
    workload = Trained(namespace, sc.catalog.names, kind.pod_runtime(cluster.folder), SLOT_SECONDS, fine_grained=True)
    backend = KubeCluster(kube, sc, namespace, "dl2", workload=workload)
    script, seen, started = Script(), [], {}  # per slot: (generation, PS, workers, steps, loss); generation: its first step
    job = kube.get(DL2Job, "job-00001", namespace)
    state, in_pod = workload.state_folder(job), workload.state_folder(job, in_pod=True)
    killed = None
    for slot in range(len(Script.PLAN)):
        if slot == KILL_BEFORE:  # SIGKILL PS 0 of the running configuration in the middle of the slot: no checkpoint on the way out
            pods = kube.list(Pod, namespace, labels={JOB_LABEL: "job-00001", ROLE_LABEL: "ps"})
            generation = int(pods[0]["metadata"]["labels"][GENERATION_LABEL])
            pids = wait_for("PS 0's process", lambda: training_processes(str(in_pod), "ps", 0))
            killed = (generation, json.loads((state / "progress.json").read_text())["steps"])
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        run(backend, script, max_slots=1, until_done=False)
        training = kube.get(DL2Job, "job-00001", namespace)["status"].get("training", {})
        seen.append((training.get("generation"), training.get("numPS"), training.get("numWorkers"), training.get("steps", 0),
                     training.get("loss")))
        if seen[-1][0] is not None and seen[-1][0] not in started:  # its pods live until the next slot at least
            started[seen[-1][0]] = start_step(kube, namespace, seen[-1][0])
    print(f"\nper slot (generation, PS, workers, acknowledged steps, loss): {seen}; generations started at steps {started}")
    steps = [s[3] for s in seen]
    assert steps == sorted(steps) and steps[-1] > steps[1], "acknowledged steps never go back, and the job trains"
    assert {(s[1], s[2]) for s in seen if s[0] is not None} >= {(1, 1), (2, 2), (1, 2)}, "every configuration trained"
    first_loss = kube.get(DL2Job, "job-00001", namespace)["status"]["training"]["firstLoss"]
    for before, after in zip(seen, seen[1:]):
        if before[0] is None or after[0] is None or after[0] == before[0]:
            continue
        assert started[after[0]] >= before[3], f"generation {after[0]} resumed at {started[after[0]]}, before step {before[3]}"
        # the loss goes on from where it was, not from a fresh model's (first_loss)
        assert abs(after[4] - before[4]) < 0.5 * abs(first_loss - before[4]), (before, after, first_loss)
    generation, steps_at_kill = killed
    resumed = [s for s in seen[KILL_BEFORE:] if s[0] is not None and s[0] > generation]
    assert resumed and resumed[0][0] < 5, "a new configuration replaced the one whose PS was killed (before the plan's resize)"
    assert started[resumed[0][0]] >= steps_at_kill, "the job resumed from its checkpoint"
    assert resumed[-1][3] > steps_at_kill
    print(f"PS 0 of generation {generation} SIGKILLed at {steps_at_kill} acknowledged steps; generation {resumed[0][0]} "
          f"started at step {started[resumed[0][0]]}")

