"""The local control plane: built from the pinned modules, started on loopback, managed by the CLI."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from lightkube.config.models import User
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Namespace, Node

from dl2.errors import Dl2Error
from dl2.kube.client import ApiError, Kube, load_config
from dl2.kube.resources import POOL_LABEL, crd_manifest, create_nodes, install_crd, slots
from dl2.testbed import build

from .support import PRESET, params_file


def test_nodes_mirror_the_presets_cluster(kube):
    names = create_nodes(kube, "mirror", 3, PRESET.node_cpu, PRESET.node_gpu)
    nodes = kube.list(Node, labels={POOL_LABEL: "mirror"})
    assert sorted(n["metadata"]["name"] for n in nodes) == names
    for node in nodes:
        assert slots(node) == (PRESET.node_cpu, PRESET.node_gpu)  # the scheduler's CPU and GPU slots
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])  # KWOK's doing


def test_the_crd_installs_again_and_is_served_with_its_columns(kube):
    install_crd(kube)  # up installed it already: applying it again is fine
    served = kube.get(CustomResourceDefinition, "dl2jobs.dl2.io")
    columns = [c["name"] for c in served["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == [c["name"] for c in crd_manifest()["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert {"Workers", "PS", "Progress", "Phase"} <= set(columns)
    assert served["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_the_api_server_wants_the_token(testbed):
    config = load_config(testbed.kubeconfig)
    assert config.cluster.server.startswith("https://127.0.0.1:") and config.user.token
    anonymous = Kube(config._replace(user=User(token="wrong")), retries=0)
    with pytest.raises(ApiError) as refused:
        anonymous.list(Node)
    assert refused.value.status == 401
    anonymous.close()


def test_a_kind_style_kubeconfig_logs_in_with_its_embedded_certificate_and_leaves_no_files(tmp_path, testbed, monkeypatch):
    """kind writes the CA and the user's certificate and key into the kubeconfig: they work, and no copy of the
    key stays on disk after the client is built."""
    pki = testbed.folder / "pki"
    data = {name: base64.b64encode((pki / name).read_bytes()).decode() for name in ("ca.crt", "admin.crt", "admin.key")}
    kubeconfig = tmp_path / "kind-kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "kind",
        "clusters": [{"name": "kind", "cluster": {"server": testbed.server, "certificate-authority-data": data["ca.crt"]}}],
        "users": [{"name": "kind", "user": {"client-certificate-data": data["admin.crt"], "client-key-data": data["admin.key"]}}],
        "contexts": [{"name": "kind", "context": {"cluster": "kind", "user": "kind"}}]}))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    config = load_config(kubeconfig)
    assert config.user.token is None and config.user.client_key_data
    kube = Kube(config, retries=0)
    assert kube.get(Namespace, "default")["metadata"]["name"] == "default"  # system:masters may read it
    kube.close()
    assert list(scratch.iterdir()) == []


def test_a_kubeconfig_with_an_exec_credential_plugin_logs_in(tmp_path, testbed):
    """Cloud kubeconfigs get their tokens from a plugin (an ExecCredential on its stdout), as kubectl does."""
    config = json.loads(testbed.kubeconfig.read_text())

    def plugged(token: str) -> Kube:
        credential = json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                                 "status": {"token": token}})
        config["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
                                               "args": ["-c", f"print({credential!r})"], "interactiveMode": "Never"}}
        path = tmp_path / f"kubeconfig-{token[:4]}"
        path.write_text(json.dumps(config))
        return Kube.from_kubeconfig(path, retries=0)

    token = config["users"][0]["user"]["token"]
    with plugged(token) as kube:
        assert kube.get(Namespace, "default")["metadata"]["name"] == "default"
    with plugged("wrong") as refused_kube, pytest.raises(ApiError) as refused:
        refused_kube.get(Namespace, "default")
    assert refused.value.status == 401


def test_a_kubeconfig_naming_a_missing_certificate_file_says_which(tmp_path, testbed):
    config = json.loads(testbed.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["certificate-authority"] = "nowhere/ca.crt"
    broken = tmp_path / "kubeconfig"
    broken.write_text(json.dumps(config))
    with pytest.raises(Dl2Error, match=r"certificate-authority: .*nowhere/ca.crt not found"):
        Kube.from_kubeconfig(broken)


def test_cli_up_status_down(tmp_path, testbed):
    """A second testbed through the CLI (binaries from the cache): up, status, kubeconfig, down, nothing left."""
    params = params_file(tmp_path)
    folder = tmp_path / "bed"

    def dl2(*args):
        done = subprocess.run([sys.executable, "-m", "dl2.cli", "testbed", *args, f"--folder={folder}"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    up = json.loads(dl2("up", "--local", f"--preset={PRESET.name}", f"--params={params}"))
    assert up["nodes"] == PRESET.num_nodes and up["timings"]["build_s"] == 0.0
    status = json.loads(dl2("status"))
    assert set(status["processes"]) == {"etcd", "kube-apiserver", "kwok"} and all(status["processes"].values())
    assert dl2("kubeconfig").strip() == up["kubeconfig"]
    pids = json.loads((folder / "testbed.json").read_text())["pids"].values()
    stopped = json.loads(dl2("down"))["stopped"]
    assert sorted(stopped) == ["etcd", "kube-apiserver", "kwok"]
    assert not any(Path(f"/proc/{pid}").exists() and str(folder) in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
                   for pid in pids)
    failed = subprocess.run([sys.executable, "-m", "dl2.cli", "testbed", "status", f"--folder={folder}"],
                            capture_output=True, text=True)
    assert failed.returncode == 2 and "no testbed in" in failed.stderr


def test_without_go_the_build_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("DL2_TESTBED_CACHE", str(tmp_path / "cache"))
    with pytest.raises(Dl2Error, match="install Go"):
        build.ensure_binaries()


def test_a_failed_build_names_its_log(monkeypatch, tmp_path):
    fake_go = tmp_path / "go"
    fake_go.write_text("#!/bin/sh\n[ \"$1\" = version ] && echo 'go version fake' && exit 0\necho 'compile error' >&2\nexit 1\n")
    fake_go.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DL2_TESTBED_CACHE", str(tmp_path / "cache"))
    with pytest.raises(Dl2Error, match=r"building etcd failed \(exit 1\); see .*build\.log"):
        build.ensure_binaries(log=lambda _: None)
    log = next((tmp_path / "cache").glob("*/build.log"))
    assert "compile error" in log.read_text()
