"""A trace submitted as DL2Jobs runs to completion on the real API server, with the simulator's JCTs."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time

import numpy as np
import pytest
import torch
from forging import FORGERIES, Forging
from lightkube.resources.core_v1 import Pod

from dl2.backends.kube import KubeCluster
from dl2.backends.loop import run, slot_line
from dl2.backends.sim import simulate
from dl2.backends.workloads import Trained
from dl2.errors import Dl2Error
from dl2.kube.jobs import submit_trace, trace_manifests
from dl2.kube.resources import JOB_LABEL, SCHEDULER_NAME, DL2Job, PodRuntime
from dl2.learn.agent import DL2Policy, DL2Scheduler
from dl2.learn.architecture import net_config
from dl2.schedulers import get_scheduler
from dl2.sim.scenario import Scenario
from dl2.testbed.build import ensure_binaries
from dl2.testbed.training.progress import write_progress

from .support import PRESET, scenario, space, submitted, trace


def run_on_kubernetes(kube, tr, sc, scheduler, ns=None):
    ns = ns or space(kube)
    submit_trace(kube, tr, sc.catalog, ns)
    backend = KubeCluster(kube, sc, ns, ns)
    run(backend, scheduler)
    jct = backend.jct()
    return np.array([jct[int(i)] for i in tr.job_id]), backend, ns


def dl2_scheduler(seed: int = 0) -> DL2Scheduler:
    torch.manual_seed(3)
    policy = DL2Policy(net_config("paper", window=10), PRESET.max_tasks, assign_bundle=False)
    return DL2Scheduler(policy, greedy=False, seed=seed)


@pytest.mark.parametrize("policy", ["drf", "dl2"])
def test_trace_runs_to_completion_with_the_simulators_jcts(kube, policy):
    sc = scenario(assign_bundle=policy == "dl2")
    tr = trace(1)
    make = (lambda: dl2_scheduler()) if policy == "dl2" else (lambda: get_scheduler(policy))
    simulated = simulate(tr, make(), sc)
    got, backend, ns = run_on_kubernetes(kube, tr, sc, make())
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, simulated.jct, rtol=0.01)
    assert np.max(np.abs(got - simulated.jct) / simulated.jct) < 1e-9  # in fact exact
    assert backend.slot == simulated.num_slots
    assert sum(row[3] > 1 for row in backend.stats) > 0, "the trace should make jobs share the cluster"
    assert kube.list(Pod, ns, labels={JOB_LABEL: None}) == [], "completed jobs keep no pods"
    phases = {j["status"]["phase"] for j in kube.list(DL2Job, ns)}
    assert phases == {"Succeeded"}


def test_the_progress_emulator_pays_the_restart_cost_as_the_simulator_does(kube):
    """With `restart_seconds`, each new configuration trains only the rest of its slot, on the API server as
    in the simulator (the configuration a job trained with is kept in its status, `trainedTasks`)."""
    sc = Scenario(dataclasses.replace(PRESET, restart_seconds=400.0), scenario().options)
    tr = trace(1)
    simulated = simulate(tr, get_scheduler("drf"), sc)
    assert simulated.jct.mean() > simulate(tr, get_scheduler("drf"), scenario()).jct.mean()
    got, backend, ns = run_on_kubernetes(kube, tr, sc, get_scheduler("drf"))
    assert np.max(np.abs(got - simulated.jct) / simulated.jct) < 1e-9
    assert backend.slot == simulated.num_slots
    assert all(j["status"]["trainedTasks"]["ps"] >= 1 for j in kube.list(DL2Job, ns))


def test_pods_are_bound_by_dl2_and_kubectl_shows_allocation_and_progress(kube, testbed):
    sc = scenario()
    tr = trace(2)
    ns = space(kube)
    submit_trace(kube, tr, sc.catalog, ns)
    backend = KubeCluster(kube, sc, ns, ns)
    run(backend, get_scheduler("drf"), max_slots=3)
    pods = kube.list(Pod, ns, labels={JOB_LABEL: None})
    assert pods, "running jobs have pods"
    assert all(p["spec"]["schedulerName"] == SCHEDULER_NAME and p["spec"]["nodeName"].startswith(ns) for p in pods)
    running = [j for j in kube.list(DL2Job, ns) if j["status"].get("phase") == "Running"]
    for job in running:
        mine = [p for p in pods if p["metadata"]["labels"][JOB_LABEL] == job["metadata"]["name"]]
        assert job["status"]["allocation"]["workers"] == sum(p["metadata"]["labels"]["dl2.io/role"] == "worker" for p in mine)
    kubectl = ensure_binaries().path("kubectl")
    deadline = time.monotonic() + 60  # KWOK plays the bound pods as Running, asynchronously
    while not all(p.get("status", {}).get("phase") == "Running" for p in kube.list(Pod, ns, labels={JOB_LABEL: None})):
        assert time.monotonic() < deadline, "KWOK did not run the bound pods"
        time.sleep(0.1)
    shown = subprocess.run([str(kubectl), f"--kubeconfig={testbed.kubeconfig}", "-n", ns, "get", "pods", "--no-headers"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(shown) == len(pods) and all(line.split()[1:3] == ["1/1", "Running"] for line in shown)
    out = subprocess.run([str(kubectl), f"--kubeconfig={testbed.kubeconfig}", "-n", ns, "get", "dl2jobs"],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["NAME", "MODEL", "WORKERS", "PS", "PROGRESS", "PHASE"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    for job in running:
        row = rows[job["metadata"]["name"]]
        assert row[2] == str(job["status"]["allocation"]["workers"]) and row[3] == str(job["status"]["allocation"]["ps"])
        assert row[4] == job["status"]["progressPercent"] and row[5] == "Running"


def test_a_dl2jobs_own_limits_cap_its_tasks(kube):
    sc, tr = scenario(), trace(16)
    ns = space(kube)
    manifests = trace_manifests(tr, sc.catalog, ns)
    for manifest in manifests:
        manifest["spec"]["limits"] = {"maxWorkers": 1, "maxPS": 2}
        kube.create(manifest)
    backend = KubeCluster(kube, sc, ns, ns)
    drf = get_scheduler("drf")
    seen = []
    while not backend.done:
        run(backend, drf, max_slots=1)
        seen += [j["status"]["allocation"] for j in kube.list(DL2Job, ns) if "allocation" in j["status"]]
    assert max(a["workers"] for a in seen) == 1 and max(a["ps"] for a in seen) == 2  # DRF would give up to 4 bundles
    assert {j["status"]["phase"] for j in kube.list(DL2Job, ns)} == {"Succeeded"}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_the_kubernetes_backend_refuses_an_allocation_as_the_simulator_does(kube, forgery):
    forge, _ = FORGERIES[forgery]
    sc, tr = scenario(), trace(5)
    with pytest.raises(Dl2Error) as in_simulator:
        simulate(tr, Forging(forge), sc)
    ns = space(kube)
    submit_trace(kube, tr, sc.catalog, ns)
    backend = KubeCluster(kube, sc, ns, ns)
    with pytest.raises(Dl2Error) as on_kubernetes:
        run(backend, Forging(forge))
    assert str(on_kubernetes.value) == str(in_simulator.value)
    assert backend.committed is None and kube.list(Pod, ns, labels={JOB_LABEL: None}) == [], "nothing of it carried out"


def test_trained_pods_read_as_starting_in_the_slot_line_until_their_configuration_checkpoints(kube, tmp_path):
    """KWOK runs no container, so the pods of a `Trained` workload never checkpoint here: the slot line says they
    are starting, with how many are Ready, until a progress record of their generation appears."""
    sc, _, ns = submitted(kube, 3)
    runtime = PodRuntime("dl2.local/runtime:test", "/usr/bin/python3", [], [], "/dl2/shared", tmp_path)
    workload = Trained(ns, sc.catalog.names, runtime, slot_seconds=0.0, fine_grained=True, grace_seconds=0)
    backend = KubeCluster(kube, sc, ns, ns, workload=workload)
    lines: list[str] = []
    run(backend, get_scheduler("drf"), max_slots=1, until_done=False, progress=lines.append)
    census = backend.census()
    assert census["tasks"] > 0 and census["starting"] == census["tasks"], census
    assert re.search(rf"; pods starting: \d+ of {census['tasks']} ready; reward 0\.000; ", lines[0]), lines
    for job in backend.jobs():
        if job["status"].get("phase") == "Running":
            folder = workload.state_folder(job)
            folder.mkdir(parents=True, exist_ok=True)
            write_progress(folder, {"generation": 0, "steps": 1})  # what PS 0 of configuration 0 writes at its first checkpoint
    census = backend.census()
    assert census["starting"] == 0 and "starting" not in slot_line(1, 0.0, census, 1.0)
    backend.close()
