"""CPU isolation on the kind testbed (`dl2 testbed up --kind --isolate`), the parts that need no cluster: each
CPU slot's share of the host, the limit in a training pod's manifest, and the threads its process takes."""

from __future__ import annotations

import pytest

from dl2.backends.workloads import Trained
from dl2.errors import Dl2Error
from dl2.kube.jobs import JobSpec
from dl2.kube.resources import ROLE_LABEL, PodRuntime
from dl2.testbed.kind.cluster import RESERVED_MILLIS, SLOTS_PER_NODE, cpu_millis_per_slot
from dl2.testbed.training.threads import CPU_LIMIT_ENV, training_threads

JOB = {"metadata": {"name": "job-00001", "namespace": "ns", "uid": "0123456789abcdef"}, "status": {"jobId": 1}}
SPEC = JobSpec(model=0, epochs=2.0, worker_demand=(2, 4), ps_demand=(3, 0), max_workers=2, max_ps=2,
               arrival_slot=0, job_id=1)


def manifest(tmp_path, share: int, role: str) -> dict:
    runtime = PodRuntime("image", "/venv/bin/python", [], [], "/shared", tmp_path, cpu_millis_per_slot=share)
    workload = Trained("ns", ("resnet-50",), runtime, slot_seconds=20.0, fine_grained=True)
    desired = workload.pods(JOB, SPEC, [("ps", "node-a"), ("worker", "node-b")], slot=3, existing=[])
    return next(pod for pod, _ in desired.values() if pod["metadata"]["labels"][ROLE_LABEL] == role)


@pytest.mark.parametrize(("cores", "workers", "cpu_slots"), [(2, 3, 8), (16, 3, 8), (64, 10, 8), (3, 1, 8), (2, 3, 4), (8, 2, 1)])
def test_the_slots_together_never_ask_for_more_cpu_than_the_host_has_less_the_reserve(cores, workers, cpu_slots):
    share = cpu_millis_per_slot(cores, workers, cpu_slots)
    slots = workers * cpu_slots
    assert share * slots <= 1000 * cores - RESERVED_MILLIS < (share + 1) * slots


def test_fewer_cpu_slots_per_worker_give_each_slot_more_of_the_host():
    assert cpu_millis_per_slot(2, 3, SLOTS_PER_NODE[0]) == 62 and cpu_millis_per_slot(2, 3, 4) == 125


def test_a_kind_cluster_records_its_advertised_slots_and_reads_them_back(tmp_path):
    import json

    from dl2.testbed.kind.cluster import STATE_FILE, load

    state = {"name": "dl2", "ready": True, "kubeconfig": str(tmp_path / "kubeconfig"), "server": "https://127.0.0.1:1",
             "control_plane": "cp", "workers": ["w1"], "node_image": "n", "runtime_image": "r", "images_source": "built",
             "mounts": [], "timings": {}, "cpu_millis_per_slot": 125, "slots_per_node": [4, 8]}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    assert load(tmp_path).slots_per_node == (4, 8)
    del state["slots_per_node"]  # a cluster brought up before --cpu-slots advertised the paper's node
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    assert load(tmp_path).slots_per_node == SLOTS_PER_NODE


def test_a_host_too_small_to_share_is_refused_with_what_to_change():
    assert cpu_millis_per_slot(2, 3) == 62  # this project's machine: (2000 - 500) m over 3 workers of 8 slots
    with pytest.raises(Dl2Error, match="use fewer --workers"):
        cpu_millis_per_slot(1, 40)


@pytest.mark.parametrize("role", ["ps", "worker"])
def test_an_isolated_pod_requests_and_is_limited_to_its_slots_share_and_hears_it(tmp_path, role):
    container = manifest(tmp_path, 62, role)["spec"]["containers"][0]
    slots = {"ps": SPEC.ps_demand, "worker": SPEC.worker_demand}[role][0]
    resources = container["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == f"{62 * slots}m"
    env = {e["name"]: e for e in container["env"]}
    assert env[CPU_LIMIT_ENV]["valueFrom"] == {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}


def test_without_isolation_a_pod_is_as_before_no_cpu_limit_and_one_thread(tmp_path):
    container = manifest(tmp_path, 0, "worker")["spec"]["containers"][0]
    assert "cpu" not in container["resources"]["requests"] and "cpu" not in container["resources"]["limits"]
    assert CPU_LIMIT_ENV not in {e["name"] for e in container["env"]}


@pytest.mark.parametrize(("value", "threads"), [(None, 1), ("124", 1), ("999", 1), ("1000", 1), ("2500", 2), ("8000", 8)])
def test_a_training_process_computes_on_its_limit_in_whole_cores(value, threads):
    assert training_threads({} if value is None else {CPU_LIMIT_ENV: value}) == threads


@pytest.mark.parametrize("value", ["1.5", "two", "0", "-100"])
def test_a_limit_that_is_not_whole_millicores_is_refused_naming_the_variable(value):
    with pytest.raises(Dl2Error, match=CPU_LIMIT_ENV):
        training_threads({CPU_LIMIT_ENV: value})



@pytest.mark.parametrize("flag", [["--isolate"], ["--cpu-slots", "4"]])
def test_kind_only_flags_are_refused_for_the_local_testbed(capsys, tmp_path, flag):
    from dl2.cli import main

    assert main(["testbed", "up", "--local", *flag, "--folder", str(tmp_path / "bed")]) == 2
    assert flag[0] in capsys.readouterr().err and not (tmp_path / "bed").exists()


def test_a_kind_cluster_without_cpu_slots_is_refused_before_anything_starts(capsys, tmp_path):
    from dl2.cli import main

    assert main(["testbed", "up", "--kind", "--cpu-slots", "0", "--folder", str(tmp_path / "bed")]) == 2
    assert "--cpu-slots must be at least 1" in capsys.readouterr().err and not (tmp_path / "bed").exists()


@pytest.mark.parametrize(("configuration", "workers", "count"), [((1, 1), 3, 10), ((2, 2), 3, 8), ((2, 2), 1, 0), ((1, 2), 2, 5)])
def test_the_neighbours_fill_every_cpu_slot_the_measured_configuration_leaves(configuration, workers, count):
    from dl2.sim_to_real.independence import neighbour_count

    assert neighbour_count(configuration, workers, SLOTS_PER_NODE[0]) == count


@pytest.mark.parametrize("share", [0, 62])
def test_a_neighbour_spins_limited_like_a_task_only_where_tasks_are_limited(tmp_path, share):
    from dl2.sim_to_real.independence import TASK_CPU_SLOTS, neighbour_manifest

    runtime = PodRuntime("image", "/venv/bin/python", [{"name": "v"}], [{"name": "v", "mountPath": "/v"}], "/shared", tmp_path,
                         cpu_millis_per_slot=share)
    pod = neighbour_manifest("spin-0", "node-a", runtime)
    container = pod["spec"]["containers"][0]
    assert pod["spec"]["nodeName"] == "node-a" and container["command"] == ["/venv/bin/python"]
    limits = container.get("resources", {}).get("limits", {})
    assert limits == ({"cpu": f"{TASK_CPU_SLOTS * share}m"} if share else {})
    assert "dl2.io/cpu-slots" not in str(pod), "a neighbour holds no dl2 slots, so the measured job is placed as alone"
