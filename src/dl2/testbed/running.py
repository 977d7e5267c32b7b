"""What a backend is handed of the testbed running on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def connection(backend: str, folder: Path | None = None) -> dict[str, Any]:
    """What `dl2.backends.environments.training_environments(backend, ...)` needs of the running testbed that
    `backend` names (in `folder`, or its default): nothing for `sim`, the local testbed's `kubeconfig` for `k8s`,
    the kind cluster's `pods` for `kind`."""
    if backend == "k8s":
        from dl2.testbed import local

        return {"kubeconfig": local.load(folder).kubeconfig}
    if backend == "kind":
        from dl2.testbed import kind

        return {"pods": kind.pod_cluster(folder)}
    return {}
