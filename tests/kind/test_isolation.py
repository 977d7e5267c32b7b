"""CPU isolation on real nodes: a task pod given a CPU limit (`dl2 testbed up --kind --isolate`) is held to it by
the node's kubelet, and its training process sizes its threads by the limit it hears through the downward API."""

from __future__ import annotations

import json

from lightkube.resources.core_v1 import Pod

from dl2.kube.jobs import submit_trace
from dl2.kube.resources import DL2Job, pod_manifest
from dl2.sim.scenario import Scenario
from dl2.testbed import kind
from dl2.testbed.training.threads import CPU_LIMIT_ENV
from dl2.workload.presets import load_presets
from dl2.workload.traces import read_trace

from .conftest import pod_log, wait_for
from .test_trained import EXAMPLE

LIMIT_MILLIS = 250
BURN = """
import json, time
from dl2.testbed.training.threads import training_threads
wall, cpu = time.monotonic(), time.process_time()
while time.monotonic() - wall < 8:
    pass
print(json.dumps({"cpu": time.process_time() - cpu, "wall": time.monotonic() - wall, "threads": training_threads()}))
"""


def test_a_limited_pod_gets_its_share_of_a_core_and_computes_on_one_thread(cluster, kube, namespace):
    catalog = Scenario(load_presets()["testbed"]).catalog
    job_name = submit_trace(kube, read_trace(EXAMPLE / "trace.csv", catalog), catalog, namespace)[0]
    job = kube.get(DL2Job, job_name, namespace)
    runtime = kind.pod_runtime(cluster.folder)
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
           {"name": CPU_LIMIT_ENV, "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}}]
    container = {"image": runtime.image, "command": [runtime.python], "args": ["-c", BURN], "env": env,
                 "volumeMounts": runtime.volume_mounts}
    manifest = pod_manifest(job, "burn", "worker", (2, 0), container, volumes=runtime.volumes, cpu_millis=LIMIT_MILLIS)
    manifest["spec"]["nodeName"] = cluster.workers[0]  # placed by hand: no scheduler runs in this test
    kube.create(manifest)
    wait_for("the burning pod to finish", lambda: kube.get(Pod, "burn", namespace).get("status", {}).get("phase")
             in ("Succeeded", "Failed"), timeout=240)
    assert kube.get(Pod, "burn", namespace)["status"]["phase"] == "Succeeded", pod_log(kube, namespace, "burn")
    measured = json.loads(pod_log(kube, namespace, "burn").strip().splitlines()[-1])
    share = measured["cpu"] / measured["wall"]
    print(f"\nCPU limit {LIMIT_MILLIS} m: the pod used {share:.3f} of a core over {measured['wall']:.1f} s")
    assert 0.5 * LIMIT_MILLIS / 1000 < share < 1.3 * LIMIT_MILLIS / 1000, measured  # a busy loop alone would take ~1
    assert measured["threads"] == 1
