"""Least privilege and leader election against the real API server: the scheduler, as its own service
account, runs a trace with a namespaced Role and may read nodes, and nothing more; its pods run restricted;
of two schedulers of one namespace, one acts at a time."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from lightkube.config.models import User
from lightkube.resources.coordination_v1 import Lease as LeaseObject
from lightkube.resources.core_v1 import ConfigMap, Node, Pod, Secret

from dl2.backends.kube import KubeCluster
from dl2.backends.loop import run
from dl2.kube.client import ApiError, Kube, load_config
from dl2.kube.lease import Lease
from dl2.kube.resources import JOB_LABEL, LEASE, RESTRICTED_CONTAINER, DL2Job, scheduler_rbac
from dl2.schedulers import get_scheduler

from .support import assert_simulator_jcts, params_file, space, submitted


def _service_account_client(kube: Kube, kubeconfig, namespace: str) -> Kube:
    """A client that acts as the namespace's dl2-scheduler service account (a token from the TokenRequest API)."""
    for manifest in scheduler_rbac(namespace):
        kube.apply(manifest)
    token = kube.token("dl2-scheduler", namespace)
    return Kube(load_config(kubeconfig)._replace(user=User(token=token)))


def test_the_scheduler_as_its_service_account_runs_a_trace_and_may_do_nothing_else(kube, testbed):
    sc, tr, ns = submitted(kube, 5)
    account = _service_account_client(kube, testbed.kubeconfig, ns)
    try:
        backend = KubeCluster(account, sc, ns, ns)
        run(backend, get_scheduler("drf"), log=pytest.fail)
        assert_simulator_jcts(backend.jct(), tr, sc)
        pods = account.list(Pod, ns, labels={JOB_LABEL: None})
        assert pods == []  # completed jobs keep none
        other = space(kube)
        forbidden = [
            lambda: account.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": other},
                                    "spec": {"containers": [{"name": "x", "image": "x"}]}}),
            lambda: account.delete(Node, f"{other}-node-000"),
            lambda: account.list(Secret, ns),
            lambda: account.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"{ns}-x"}}),
            lambda: account.get(ConfigMap, "not-the-clock", ns),
            lambda: account.list(DL2Job, other),
        ]
        for action in forbidden:
            with pytest.raises(ApiError) as refused:
                action()
            assert refused.value.status == 403, refused.value
        assert account.list(Node, labels={"dl2.io/pool": ns})  # cluster scope: reading nodes
    finally:
        account.close()


def test_the_pods_it_creates_run_restricted(kube):
    sc, tr, ns = submitted(kube, 6)
    backend = KubeCluster(kube, sc, ns, ns)
    for _ in range(10):  # until the first jobs have arrived and run
        run(backend, get_scheduler("drf"), max_slots=1)
        if pods := kube.list(Pod, ns, labels={JOB_LABEL: None}):
            break
    assert pods and all(c["securityContext"] == RESTRICTED_CONTAINER for p in pods for c in p["spec"]["containers"])
    assert all(p["spec"]["automountServiceAccountToken"] is False for p in pods)


def _scheduler(testbed, ns, params, *extra) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dl2.cli", "k8s-scheduler", "run", f"--kubeconfig={testbed.kubeconfig}", f"--namespace={ns}",
           f"--pool={ns}", "--policy=drf", "--preset=k8s-test", f"--params={params}", "--slot-seconds=0.2",
           "--lease-seconds=6", "--until-done", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_of_two_schedulers_one_acts_and_the_other_takes_over_when_it_dies(kube, testbed, tmp_path):
    sc, tr, ns = submitted(kube, 7)
    params = params_file(tmp_path)
    first = _scheduler(testbed, ns, params)
    deadline = time.monotonic() + 60
    while _holder(kube, ns) is None or KubeCluster(kube, sc, ns, ns).slot < 1:  # it holds the lease and has acted
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() is not None else ""
        time.sleep(0.05)
    second = _scheduler(testbed, ns, params)
    try:
        time.sleep(3)  # longer than the lease: the second would have taken it, were the first not renewing it
        assert first.poll() is None and second.poll() is None
        leader = _holder(kube, ns)
        first.kill()
        first.wait()
        out, err = second.communicate(timeout=300)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert second.returncode == 0, err
    lines = err.splitlines()
    assert lines[0].startswith("waiting: another scheduler holds the lease")  # while the first acted, it waited
    assert any(line.startswith("slot ") for line in lines[1:])  # then took over
    assert leader is not None and _holder(kube, ns) in (None, "")  # released on its clean exit
    assert_simulator_jcts(KubeCluster(kube, sc, ns, ns).jct(), tr, sc)


def _holder(kube: Kube, ns: str) -> str | None:
    try:
        return kube.get(LeaseObject, LEASE, ns)["spec"].get("holderIdentity")
    except ApiError:
        return None


def test_a_lease_held_and_renewed_is_not_taken_and_one_expired_is(kube):
    ns = space(kube)
    a, b = Lease(kube, ns, duration=2, identity="a"), Lease(kube, ns, duration=2, identity="b")
    assert a.hold() and not b.hold()
    time.sleep(1.2)
    assert a.hold() and not b.hold()  # renewed in time
    time.sleep(2.6)
    assert b.hold() and not a.hold()  # a let it expire: b takes it, and a sees that
    b.release()
    assert a.hold()


def test_a_holder_that_did_not_renew_within_its_duration_stops_counting_itself_holder(kube):
    ns = space(kube)
    a = Lease(kube, ns, duration=1, identity="a")
    assert a.hold() and a.held
    time.sleep(1.2)  # no renewal: another may take it any moment now, so a must not act on its old hold
    assert not a.held
    assert a.hold() and a.held  # nobody took it meanwhile: renewed


def test_a_lease_kept_from_the_background_outlasts_its_duration_and_is_given_up_on_stop(kube):
    ns = space(kube)
    a, b = Lease(kube, ns, duration=3, identity="a"), Lease(kube, ns, duration=3, identity="b")
    a.keep(log=pytest.fail)
    try:
        time.sleep(7)  # a busy scheduler: no hold() from its loop for more than twice the lease
        assert a.held and not b.hold()
    finally:
        a.stop()
    assert not a.held and b.hold()
