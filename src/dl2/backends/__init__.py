"""Backends: where a scheduler's allocations are carried out, one slot at a time (the simulator in
`dl2.backends.sim`, a Kubernetes cluster in `dl2.k8s`); the schedulers every backend runs by name; and
the environments fine-tuning trains in on each (`finetune.backend`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dl2.errors import Dl2Error
from dl2.schedulers.base import Scheduler
from dl2.schedulers.builtin import BUILTIN_POLICIES
from dl2.schedulers.registry import get_scheduler

if TYPE_CHECKING:
    from dl2.learn.workflow import EnvFactory


def load_scheduler(name: str) -> Scheduler:
    """A scheduler by name: a built-in heuristic, a user's class (`module:Class`, `file.py:Class`), or a
    saved DL2 model (`*.pt`, acting greedily, as `evaluate` reports it)."""
    if name.lower().endswith(".pt"):
        from dl2.learn.agent import DL2Scheduler  # torch, only for a model

        return DL2Scheduler.load(name, name=Path(name).stem)
    if name.lower() not in BUILTIN_POLICIES and ":" not in name:
        raise Dl2Error(f"unknown policy {name!r} (known: {', '.join(BUILTIN_POLICIES)}, module:Class, or a saved DL2 model *.pt)")
    return get_scheduler(name)


def training_environments(backend: str, kubeconfig: str | Path | None = None,
                          kind_folder: str | Path | None = None) -> Callable[[str], EnvFactory]:
    """Where `finetune.backend` trains: `environments(run)` gives each run its environments. `k8s` uses
    `kubeconfig`, by default the running local testbed's (`dl2 testbed up --local`); `kind`, the kind testbed
    in `kind_folder` (default: `dl2 testbed up --kind`'s, or `DL2_KIND_FOLDER`)."""
    from dl2.learn.settings import BACKENDS
    from dl2.learn.workflow import simulator_environments

    if backend == "sim":
        return simulator_environments
    if backend == "k8s":
        from dl2.k8s import testbed
        from dl2.k8s.env import KubeEnvironments

        return KubeEnvironments(kubeconfig if kubeconfig is not None else testbed.load().kubeconfig)
    if backend == "kind":
        from dl2.k8s.env import KindEnvironments

        return KindEnvironments(kind_folder)
    raise Dl2Error(f"finetune.backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
