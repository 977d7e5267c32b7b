"""The kind testbed, brought up once for these tests and down after them (built offline on first use).

The cluster lives in its own folder (`DL2_KIND_TEST_FOLDER`, default `<testbed cache>/kind-tests`), apart
from a user's `dl2 testbed up --kind`; the folder persists, so its Docker daemon keeps the node image and
a later run starts warm. Every test here is marked `kind` (and `k8s`, so the fast tier leaves it out).
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from lightkube.resources.core_v1 import Namespace

from dl2.kube.client import Kube
from dl2.kube.resources import ensure_namespace
from dl2.testbed import build, kind
from dl2.testbed.kind.cluster import STATE_FILE
from dl2.workload.presets import load_presets

_names = itertools.count()


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/kind/" in str(item.fspath):
            item.add_marker(pytest.mark.kind)
            item.add_marker(pytest.mark.k8s)
    down = [item for item in items if item.name == "test_down_leaves_nothing_behind"]  # it takes the cluster down:
    if down:  # last of this package's tests
        items.remove(down[0])
        end = max(i for i, item in enumerate(items) if "tests/kind/" in str(item.fspath))
        items.insert(end + 1, down[0])


def test_folder() -> Path:
    return Path(os.environ.get("DL2_KIND_TEST_FOLDER") or build.cache_root() / "kind-tests")


@pytest.fixture(autouse=True)
def mlflow_store(tmp_path, monkeypatch) -> str:
    """Each test's own MLflow store (`dl2 k8s-scheduler run` records its runs), never the repository's."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="package")
def cluster():
    """Up for this package's tests; `test_down_leaves_nothing_behind` takes it down itself, else the finalizer does."""
    folder = test_folder()
    if (folder / STATE_FILE).is_file():  # a run that was killed left it up
        kind.down(folder)
    started = time.perf_counter()
    # the `testbed` preset's cluster: its workers' CPU slots (pods share the host: isolation has its own test)
    up = kind.up(folder, workers=3, cpu_slots=load_presets()["testbed"].node_cpu,
                 log=lambda m: print(f"kind: {m}", file=sys.stderr, flush=True))
    print(f"kind: up in {time.perf_counter() - started:.1f} s: {up.timings}", file=sys.stderr)
    yield up
    if (folder / STATE_FILE).is_file():
        kind.down(folder)


@pytest.fixture
def kube(cluster):
    client = cluster.kube()
    yield client
    client.close()


@pytest.fixture
def namespace(cluster, kube):
    """A fresh namespace; deleted after the test, with its folder in the shared volume."""
    name = f"kind-t{os.getpid()}-{next(_names)}"
    ensure_namespace(kube, name)
    yield name
    kube.delete(Namespace, name)
    shutil.rmtree(cluster.shared / name, ignore_errors=True)


def wait_for(what: str, check, timeout: float = 180.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(every)


def pod_log(kube: Kube, namespace: str, name: str) -> str:
    return "".join(kube.client.log(name, namespace=namespace))
