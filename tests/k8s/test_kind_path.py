"""What of the kind path runs without Docker: its manifests pass the real API server's server-side
dry run, and the container's entrypoint (the Deployment's arguments) runs as a local process."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import yaml

from dl2.backends.kube import KubeCluster
from dl2.kube.jobs import trace_manifests
from dl2.kube.resources import RESTRICTED_CONTAINER, DL2Job, crd_manifest, scheduler_rbac
from dl2.paths import PACKAGE_DIR

from .support import PRESET, assert_simulator_jcts, params_file, scenario, space, submitted, trace

DEPLOY = PACKAGE_DIR.parents[1] / "deploy"


def _scheduler_manifests() -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "manifests" / "scheduler.yaml").read_text()) if d]


def test_manifests_pass_server_side_dry_run(kube):
    docs = _scheduler_manifests()
    assert {d["kind"] for d in docs} == {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                                         "ClusterRoleBinding", "Deployment"}
    namespace = next(d for d in docs if d["kind"] == "Namespace")
    kube.create(namespace)  # namespaced objects are checked against an existing namespace
    for doc in [*docs, crd_manifest()]:
        if doc["kind"] == "Namespace":
            continue
        answer = kube.apply(doc, dry_run=True)  # kubectl apply --server-side --dry-run=server
        assert answer["metadata"]["name"] == doc["metadata"]["name"]
    ns = space(kube)
    for manifest in trace_manifests(trace(0), scenario().catalog, ns)[:3]:
        kube.create(manifest, dry_run=True)
    assert kube.list(DL2Job, ns) == []


def test_the_deployment_has_least_privilege_safe_pods_and_two_replicas_that_elect_one():
    docs = _scheduler_manifests()
    assert [d for d in docs if d["kind"] not in ("Namespace", "Deployment")] == scheduler_rbac("dl2")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2 and pod["serviceAccountName"] == "dl2-scheduler"
    container = pod["containers"][0]
    assert container["securityContext"] == RESTRICTED_CONTAINER
    lease = [a for a in container["args"] if a.startswith("--lease-seconds=")]
    assert lease and float(lease[0].split("=")[1]) > 0, "the replicas elect one with a Lease"
    assert "USER 65532:65532" in (DEPLOY / "Dockerfile").read_text()


def test_kind_config_and_script_agree_with_the_scheduler():
    config = yaml.safe_load((DEPLOY / "kind-cluster.yaml").read_text())
    workers = [n for n in config["nodes"] if n["role"] == "worker"]
    assert len(workers) >= 2 and all(n["labels"]["dl2.io/pool"] == "dl2" for n in workers)
    assert sorted(int(n["labels"]["dl2.io/node-index"]) for n in workers) == list(range(len(workers)))
    script = (DEPLOY / "kind-up.sh").read_text()
    for step in ("kind create cluster", "docker build -f deploy/Dockerfile", "kind load docker-image",
                 "dl2job-crd.yaml", "dl2.io~1cpu-slots", "dl2.io~1gpu-slots",
                 "deploy/manifests/scheduler.yaml"):
        assert step in script
    subprocess.run(["bash", "-n", str(DEPLOY / "kind-up.sh")], check=True)


def _entrypoint() -> list[str]:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    entry = yaml.safe_load(re.search(r"^ENTRYPOINT (.*)$", dockerfile, re.M).group(1))
    deployment = next(d for d in _scheduler_manifests() if d["kind"] == "Deployment")
    return entry + deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_containers_entrypoint_runs_as_a_local_process(kube, testbed, tmp_path):
    """The Deployment's command, pointed at the testbed instead of the in-cluster service account."""
    sc, tr, ns = submitted(kube, 11)
    params = params_file(tmp_path)
    command = _entrypoint()
    assert command[:3] == ["dl2", "k8s-scheduler", "run"] and "--in-cluster" in command
    local = {"--in-cluster": f"--kubeconfig={testbed.kubeconfig}", "--namespace=dl2": f"--namespace={ns}",
             "--pool=dl2": f"--pool={ns}", "--preset=paper": f"--preset={PRESET.name}", "--slot-seconds=2": "--slot-seconds=0"}
    args = [local.get(a, a) for a in command[1:]] + [f"--params={params}", "--until-done"]
    done = subprocess.run([sys.executable, "-m", "dl2.cli", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_simulator_jcts(KubeCluster(kube, sc, ns, ns).jct(), tr, sc)


def test_the_task_process_holds_its_place_until_terminated():
    proc = subprocess.Popen([sys.executable, "-m", "dl2.cli", "k8s-scheduler", "task", "--job", "job-00001", "--role", "worker"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "dl2 task: worker of DL2Job job-00001"
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
