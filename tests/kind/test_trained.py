"""Real training on the kind testbed: DL2Jobs whose PS and worker pods train (`dl2.testbed.training`), scheduled
slot by slot; progress is the steps the pods checkpointed. The trace's JCTs are set beside the simulator's
on the testbed's profiled speed table (`testbed` preset).

Each test prints what it measured (JCTs, steps, losses): run with `-s` to read them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from lightkube.resources.core_v1 import Pod
from mlflow.tracking import MlflowClient

from dl2.backends import load_scheduler
from dl2.backends.kube import KubeCluster
from dl2.backends.loop import run
from dl2.backends.sim import simulate
from dl2.backends.workloads import Trained
from dl2.kube.jobs import job_name, submit_trace
from dl2.kube.resources import JOB_LABEL, DL2Job
from dl2.learn.architecture import net_config
from dl2.learn.pretrain import pretrain
from dl2.learn.settings import PretrainConfig
from dl2.paths import PACKAGE_DIR
from dl2.sim.scenario import Scenario, SimOptions
from dl2.sim_to_real.profile import training_processes
from dl2.testbed import kind
from dl2.testbed.training.models import STANDINS
from dl2.testbed.training.plan import read_plan
from dl2.workload.presets import load_presets
from dl2.workload.traces import generate_trace, read_trace

from .conftest import wait_for

EXAMPLE = PACKAGE_DIR.parents[1] / "deploy" / "kind-example"  # the README's trace: 3 jobs on the testbed's 3 workers
PRESET = load_presets()["testbed"]
SLOT_SECONDS = PRESET.slot_seconds  # a configuration's pods start (import torch, rendezvous) in 5-20 s on 2 cores, then train


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


def scheduler(cluster, ns: str, policy: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dl2.cli", "k8s-scheduler", "run", "--kind", f"--kind-folder={cluster.folder}",
           f"--namespace={ns}", f"--policy={policy}", f"--preset={PRESET.name}", "--trained",
           f"--slot-seconds={SLOT_SECONDS}", "--until-done", "--lease-seconds=6", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = 420) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return json.loads(out)


@pytest.mark.parametrize("policy", ["drf", "dl2"])
def test_a_trace_trains_to_completion_with_jcts_in_status_and_mlflow(cluster, kube, namespace, tmp_path, mlflow_store, policy):
    trace = EXAMPLE / "trace.csv"
    submit_trace(kube, read_trace(trace, scenario().catalog), scenario().catalog, namespace)
    extra = ("--assign-bundle",) if policy == "dl2" else ()
    name = str(dl2_model(tmp_path / "dl2.pt")) if policy == "dl2" else policy
    first = scheduler(cluster, namespace, name, *extra)
    restarted_at = None
    if policy == "drf":  # the scheduler killed mid-trace, then started again: no job lost, every job completes
        line = wait_for("the scheduler's slot 1", lambda: (first.stderr.readline() or "").startswith("slot 1:") or None,
                        timeout=240, every=0.05)
        assert line
        first.send_signal(signal.SIGKILL)
        first.wait()
        restarted_at = int(kube.get(DL2Job, "job-00001", namespace)["status"]["progressSlot"]) + 1
        first = scheduler(cluster, namespace, name, *extra)
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
        assert status["progressSeconds"] >= SLOT_SECONDS - 0.5, "a slot lasts at least its seconds since the last reading"
    jct = {name: float(j["status"]["jct"]) for name, j in jobs.items()}
    assert result["jct"] == jct
    metrics = MlflowClient(mlflow_store).get_run(result["mlflow_run"]).data.metrics
    assert {k.removeprefix("jct."): v for k, v in metrics.items() if k.startswith("jct.")} == jct
    assert metrics["avg_jct"] == pytest.approx(np.mean(list(jct.values())))
    assert kube.list(Pod, namespace, labels={JOB_LABEL: None}) == [], "completed jobs keep no pods"

    # the same trace and policy in the simulator, on the testbed's profiled table (the authors' table gives others)
    sc = scenario(assign_bundle=policy == "dl2")
    sim = simulate(rows, load_scheduler(name), sc).jct
    authors = simulate(rows, load_scheduler(name), replace(sc, preset=replace(PRESET, speed_table="public_release"))).jct
    assert np.isfinite(sim).all() and not np.allclose(sim, authors), "the simulator predicts on the profiled table"
    side_by_side = {job_name(int(i)): (round(jct[job_name(int(i))], 3), round(float(s), 3)) for i, s in zip(rows.job_id, sim)}
    print(f"\n{policy}: JCT on kind and in the simulator on the profiled table (slots of {SLOT_SECONDS:g} s) {side_by_side}; "
          f"averages {np.mean(list(jct.values())):.3f} and {np.mean(sim):.3f}; "
          f"steps {({n: j['status']['training']['steps'] for n, j in jobs.items()})}"
          + (f"; scheduler killed and restarted at slot {restarted_at}" if restarted_at is not None else ""))


class Script:
    """Job 0 gets (PS, workers) = `configuration` every slot, on the least-loaded nodes."""

    name = "script"

    def __init__(self, configuration: tuple[int, int]):
        self.configuration = configuration

    def schedule(self, obs):
        alloc = obs.allocation()
        num_ps, num_workers = self.configuration
        for _ in range(num_ps):
            assert alloc.add_ps(0)
        for _ in range(num_workers):
            assert alloc.add_worker(0)
        return alloc


# each configuration is held until one of its generations has trained (a new configuration's four processes may
# take more than a slot to start on 2 cores); PS 0 of the first (2, 2) that trains is SIGKILLed, without a
# checkpoint on its way out, and (2, 2) is held until a later generation has trained from the checkpoint
PLAN = [(1, 1), (2, 2), (2, 2), (1, 2)]
KILLED_PHASE = 1
MAX_SLOTS = 30


def test_a_resize_keeps_steps_and_loss_and_a_killed_pod_resumes_from_its_checkpoint(cluster, kube, namespace, tmp_path):
    sc = scenario()
    (tmp_path / "long.csv").write_text("job_id,arrival_slot,model,num_epochs\n1,0,resnet-50,1000\n")
    rows = read_trace(tmp_path / "long.csv", sc.catalog)
    submit_trace(kube, rows, sc.catalog, namespace)
    workload = Trained(namespace, sc.catalog.names, kind.pod_runtime(cluster.folder), SLOT_SECONDS, fine_grained=True)
    backend = KubeCluster(kube, sc, namespace, "dl2", workload=workload)
    job = kube.get(DL2Job, "job-00001", namespace)
    state, in_pod = workload.state_folder(job), workload.state_folder(job, in_pod=True)
    seen, started = [], {}  # per slot: (generation, PS, workers, steps, loss); generation: the step it started from
    phase, phase_start, killed = 0, 0, None
    for _ in range(MAX_SLOTS):
        slot = backend.slot
        run(backend, Script(PLAN[phase]), max_slots=1, until_done=False)
        training = kube.get(DL2Job, "job-00001", namespace)["status"].get("training", {})
        seen.append((training.get("generation"), training.get("numPS"), training.get("numWorkers"), training.get("steps", 0),
                     training.get("loss")))
        generation = training.get("generation")
        if generation is not None:
            started[generation] = training["startStep"]  # the step the configuration started from, as its PS 0 recorded it
        trained = (generation is not None and generation >= phase_start and (training["numPS"], training["numWorkers"]) == PLAN[phase]
                   and training["steps"] > training["startStep"] and (killed is None or generation > killed[0]))
        if not trained:
            continue
        if phase == KILLED_PHASE:  # SIGKILL PS 0 of this configuration while it trains
            pids = wait_for("PS 0's process", lambda: training_processes(str(in_pod), "ps", 0, read_plan(state)))
            killed = (generation, json.loads((state / "progress.json").read_text())["steps"])
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        phase, phase_start = phase + 1, slot + 1
        if phase == len(PLAN):
            break
    print(f"\nper slot (generation, PS, workers, acknowledged steps, loss): {seen}; generations started at steps {started}")
    assert phase == len(PLAN), f"every configuration trained within {MAX_SLOTS} slots"
    steps = [s[3] for s in seen]
    assert steps == sorted(steps) and steps[-1] > steps[0], "acknowledged steps never go back, and the job trains"
    first_loss = kube.get(DL2Job, "job-00001", namespace)["status"]["training"]["firstLoss"]
    for before, after in zip(seen, seen[1:]):
        if before[0] is None or after[0] is None or after[0] == before[0]:
            continue
        assert started[after[0]] >= before[3], f"generation {after[0]} resumed at {started[after[0]]}, before step {before[3]}"
        # the loss goes on from where it was, not from a fresh model's (first_loss)
        assert abs(after[4] - before[4]) < 0.5 * abs(first_loss - before[4]), (before, after, first_loss)
    generation, steps_at_kill = killed
    resumed = sorted(g for g in started if g > generation)
    assert resumed and started[resumed[0]] >= steps_at_kill, "the next configuration resumed from the checkpoint"
    assert seen[-1][3] > steps_at_kill
    print(f"PS 0 of generation {generation} SIGKILLed at {steps_at_kill} acknowledged steps; generation {resumed[0]} "
          f"started at step {started[resumed[0]]}")
