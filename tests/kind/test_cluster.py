"""The kind testbed end to end: nodes, the runtime image with the mounted environment, the shared folder,
cross-node pod networking, and a `down` that leaves nothing of ours behind. The tests run in file order;
the last one takes the cluster down."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node, Pod

from dl2.kube.resources import NODE_INDEX_LABEL, POOL_LABEL, is_ready, slots
from dl2.paths import repo_root
from dl2.testbed import kind
from dl2.testbed.kind import daemon, firewall
from dl2.testbed.kind.cluster import STATE_FILE, _tag, in_pod_network
from dl2.workload.presets import load_presets

from .conftest import pod_log, wait_for


def runtime_pod(cluster, namespace: str, name: str, node: str, script: str, port: int | None = None) -> dict:
    """A pod of the runtime image on `node` that runs `script` with the host's venv Python (mounted)."""
    volumes, mounts = kind.pod_volumes(cluster.folder)
    venv = next(m.path for m in cluster.mounts if m.path.endswith(".venv"))
    container = {"name": "main", "image": cluster.runtime_image, "imagePullPolicy": "Never",
                 "command": [f"{venv}/bin/python", "-c", script], "volumeMounts": mounts,
                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}
    if port:
        container["ports"] = [{"containerPort": port}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "restartPolicy": "Never", "volumes": volumes, "containers": [container]}}


def finished(kube, namespace: str, name: str):
    pod = kube.get(Pod, name, namespace)
    phase = pod.get("status", {}).get("phase")
    assert phase != "Failed", f"pod {name} failed: {pod_log(kube, namespace, name)}"
    return pod if phase == "Succeeded" else None


def test_nodes_are_ready_labelled_and_advertise_their_slots(cluster, kube):
    nodes = {n["metadata"]["name"]: n for n in kube.list(Node)}
    assert sorted(nodes) == sorted(cluster.nodes) and len(cluster.workers) == 3
    assert all(is_ready(n) for n in nodes.values())
    for k, worker in enumerate(cluster.workers):
        labels = nodes[worker]["metadata"]["labels"]
        assert labels[POOL_LABEL] == kind.POOL and labels[NODE_INDEX_LABEL] == str(k)
        assert slots(nodes[worker]) == cluster.slots_per_node == (load_presets()["testbed"].node_cpu, kind.SLOTS_PER_NODE[1])
    assert POOL_LABEL not in nodes[cluster.control_plane]["metadata"]["labels"]
    assert kube.get(CustomResourceDefinition, "dl2jobs.dl2.io")["spec"]["names"]["kind"] == "DL2Job"
    assert len({n["spec"]["podCIDR"] for n in nodes.values()}) == len(nodes)
    assert kind.worker_nodes(cluster.folder) == cluster.workers
    assert kind.runtime_image(cluster.folder).startswith("dl2.local/runtime:")


def test_runtime_pods_import_torch_and_dl2_and_share_files(cluster, kube, namespace):
    """One worker's pod imports torch and dl2 from the mounted environment and writes into the shared
    folder; a pod on another worker reads what it wrote."""
    path = f"{kind.SHARED_IN_NODE}/{namespace}/hello.json"
    write = ("import json, os, torch, dl2\n"
             f"os.makedirs(os.path.dirname({path!r}), exist_ok=True)\n"
             f"json.dump({{'torch': torch.__version__, 'dl2': dl2.__file__, 'sum': float(torch.ones(3).sum()),"
             f" 'node': os.environ['NODE']}}, open({path!r}, 'w'))\n")
    read = f"import json, os; print(json.dumps({{**json.load(open({path!r})), 'reader': os.environ['NODE']}}))"
    first, second = cluster.workers[0], cluster.workers[1]
    kube.create(runtime_pod(cluster, namespace, "writer", first, write))
    wait_for("the writer pod", lambda: finished(kube, namespace, "writer"))
    kube.create(runtime_pod(cluster, namespace, "reader", second, read))
    wait_for("the reader pod", lambda: finished(kube, namespace, "reader"))
    seen = json.loads(pod_log(kube, namespace, "reader").strip().splitlines()[-1])
    assert seen["node"] == first and seen["reader"] == second and seen["sum"] == 3.0
    assert seen["dl2"].startswith(str(repo_root()))
    on_host = json.loads((cluster.shared / namespace / "hello.json").read_text())
    assert on_host["torch"] == seen["torch"]


