"""A Ray cluster of several nodes on this machine, each with its own raylet and CPUs, every port bound to
loopback on a free port (Ray's own `ray.cluster_utils.Cluster`): what the Ray tests and `dl2 bench --ray`
run on. Nothing of it outlives `shutdown()` (or the `with` block)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Any


def loopback_ray() -> None:
    """Before Ray is imported: this process's Ray addresses stay on loopback (Ray otherwise rewrites
    127.0.0.1 to the machine's address) and its workers run in this environment (not a `uv run` of
    their own). Both are read when Ray is imported."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's switch for one-machine, loopback-only clusters
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_args(cpus: int, temp_dir: str, head: bool) -> dict[str, Any]:
    ports = {"dashboard_agent_listen_port": free_port(), "metrics_export_port": free_port(),
             "runtime_env_agent_port": free_port()}
    if head:
        ports |= {"gcs_server_port": free_port(), "include_dashboard": False, "temp_dir": temp_dir}
    return {"num_cpus": cpus, "node_ip_address": "127.0.0.1", **ports}


class LocalRayCluster:
    """`nodes` Ray nodes of `cpus` CPUs each on this machine; `address` is the head's."""

    def __init__(self, nodes: int, cpus: int = 1):
        loopback_ray()
        from ray.cluster_utils import Cluster

        self.cpus = cpus
        self.workers: list[Any] = []  # the nodes besides the head
        self.temp_dir = tempfile.mkdtemp(prefix="dl2-ray-")
        self._ray_tmpdir = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = self.temp_dir  # where Ray notes the current cluster (else /tmp/ray, maybe absent)
        os.makedirs(os.path.join(self.temp_dir, "ray"))
        try:
            self.cluster = Cluster(initialize_head=True, head_node_args=_node_args(cpus, self.temp_dir, head=True))
            for _ in range(nodes - 1):
                self.add_node()
        except BaseException:
            self.shutdown()
            raise

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_node(self) -> Any:
        """One more node, appended to `workers`; returns it (for `kill_node`)."""
        node = self.cluster.add_node(**_node_args(self.cpus, self.temp_dir, head=False))
        self.cluster.wait_for_nodes()
        self.workers.append(node)
        return node

    def kill_node(self, node: Any) -> None:
        """Kill `node`'s raylet and workers at once, as a machine that dies does."""
        self.cluster.remove_node(node, allow_graceful=False)
        if node in self.workers:
            self.workers.remove(node)

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        if getattr(self, "cluster", None) is not None:
            self.cluster.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if self._ray_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = self._ray_tmpdir

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
