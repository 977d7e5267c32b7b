"""Backends: where a scheduler's allocations are carried out, one slot at a time, and the one slot loop
(`loop`) that runs either: the simulator (`sim`) and a Kubernetes namespace (`kube`, with what its pods run:
`workloads`, `emulator`); the one observation builder and allocation check (`observe`); the environments
fine-tuning trains in on each (`environments`); and the schedulers every backend runs by name."""

from __future__ import annotations

from pathlib import Path

from dl2.schedulers.base import Scheduler
from dl2.schedulers.builtin import BUILTIN_POLICIES
from dl2.schedulers.names import MODEL_SUFFIX, check_policy
from dl2.schedulers.registry import get_scheduler


def load_scheduler(name: str) -> Scheduler:
    """A scheduler by name: a built-in heuristic, a user's class (`module:Class`, `file.py:Class`), or a
    saved DL2 model (`*.pt`, acting greedily, as `evaluate` reports it)."""
    name = check_policy(name, BUILTIN_POLICIES, classes=True, models=True)
    if name.lower().endswith(MODEL_SUFFIX):
        from dl2.learn.agent import DL2Scheduler  # torch, only for a model

        return DL2Scheduler.load(name, name=Path(name).stem)
    return get_scheduler(name)
