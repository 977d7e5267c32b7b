"""Cluster and workload scenarios (DESIGN §4). A preset is data: the `presets` section of `params.yaml`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dl2.config import Checked, bounded, choice, default_params_path, load_params, section, typed
from dl2.errors import Dl2Error

SPEED_TABLES = ("public_release", "dev_snapshot", "testbed")  # testbed: profiled on kind (data/testbed)
NODE_CPU_SLOTS = 8
NODE_GPU_SLOTS = 8
SLOT_SECONDS = 1200.0


@dataclass(frozen=True)
class Preset(Checked):
    """A cluster and workload scenario (DESIGN §4). A node holds 8 CPU and 8 GPU slots and a slot lasts
    1200 s unless a preset says otherwise."""

    name: str
    num_nodes: int = bounded(at_least=1)
    num_jobs: int = bounded(at_least=1)
    max_arrivals: int = bounded(at_least=1)
    max_epochs: int = bounded(at_least=1)
    max_tasks: int = bounded(at_least=1)  # the most PS, and the most workers, one job may hold
    speed_table: str = choice(*SPEED_TABLES)  # which measurement file and demand set
    bucket_to_model: bool  # map Ali length buckets to models through the dev snapshot's table
    slot_seconds: float = bounded(above=0, default=SLOT_SECONDS)
    node_cpu: int = bounded(at_least=1, default=NODE_CPU_SLOTS)
    node_gpu: int = bounded(at_least=1, default=NODE_GPU_SLOTS)


def presets_from(params: Mapping[str, Any], where: str) -> dict[str, Preset]:
    """Every preset of a params mapping, checked."""
    raw = section(params, "presets", where)
    if not raw:
        raise Dl2Error(f"{where}: section 'presets' is empty")
    presets = {}
    for name, spec in raw.items():
        if not isinstance(spec, Mapping):
            raise Dl2Error(f"{where}: presets.{name}: expected a mapping of keys, got {spec!r}")
        presets[str(name)] = typed(Preset, spec, where, f"presets.{name}", name=str(name))
    return presets


def load_presets(path: str | Path | None = None) -> dict[str, Preset]:
    """All presets of a params file (default: the project's `params.yaml`), checked."""
    path = Path(path) if path is not None else default_params_path()
    return presets_from(load_params(path), str(path))


def get_preset(name: str, path: str | Path | None = None) -> Preset:
    """One preset by name; an unknown name lists the known ones."""
    return preset_named(name, load_presets(path))


def preset_named(name: str, presets: Mapping[str, Preset], key: str | None = None) -> Preset:
    """`presets[name]`, or an error naming `key` (where the name was given) and the known presets."""
    if name not in presets:
        where = f"{key}: " if key else ""
        raise Dl2Error(f"{where}unknown preset {name!r} (known: {', '.join(presets)})")
    return presets[name]
