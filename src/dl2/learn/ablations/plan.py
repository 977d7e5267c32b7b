"""Planning an ablation axis: its cells, each a set of overrides of the `learn`, `pretrain` and `finetune`
sections, checked and typed as the stages check theirs.

`params.yaml`'s `ablations` section holds the axes and their groups. A cell's sections are the main ones,
then the scale's (`ablations.scales[scale]`), then the axis's own `base`, then the axis's own budget at
that scale (`scales[scale]` inside the axis, for an axis that needs another training length than the
others), then the cell's overrides; the cell also names the run of `RUNS` it trains: `sl-rl` (DL2, the
default), `rl-only`, `offline-rl` or `sl-only` (the pretrained policy alone). Every cell runs once per
seed in `ablations.seeds`.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dl2.config import Checked, bounded, typed
from dl2.errors import Dl2Error
from dl2.learn.settings import RUNS, LearnerSettings, LearnSettings, PretrainConfig, finetune_plan, learn_settings, pretrain_config
from dl2.workload.presets import Preset

SECTIONS = ("learn", "pretrain", "finetune")


@dataclass(frozen=True)
class AblationSettings(Checked):
    """The `ablations` section (its `groups` may hold only the group a stage runs)."""

    scale: str  # a key of `scales`
    seeds: tuple[int, ...] = bounded(at_least=0)
    workers: int = bounded(at_least=0)  # cells trained at once (0: one per CPU core; 1: in the stage's own process)
    scales: dict  # scale -> overrides of the learn, pretrain and finetune sections
    groups: dict  # group -> its axes
    axes: dict  # axis -> {base, reference, cells}

    def __post_init__(self):
        super().__post_init__()
        if self.scale not in self.scales:
            raise Dl2Error(f"scale: expected one of {', '.join(self.scales) or 'the keys of ablations.scales'}, got {self.scale!r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise Dl2Error(f"seeds: expected distinct seeds, got {list(self.seeds)}")


@dataclass(frozen=True)
class Cell:
    """One cell of an axis: its label, the run it trains, its sections after every override, typed."""

    axis: str
    label: str
    run: str
    params: dict  # learn, pretrain, finetune sections after every override (logged to MLflow)
    settings: LearnSettings
    pretrain: PretrainConfig
    finetune: LearnerSettings

    def digest(self, seed: int) -> str:
        """Identifies what this cell computes with `seed`: a stored result with another digest is stale. It
        hashes the typed settings the cell trains with (network overrides that repeat the network's own
        values dropped), so keys that change only how runs are scheduled (`finetune.workers`, `runs`,
        `seeds`) leave stored results valid."""
        text = repr((self.run, self.settings.canonical(), self.pretrain, self.finetune, seed))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AblationPlan:
    axis: str
    cells: tuple[Cell, ...]
    reference: str  # the label of the cell every other is compared with (full DL2)
    seeds: tuple[int, ...]


def ablation_settings(values: Mapping[str, Any], where: str) -> AblationSettings:
    return typed(AblationSettings, values, where, "ablations")


def group_plans(ablations: AblationSettings, group: str, sections: Mapping[str, Any], presets: Mapping[str, Preset],
                where: str) -> list[AblationPlan]:
    """The plans of the axes one `ablate` stage runs (`ablations.groups[group]`), on the main `sections`."""
    if group not in ablations.groups:
        raise Dl2Error(f"{where}: ablations.groups: no group {group!r} (known: {', '.join(ablations.groups) or 'none'})")
    axes = ablations.groups[group]
    if not isinstance(axes, list) or not axes or any(a not in ablations.axes for a in axes):
        raise Dl2Error(f"{where}: ablations.groups.{group}: expected a list of axes of ablations.axes, got {axes!r}")
    return [plan_axis(ablations, axis, sections, presets, where) for axis in axes]


def plan_axis(ablations: AblationSettings, axis: str, sections: Mapping[str, Any], presets: Mapping[str, Preset],
              where: str) -> AblationPlan:
    """The cells of `axis`, each checked as the stages would check it (errors name the cell and key)."""
    if axis not in ablations.axes:
        raise Dl2Error(f"{where}: ablations.axes: no axis {axis!r} (known: {', '.join(ablations.axes) or 'none'})")
    spec = ablations.axes[axis] or {}
    cells_spec = spec.get("cells") or {}
    if not cells_spec:
        raise Dl2Error(f"{where}: ablations.axes.{axis}.cells: expected at least one cell")
    main = {name: copy.deepcopy(sections.get(name) or {}) for name in SECTIONS}
    base = _merge(main, ablations.scales[ablations.scale] or {}, f"{where}: ablations.scales.{ablations.scale}")
    base = _merge(base, spec.get("base") or {}, f"{where}: ablations.axes.{axis}.base")
    axis_scales = spec.get("scales") or {}
    if not isinstance(axis_scales, Mapping) or set(axis_scales) - set(ablations.scales):
        raise Dl2Error(f"{where}: ablations.axes.{axis}.scales: expected a mapping of scales of ablations.scales "
                       f"({', '.join(ablations.scales)}) to overrides, got {axis_scales!r}")
    base = _merge(base, axis_scales.get(ablations.scale) or {}, f"{where}: ablations.axes.{axis}.scales.{ablations.scale}")
    cells = []
    for label, overrides in cells_spec.items():
        at = f"ablations.axes.{axis}.cells.{label}"
        overrides = dict(overrides or {})
        run = overrides.pop("run", "sl-rl")
        if run not in RUNS:
            raise Dl2Error(f"{where}: {at}.run: expected one of {', '.join(RUNS)}, got {run!r}")
        cell = _merge(base, overrides, f"{where}: {at}")
        cells.append(Cell(axis, str(label), run, cell, learn_settings(cell["learn"], presets, where, f"{at}: learn"),
                          pretrain_config(cell["pretrain"], where, f"{at}: pretrain"),
                          finetune_plan(cell["finetune"], where, f"{at}: finetune").learner))
    reference = str(spec.get("reference", cells[0].label))
    if reference not in {c.label for c in cells}:
        raise Dl2Error(f"{where}: ablations.axes.{axis}.reference: {reference!r} is not one of the axis's cells")
    return AblationPlan(axis, tuple(cells), reference, ablations.seeds)


def _merge(base: Mapping[str, Any], overrides: Mapping[str, Any], where: str) -> dict:
    """`base` with the sections of `overrides` merged in, key by key."""
    out = copy.deepcopy(dict(base))
    for name, values in overrides.items():
        if name not in SECTIONS:
            raise Dl2Error(f"{where}: {name}: expected one of {', '.join(SECTIONS)} (or run)")
        if not isinstance(values, Mapping):
            raise Dl2Error(f"{where}.{name}: expected a mapping of {name} keys")
        out[name] = {**out.get(name, {}), **copy.deepcopy(dict(values))}
    return out
