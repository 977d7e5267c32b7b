"""The local control plane, started once for these tests (built from the Go module proxy on first use)."""

from __future__ import annotations

import pytest

from dl2.testbed import local as local_testbed


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/k8s/" in str(item.fspath):
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(autouse=True)
def mlflow_store(tmp_path, monkeypatch) -> str:
    """Each test's own MLflow store (`dl2 k8s-scheduler run` records its runs), never the repository's."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="package")
def testbed(tmp_path_factory):
    """Up for the tests of this package only, so it does not run beside the rest of the suite."""
    bed = local_testbed.up(tmp_path_factory.mktemp("testbed"), detach=False)  # dies with pytest, if killed
    yield bed
    local_testbed.down(bed.folder)


@pytest.fixture
def kube(testbed):
    client = testbed.kube()
    yield client
    client.close()