SERVER = """
import os, socket
server = socket.create_server(("0.0.0.0", 7070))
connection, peer = server.accept()
connection.sendall(f"{os.environ['POD_IP']} {peer[0]}".encode())
connection.close()
print("served", peer[0])
"""

CLIENT = """
import os, socket, time
for attempt in range(120):
    try:
        connection = socket.create_connection((os.environ['SERVER'], 7070), timeout=5)
        break
    except OSError:
        time.sleep(0.5)
print(connection.recv(200).decode(), os.environ['POD_IP'])
"""


def test_pods_on_different_workers_talk_over_tcp(cluster, kube, namespace):
    first, second = cluster.workers[0], cluster.workers[2]
    kube.create(runtime_pod(cluster, namespace, "server", first, SERVER, port=7070))
    server_ip = wait_for("the server pod's IP", lambda: kube.get(Pod, "server", namespace).get("status", {}).get("podIP"))
    client = runtime_pod(cluster, namespace, "client", second, CLIENT)
    client["spec"]["containers"][0]["env"].append({"name": "SERVER", "value": server_ip})
    kube.create(client)
    wait_for("the client pod", lambda: finished(kube, namespace, "client"))
    wait_for("the server pod", lambda: finished(kube, namespace, "server"))
    served_ip, peer_ip, client_ip = pod_log(kube, namespace, "client").split()
    assert served_ip == server_ip and peer_ip == client_ip  # no NAT between pods
    assert server_ip != client_ip and in_pod_network(server_ip) and in_pod_network(client_ip)
    pods = {p["metadata"]["name"]: p for p in kube.list(Pod, namespace)}
    assert pods["server"]["spec"]["nodeName"] != pods["client"]["spec"]["nodeName"]


def test_status_reports_the_running_cluster(cluster):
    report = kind.status(cluster.folder)
    assert report["ready"] and report["daemon"]
    assert set(report["containers"]) == set(cluster.nodes) and set(report["containers"].values()) == {"running"}
    assert all(report["nodes_ready"].values()) and len(report["nodes_ready"]) == len(cluster.nodes)


def test_down_leaves_nothing_behind(cluster):
    folder = cluster.folder
    state = json.loads((folder / STATE_FILE).read_text())
    recorded = json.loads((folder / "daemon.json").read_text())
    exec_root = recorded["exec_root"]
    removed = kind.down(folder)
    assert "dockerd" in removed and not (folder / STATE_FILE).exists() and not (folder / "daemon.json").exists()
    assert not Path(f"/proc/{recorded['pid']}").exists() or daemon._zombie(recorded["pid"])
    leftovers = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).find(exec_root) >= 0]
    assert leftovers == [], f"processes of the kind daemon outlived `down`: {leftovers}"
    assert not Path(f"/sys/class/net/{state['network']['bridge']}").exists()
    assert all(not Path(created).exists() for created in state.get("created", []))
    assert firewall.tagged_rules(_tag(folder)) == [] and all(
        subprocess.run(["iptables", "-C", *rule], capture_output=True).returncode != 0 for rule in state["forward_rules"])
    before = recorded.get("iptables_before")  # None where another Docker daemon ran when ours started
    if before is not None and not firewall.dockerd_running():
        assert firewall.snapshot() == before, "the daemon's chains, FORWARD policy or IP forwarding outlived `down`"
    ids = set(state["containers"].values())
    in_containers = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and any(i in _cgroup(p) for i in ids)]
    assert in_containers == [], f"processes of the node containers outlived `down`: {in_containers}"


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cgroup(proc: Path) -> str:
    try:
        return (proc / "cgroup").read_text()
    except OSError:
        return ""
