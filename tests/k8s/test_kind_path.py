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


def test_an_isolated_training_pod_passes_the_api_server_with_its_cpu_limit_and_downward_env(kube, tmp_path):
    """With --isolate a task pod carries a CPU request and limit and hears the limit through the downward API:
    the real API server accepts both (server-side dry run) and keeps them as dl2 wrote them."""
    from dl2.backends.workloads import Trained
    from dl2.kube.jobs import JobSpec
    from dl2.kube.resources import PodRuntime
    from dl2.testbed.training.threads import CPU_LIMIT_ENV

    ns = space(kube)
    job = kube.create(trace_manifests(trace(0), scenario().catalog, ns)[0])
    job["status"] = {"jobId": 0}
    spec = JobSpec(model=0, epochs=1.0, worker_demand=(2, 4), ps_demand=(2, 0), max_workers=2, max_ps=2,
                   arrival_slot=0, job_id=0)
    runtime = PodRuntime("dl2.local/runtime:test", "/venv/bin/python", [], [], "/dl2/shared", tmp_path, cpu_millis_per_slot=62)
    pods = Trained(ns, scenario().catalog.names, runtime, 20.0, True).pods(job, spec, [("ps", "n0"), ("worker", "n1")], 0, [])
    for manifest, _ in pods.values():
        answer = kube.create(manifest, dry_run=True)
        container = answer["spec"]["containers"][0]
        assert container["resources"]["limits"]["cpu"] == container["resources"]["requests"]["cpu"] == "124m"
        env = {e["name"]: e for e in container["env"]}
        assert env[CPU_LIMIT_ENV]["valueFrom"]["resourceFieldRef"] == {"resource": "limits.cpu", "divisor": "1m"}
