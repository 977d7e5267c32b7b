"""A real Ray cluster for these tests: a head and a second node, each its own raylet with 1 CPU, on
loopback and free ports (`dl2.distributed.local_cluster`), started once and shut down after them. Every
test here is bounded in time (pytest-timeout, the cluster's start included)."""

from __future__ import annotations

import pytest

from dl2.distributed.local_cluster import LocalRayCluster, loopback_ray

loopback_ray()  # before any test imports Ray
TEST_SECONDS = 900  # each test, its fixtures' setup included; they take at most about 70 s on this 2-core machine


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/ray_cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.timeout(TEST_SECONDS))


@pytest.fixture(scope="package")
def ray_cluster():
    with LocalRayCluster(nodes=2, cpus=1) as cluster:
        yield cluster


@pytest.fixture
def two_nodes(ray_cluster):
    """The cluster with its second node up (a test before may have killed it)."""
    if not ray_cluster.workers:
        ray_cluster.add_node()
    return ray_cluster
