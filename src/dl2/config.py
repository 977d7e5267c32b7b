"""Typed configuration: cluster presets and simulation options, read from `params.yaml`.

A preset is data (DESIGN §4): the `presets` section of `params.yaml` holds them. Every value is checked
on load, and a bad one is reported with its file and key.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from dl2.errors import Dl2Error
from dl2.paths import repo_root

SPEED_TABLES = ("public_release", "dev_snapshot")
NODE_CPU_SLOTS = 8
NODE_GPU_SLOTS = 8


@dataclass(frozen=True)
class Preset:
    """A cluster and workload scenario (DESIGN §4)."""

    name: str
    num_nodes: int
    num_jobs: int
    max_arrivals: int
    max_epochs: int
    max_tasks: int  # the most PS, and the most workers, one job may hold
    speed_table: str  # which measurement file and demand set: public_release | dev_snapshot
    bucket_to_model: bool  # map Ali length buckets to models through the dev snapshot's table
    slot_seconds: float = 1200.0
    node_cpu: int = NODE_CPU_SLOTS
    node_gpu: int = NODE_GPU_SLOTS


_POSITIVE_INTS = ("num_nodes", "num_jobs", "max_arrivals", "max_epochs", "max_tasks", "node_cpu", "node_gpu")


def _check_preset(name: str, raw: Mapping[str, Any], where: str) -> Preset:
    known = {f.name for f in fields(Preset)} - {"name"}
    unknown = set(raw) - known
    if unknown:
        raise Dl2Error(f"{where}: presets.{name}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(known))})")
    values = dict(raw)
    for key in _POSITIVE_INTS:
        if key not in values and key in ("node_cpu", "node_gpu"):
            continue
        if key not in values:
            raise Dl2Error(f"{where}: presets.{name}.{key} is missing")
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise Dl2Error(f"{where}: presets.{name}.{key}: expected a positive integer, got {value!r}")
    if values.get("speed_table") not in SPEED_TABLES:
        raise Dl2Error(f"{where}: presets.{name}.speed_table: expected one of {SPEED_TABLES}, got {values.get('speed_table')!r}")
    if not isinstance(values.get("bucket_to_model"), bool):
        raise Dl2Error(f"{where}: presets.{name}.bucket_to_model: expected true or false, got {values.get('bucket_to_model')!r}")
    slot = values.get("slot_seconds", 1200.0)
    if isinstance(slot, bool) or not isinstance(slot, (int, float)) or slot <= 0:
        raise Dl2Error(f"{where}: presets.{name}.slot_seconds: expected a positive number, got {slot!r}")
    values["slot_seconds"] = float(slot)
    return Preset(name=name, **values)


def default_params_path() -> Path:
    return repo_root() / "params.yaml"


def load_params(path: str | Path | None = None) -> dict[str, Any]:
    """Read a params file (default: the project's `params.yaml`) as a dict, as YAML 1.2 like DVC, which
    rewrites it for `dvc exp run -S` (so `off` stays the string "off")."""
    path = Path(path) if path is not None else default_params_path()
    if not path.is_file():
        raise Dl2Error(f"{path}: params file not found")
    try:
        params = _parse_yaml(path.read_text())
    except UnicodeDecodeError:
        raise Dl2Error(f"{path}: not a YAML text file") from None
    except YAMLError as exc:
        raise Dl2Error(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(params, dict):
        raise Dl2Error(f"{path}: expected a mapping of sections at the top level")
    return copy.deepcopy(params)


@functools.lru_cache(maxsize=8)
def _parse_yaml(text: str) -> Any:
    """YAML 1.2, parsed once per distinct text (the pure-Python parser takes ~0.2 s for params.yaml)."""
    return YAML(typ="safe", pure=True).load(text)


def load_presets(path: str | Path | None = None) -> dict[str, Preset]:
    """All presets of a params file, checked."""
    path = Path(path) if path is not None else default_params_path()
    raw = load_params(path).get("presets")
    if not isinstance(raw, dict) or not raw:
        raise Dl2Error(f"{path}: section 'presets' is missing or empty")
    presets = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict):
            raise Dl2Error(f"{path}: presets.{name}: expected a mapping")
        presets[name] = _check_preset(str(name), spec, str(path))
    return presets


def get_preset(name: str, path: str | Path | None = None) -> Preset:
    """One preset by name; an unknown name lists the known ones."""
    presets = load_presets(path)
    if name not in presets:
        raise Dl2Error(f"unknown preset {name!r} (known: {', '.join(presets)})")
    return presets[name]


def _section(params: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    section = params.get(name)
    if not isinstance(section, dict):
        raise Dl2Error(f"{where}: section {name!r} is missing")
    return section


def _require(section: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in section:
        raise Dl2Error(f"{where} is missing")
    value = section[key]
    if isinstance(value, bool) and kind is not bool:
        raise Dl2Error(f"{where}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise Dl2Error(f"{where}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


@dataclass(frozen=True)
class TracesParams:
    """The `traces` stage: which presets, how many traces each, and how they are drawn."""

    presets: tuple[str, ...]
    num_traces: int
    seed: int
    arrivals: str
    lengths: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any], where: str = "params.yaml") -> "TracesParams":
        s = _section(params, "traces", where)
        presets = _require(s, "presets", list, f"{where}: traces.presets")
        num = _require(s, "num_traces", int, f"{where}: traces.num_traces")
        if num <= 0:
            raise Dl2Error(f"{where}: traces.num_traces: expected a positive integer, got {num}")
        seed = _require(s, "seed", int, f"{where}: traces.seed")
        if seed < 0:
            raise Dl2Error(f"{where}: traces.seed: expected an integer >= 0, got {seed}")
        from dl2.workload.traces import ARRIVAL_PATTERNS, LENGTH_PATTERNS

        arrivals = _require(s, "arrivals", str, f"{where}: traces.arrivals")
        if arrivals not in ARRIVAL_PATTERNS:
            raise Dl2Error(f"{where}: traces.arrivals: expected one of {ARRIVAL_PATTERNS}, got {arrivals!r}")
        lengths = _require(s, "lengths", str, f"{where}: traces.lengths")
        if lengths not in LENGTH_PATTERNS:
            raise Dl2Error(f"{where}: traces.lengths: expected one of {LENGTH_PATTERNS}, got {lengths!r}")
        return cls(tuple(presets), num, seed, arrivals, lengths)


@dataclass(frozen=True)
class BaselinesParams:
    """The `baselines` stage: which policies, and which JCT definition."""

    policies: tuple[str, ...]
    fine_grained_jct: bool

    @classmethod
    def from_params(cls, params: Mapping[str, Any], where: str = "params.yaml") -> "BaselinesParams":
        from dl2.schedulers import policy_names

        s = _section(params, "baselines", where)
        policies = _require(s, "policies", list, f"{where}: baselines.policies")
        for p in policies:
            if p not in policy_names() and ":" not in str(p):
                raise Dl2Error(f"{where}: baselines.policies: unknown policy {p!r} (known: {', '.join(policy_names())}, or module:Class)")
        fine = _require(s, "fine_grained_jct", bool, f"{where}: baselines.fine_grained_jct")
        return cls(tuple(policies), fine)
