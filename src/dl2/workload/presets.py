"""Cluster and workload scenarios (DESIGN §4, §7). A preset is data: the `presets` section of `params.yaml`.

Every preset belongs to a world (its `world` key): the PS/worker world of the DL2 paper (`ps-worker`, the
default) or the Pollux artifact's GPU cluster (`pollux`). Each world has its own preset type, and numbers
are comparable only between presets of one world."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from dl2.config import Checked, bounded, choice, default_params_path, load_params, section, typed
from dl2.errors import Dl2Error

SPEED_TABLES = ("public_release", "dev_snapshot", "testbed")  # testbed: profiled on kind (data/testbed)
PS_WORKER, POLLUX = "ps-worker", "pollux"
WORLDS = (PS_WORKER, POLLUX)
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
    restart_seconds: float = bounded(at_least=0, default=0.0)  # a job whose configuration changes trains nothing for this long
    # ... or this long if the new configuration only removes tasks (its surviving pods meet again, none starts);
    # None: restart_seconds
    rejoin_seconds: float | None = bounded(at_least=0, default=None)
    world: ClassVar[str] = PS_WORKER  # params.yaml's `world` key, which picks the type

    def __repr__(self) -> str:
        """The dataclass's repr, with `restart_seconds` only where it is not 0 and `rejoin_seconds` only where it is
        set: what hashes a preset's repr (ablation cells' digests, training checkpoints' tags) is unchanged for a
        preset without the keys."""
        hidden = {"restart_seconds": not self.restart_seconds, "rejoin_seconds": self.rejoin_seconds is None}
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if not hidden.get(f.name, False)]
        return f"{type(self).__qualname__}({', '.join(shown)})"


@dataclass(frozen=True)
class PolluxPreset(Checked):
    """A GPU cluster of the Pollux world (DESIGN §7): nodes of a few GPUs, rescheduled every interval; a
    job whose GPUs change stops for `restart_seconds`. The artifact's: 16 nodes of 4 GPUs, 60 s, 30 s."""

    name: str
    num_nodes: int = bounded(at_least=1)
    gpus_per_node: int = bounded(at_least=1, at_most=4)  # the throughput was measured on nodes of 4 GPUs
    interval_seconds: int = bounded(at_least=1)
    restart_seconds: int = bounded(at_least=0)
    world: ClassVar[str] = POLLUX


PRESET_TYPES = {PS_WORKER: Preset, POLLUX: PolluxPreset}
AnyPreset = Preset | PolluxPreset


def presets_from(params: Mapping[str, Any], where: str) -> dict[str, AnyPreset]:
    """Every preset of a params mapping, checked, each as its world's type."""
    raw = section(params, "presets", where)
    if not raw:
        raise Dl2Error(f"{where}: section 'presets' is empty")
    presets = {}
    for name, spec in raw.items():
        if not isinstance(spec, Mapping):
            raise Dl2Error(f"{where}: presets.{name}: expected a mapping of keys, got {spec!r}")
        world = spec.get("world", PS_WORKER)
        if world not in PRESET_TYPES:
            raise Dl2Error(f"{where}: presets.{name}.world: expected one of {', '.join(WORLDS)}, got {world!r}")
        values = {k: v for k, v in spec.items() if k != "world"}
        presets[str(name)] = typed(PRESET_TYPES[world], values, where, f"presets.{name}", name=str(name))
    return presets


def load_presets(path: str | Path | None = None) -> dict[str, AnyPreset]:
    """All presets of a params file (default: the project's `params.yaml`), checked."""
    path = Path(path) if path is not None else default_params_path()
    return presets_from(load_params(path), str(path))


def get_preset(name: str, path: str | Path | None = None, world: str | None = None) -> AnyPreset:
    """One preset by name (of `world`, if given); an unknown name lists the known ones."""
    return preset_named(name, load_presets(path), world=world)


def preset_named(name: str, presets: Mapping[str, AnyPreset], key: str | None = None, world: str | None = None) -> AnyPreset:
    """`presets[name]`, or an error naming `key` (where the name was given) and the known presets; with
    `world`, a preset of another world is an error too."""
    where = f"{key}: " if key else ""
    if name not in presets:
        raise Dl2Error(f"{where}unknown preset {name!r} (known: {', '.join(presets)})")
    if world is not None and presets[name].world != world:
        fitting = [n for n, p in presets.items() if p.world == world]
        raise Dl2Error(f"{where}preset {name!r} is of the {presets[name].world} world, this needs one of the {world} world "
                       f"(known: {', '.join(fitting) or 'none'})")
    return presets[name]
