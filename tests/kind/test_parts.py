"""The kind testbed's parts that need no cluster: the runc wrapper, the kind config, the image archives."""

from __future__ import annotations

import hashlib
import json
import tarfile

from dl2.testbed.kind import cluster, daemon, images


def test_the_runc_wrapper_drops_cap_sys_resource_then_runs_runc(tmp_path):
    fake_runc = tmp_path / "runc"
    fake_runc.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'args'}\n")
    fake_runc.chmod(0o755)
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(daemon._wrapper_text(str(fake_runc)))
    wrapper.chmod(0o755)
    caps = {kind: ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN"] for kind in ("bounding", "effective", "permitted")}
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"capabilities": caps}}))
    daemon.run([str(wrapper), "--root", "/run/x", "create", "--bundle", str(bundle), "box"])
    spec = json.loads((bundle / "config.json").read_text())
    assert all(c == ["CAP_CHOWN", "CAP_SYS_ADMIN"] for c in spec["process"]["capabilities"].values())
    assert (tmp_path / "args").read_text().split() == ["--root", "/run/x", "create", "--bundle", str(bundle), "box"]
    process = tmp_path / "process.json"  # docker exec --privileged
    process.write_text(json.dumps({"capabilities": caps}))
    daemon.run([str(wrapper), "exec", "--process", str(process), "box"])
    assert all("CAP_SYS_RESOURCE" not in c for c in json.loads(process.read_text())["capabilities"].values())


def test_the_kind_config_labels_the_workers_and_mounts_the_environment(tmp_path):
    mounts = cluster.mounts(tmp_path)
    assert mounts[0] == cluster.Mount(str(tmp_path / "shared"), cluster.SHARED_IN_NODE, False)
    assert all(m.read_only and m.host == m.path for m in mounts[1:]) and len(mounts) >= 3
    config = cluster.kind_config(2, mounts, default_cni=False)
    roles = [n["role"] for n in config["nodes"]]
    assert roles == ["control-plane", "worker", "worker"] and config["networking"]["disableDefaultCNI"]
    assert [n["labels"] for n in config["nodes"][1:]] == [{"dl2.io/pool": "dl2", "dl2.io/node-index": str(k)} for k in range(2)]
    assert all(len(n["extraMounts"]) == len(mounts) for n in config["nodes"])
    assert "disableDefaultCNI" not in cluster.kind_config(1, mounts, default_cni=True)["networking"]


def test_an_image_archive_is_what_docker_load_reads(tmp_path):
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF not really")
    layer = images._files_layer(tmp_path, {"pause": binary})
    image_id = images.write_archive(tmp_path / "pause.tar", "registry.k8s.io/pause:3.10.2", [layer], {"Entrypoint": ["/pause"]})
    with tarfile.open(tmp_path / "pause.tar") as archive:
        manifest = json.load(archive.extractfile("manifest.json"))
        config_bytes = archive.extractfile(manifest[0]["Config"]).read()
        layer_bytes = archive.extractfile(manifest[0]["Layers"][0]).read()
    assert manifest[0]["RepoTags"] == ["registry.k8s.io/pause:3.10.2"]
    assert hashlib.sha256(config_bytes).hexdigest() == image_id
    config = json.loads(config_bytes)
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer_bytes).hexdigest()}"]
    assert config["config"]["Entrypoint"] == ["/pause"]
    with tarfile.open(layer) as files:
        assert files.getmember("pause").mode == 0o755 and files.getmember("tmp").isdir()
