"""Faults against the real API server: restarts, pods and nodes removed behind the scheduler's back,
API errors and conflicts, invalid DL2Jobs."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time

import httpx2
import pytest
from lightkube.resources.core_v1 import ConfigMap, Node, Pod, PodStatus
from mlflow.tracking import MlflowClient

from dl2.backends.emulator import ProgressEmulator
from dl2.backends.kube import KubeCluster
from dl2.backends.loop import run, run_slot
from dl2.errors import Dl2Error
from dl2.kube.client import ApiError, Kube, load_config
from dl2.kube.jobs import submit_trace, trace_manifests
from dl2.kube.resources import CLOCK, JOB_LABEL, DL2Job, ensure_namespace
from dl2.schedulers import get_scheduler

from .support import PRESET, assert_simulator_jcts, params_file, scenario, space, submitted, trace


def _scheduler_process(testbed, ns, params, *extra):
    cmd = [sys.executable, "-m", "dl2.cli", "k8s-scheduler", "run", f"--kubeconfig={testbed.kubeconfig}", f"--namespace={ns}",
           f"--pool={ns}", "--policy=drf", f"--preset={PRESET.name}", f"--params={params}", "--slot-seconds=0",
           "--lease-seconds=2", *extra]  # a killed scheduler's lease expires soon: the restarted one waits 2 s
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_mid_run_the_scheduler_resumes_from_the_cluster(kube, testbed, tmp_path):
    sc, tr, ns = submitted(kube, 3)
    params = params_file(tmp_path)
    first = _scheduler_process(testbed, ns, params, "--until-done")
    try:
        deadline = time.monotonic() + 120
        while _clock(kube, ns) < 5:
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait()
    killed_at = _clock(kube, ns)
    assert any(j["status"].get("phase") != "Succeeded" for j in kube.list(DL2Job, ns)), "killed before the end"
    second = _scheduler_process(testbed, ns, params, "--until-done")
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    backend = KubeCluster(kube, sc, ns, ns)
    assert_simulator_jcts(backend.jct(), tr, sc)
    assert killed_at >= 5
    # its answer tells the cluster's slots from its own; its stderr holds only its own lines (no MLflow store's INFO)
    result = json.loads(out)
    assert (result["cluster_slots"], result["slots_run"]) == (backend.slot, backend.slot - killed_at), result
    metrics = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(result["mlflow_run"]).data.metrics
    assert (metrics["cluster_slots"], metrics["slots_run"]) == (backend.slot, backend.slot - killed_at)
    assert all(line.startswith(("slot ", "waiting: ")) for line in err.splitlines()), err


def _clock(kube, ns) -> int:
    try:
        return int(kube.get(ConfigMap, CLOCK, ns)["data"]["slot"])
    except ApiError:
        return -1


def test_a_slot_interrupted_after_its_allocation_is_committed_is_finished_as_committed(kube):
    sc, tr, ns = submitted(kube, 4)
    backend = KubeCluster(kube, sc, ns, ns)
    for _ in range(3):
        run_slot(backend, get_scheduler("drf"))
    alloc = get_scheduler("drf").schedule(backend.observe())
    backend._run_committed = lambda: (_ for _ in ()).throw(RuntimeError("killed"))  # dies right after committing
    with pytest.raises(RuntimeError):
        backend.apply(alloc)
    fresh = KubeCluster(kube, sc, ns, ns)
    fresh.observe()
    assert fresh.committed is not None and fresh.slot == 3
    fifo = get_scheduler("fifo")  # a different policy would decide otherwise: the committed slot must win
    run(fresh, fifo, max_slots=1)
    run(fresh, get_scheduler("drf"))
    assert_simulator_jcts(fresh.jct(), tr, sc)


def test_pods_deleted_behind_its_back_are_recreated(kube):
    sc, tr, ns = submitted(kube, 5)
    backend = KubeCluster(kube, sc, ns, ns)
    drf = get_scheduler("drf")
    run(backend, drf, max_slots=2)
    obs = backend.observe()
    alloc = drf.schedule(obs)
    # the allocation is committed; before its pods are made, someone deletes every pod of the namespace
    before = {p["metadata"]["name"] for p in kube.list(Pod, ns, labels={JOB_LABEL: None})}
    assert before
    for name in before:
        kube.delete(Pod, name, ns)
    backend.apply(alloc)
    after = kube.list(Pod, ns, labels={JOB_LABEL: None})
    assert len(after) == sum(j["status"].get("allocation", {}).get("workers", 0) + j["status"].get("allocation", {}).get("ps", 0)
                             for j in kube.list(DL2Job, ns) if j["status"].get("phase") == "Running")
    assert all(p["spec"].get("nodeName") for p in after)
    run(backend, drf)
    assert backend.done and len(backend.jct()) == len(tr)


def test_a_node_that_disappears_has_its_tasks_placed_elsewhere(kube):
    sc, tr, ns = submitted(kube, 6, num_nodes=3)
    backend = KubeCluster(kube, sc, ns, ns)
    drf = get_scheduler("drf")
    run(backend, drf, max_slots=4)  # the first jobs finish within their slot; job 4 (8000 epochs) runs on
    pods = kube.list(Pod, ns, labels={JOB_LABEL: None})
    assert pods, "tasks are running"
    gone = pods[0]["spec"]["nodeName"]
    kube.delete(Node, gone)
    run(backend, drf, max_slots=1)
    pods = kube.list(Pod, ns, labels={JOB_LABEL: None})
    assert pods and all(p["spec"]["nodeName"] != gone for p in pods)
    assert backend.observe().num_nodes == 2
    run(backend, drf)
    assert backend.done and len(backend.jct()) == len(tr)


class Flaky(httpx2.BaseTransport):
    """Forwards to the real server, but answers `burst` requests in every `period` with 503 or 429 instead."""

    def __init__(self, config, period: int, burst: int):
        trusted = ssl.create_default_context(cafile=config.cluster.certificate_auth)
        self.real, self.period, self.burst = httpx2.HTTPTransport(verify=trusted), period, burst
        self.count, self.injected = 0, 0

    def handle_request(self, request):
        self.count += 1
        if self.count % self.period < self.burst:
            self.injected += 1
            return httpx2.Response(503 if self.injected % 2 else 429, json={"kind": "Status", "reason": "TooBusy"})
        return self.real.handle_request(request)


def test_transient_api_errors_are_retried_with_backoff(testbed, kube):
    """503 and 429 cannot be caused on demand with a healthy server: a transport injects them."""
    sc, tr, ns = submitted(kube, 7)
    config = load_config(testbed.kubeconfig)
    flaky = Flaky(config, period=5, burst=1)
    client = Kube(config, backoff=0.001, transport=flaky)
    backend = KubeCluster(client, sc, ns, ns)
    run(backend, get_scheduler("drf"), log=pytest.fail)  # every failure is absorbed by the client's retries
    assert_simulator_jcts(backend.jct(), tr, sc)
    assert flaky.injected > 10 and client.retried == flaky.injected
    client.close()


def test_errors_that_outlast_the_retries_do_not_end_the_loop(testbed, kube):
    sc, tr, ns = submitted(kube, 8)
    config = load_config(testbed.kubeconfig)
    flaky = Flaky(config, period=150, burst=3)
    client = Kube(config, retries=1, backoff=0.001, transport=flaky)  # three failures in a row get through
    logged = []
    backend = KubeCluster(client, sc, ns, ns)
    run(backend, get_scheduler("drf"), log=logged.append, max_backoff=0.01)
    assert logged and all(" 503 " in m or " 429 " in m for m in logged)
    assert_simulator_jcts(backend.jct(), tr, sc)
    client.close()


def test_a_conflicting_progress_write_is_retried_on_fresh_data_and_counted_once(kube):
    sc, tr, ns = submitted(kube, 9)
    backend = KubeCluster(kube, sc, ns, ns)
    while not any(j.get("status", {}).get("phase") == "Running" for j in kube.list(DL2Job, ns)):
        run(backend, get_scheduler("drf"), max_slots=1)
    slot = backend.slot
    stale = next(j for j in kube.list(DL2Job, ns) if j["status"].get("phase") == "Running")
    name, model = stale["metadata"]["name"], sc.catalog.index(stale["spec"]["model"])
    kube.patch(DL2Job, name, {"metadata": {"labels": {"touched": "yes"}}}, ns)  # a newer resourceVersion
    emulator = ProgressEmulator(kube, ns, sc.table, True)
    nodes = {n["metadata"]["name"] for n in backend.nodes()}
    retried = kube.retried
    emulator.advance(slot, [stale], [model], nodes)  # writes with the stale version: 409, re-read, write
    assert kube.retried == retried + 1
    counted = kube.get(DL2Job, name, ns)["status"]
    assert counted["progressSlot"] == slot
    emulator.advance(slot, [stale], [model], nodes)  # the same slot again (a restart): conflict, then nothing to do
    assert kube.get(DL2Job, name, ns)["status"]["progress"] == counted["progress"]


def test_a_pod_its_node_refused_does_not_train(kube):
    sc, tr, ns = submitted(kube, 17)
    backend = KubeCluster(kube, sc, ns, ns)

    def running_with_two_workers():
        return [j for j in kube.list(DL2Job, ns) if j.get("status", {}).get("phase") == "Running"
                and j["status"]["allocation"]["workers"] >= 2 and j["status"]["allocation"]["ps"] >= 1]

    while not running_with_two_workers():
        run(backend, get_scheduler("drf"), max_slots=1)
    job = running_with_two_workers()[0]
    name, alloc = job["metadata"]["name"], job["status"]["allocation"]
    worker = next(p for p in kube.list(Pod, ns, labels={JOB_LABEL: name, "dl2.io/role": "worker"}))
    kube.patch(PodStatus, worker["metadata"]["name"], {"status": {"phase": "Failed", "reason": "OutOfcpu"}}, ns)
    slot, model = backend.slot, sc.catalog.index(job["spec"]["model"])
    ProgressEmulator(kube, ns, sc.table, True).advance(slot, [job], [model], {n["metadata"]["name"] for n in backend.nodes()})
    trained = kube.get(DL2Job, name, ns)["status"]["progress"] - job["status"]["progress"]
    remaining = job["spec"]["epochs"] - job["status"]["progress"]
    # progress is stored as a running sum, so the difference of two sums carries its rounding
    assert trained == pytest.approx(min(sc.table[model, alloc["ps"], alloc["workers"] - 1], remaining), rel=1e-12)


def test_an_invalid_dl2job_fails_with_a_condition_and_the_others_run(kube):
    sc, tr = scenario(), trace(10)
    ns = space(kube)
    bad = trace_manifests(tr, sc.catalog, ns)[:3]
    bad[0]["metadata"]["name"], bad[0]["spec"]["model"] = "bad-model", "no-such-model"
    bad[1]["metadata"]["name"], bad[1]["spec"]["workerDemand"] = "too-big", {"cpu": 9, "gpu": 1}
    bad[2]["metadata"]["name"], bad[2]["spec"]["limits"] = "over-limit", {"maxWorkers": PRESET.max_tasks + 1}
    for manifest in bad:
        kube.create(manifest)
    with pytest.raises(ApiError) as rejected:
        kube.create({**bad[0], "metadata": {"name": "no-epochs", "namespace": ns}, "spec": {"model": "resnet-50"}})
    assert rejected.value.status == 422 and "epochs" in str(rejected.value)
    submit_trace(kube, tr, sc.catalog, ns)
    backend = KubeCluster(kube, sc, ns, ns)
    run(backend, get_scheduler("drf"))
    for name, words in (("bad-model", "spec.model: unknown model 'no-such-model'"), ("too-big", "more than one node holds"),
                        ("over-limit", f"spec.limits: at most {PRESET.max_tasks} workers")):
        status = kube.get(DL2Job, name, ns)["status"]
        assert status["phase"] == "Failed"
        (condition,) = status["conditions"]
        assert condition["type"] == "Valid" and condition["status"] == "False" and condition["reason"] == "InvalidSpec"
        assert words in condition["message"]
    assert_simulator_jcts(backend.jct(), tr, sc)


def test_no_ready_node_is_a_clear_error(kube):
    ensure_namespace(kube, "empty-pool")
    with pytest.raises(Dl2Error, match="no Ready node carries the label dl2.io/pool=empty-pool"):
        KubeCluster(kube, scenario(), "empty-pool", "empty-pool").observe()
