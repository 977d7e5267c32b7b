"""The learning stages' settings, typed from `params.yaml`'s `learn`, `pretrain` and `finetune` sections
(the ablation cells build theirs from overridden copies of the same sections)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dl2.config import Checked, bounded, choice, typed
from dl2.errors import Dl2Error
from dl2.learn.nets import NET_PRESETS
from dl2.learn.pretrain import PretrainConfig
from dl2.learn.trainer import RLConfig
from dl2.workload.presets import PS_WORKER, Preset, preset_named
from dl2.workload.traces import ARRIVAL_PATTERNS

RUNS = {  # name: (speed model the RL trains on, start from the pretrained policy)
    "sl-rl": ("measured", True),
    "rl-only": ("measured", False),
    "offline-rl": ("analytical", True),
}
BACKENDS = ("sim", "k8s", "kind")  # where fine-tuning trains (`dl2.backends.training_environments`)


@dataclass(frozen=True)
class LearnSettings(Checked):
    """The `learn` section: the world DL2 learns in, its network, and its traces."""

    preset: Preset
    window: int = bounded(at_least=1)
    network: str = choice(*NET_PRESETS)
    hidden: tuple[int, ...] | None = bounded(at_least=1)  # override the network's hidden layers
    one_hot: bool | None  # override the network's job-type encoding
    batch_norm: bool | None  # override the network's batch norm
    assign_bundle: bool  # every job gets one bundle before the policy acts (the authors' code)
    train_traces: int = bounded(at_least=1)
    validation_traces: int = bounded(at_least=1)  # never used for training
    seed: int = bounded(at_least=0)
    arrivals: str = choice(*ARRIVAL_PATTERNS)  # the arrival pattern of the training and validation traces
    speed_noise: float = bounded(at_least=0, below=1)  # true speeds off the speed model by up to this fraction
    epoch_error: float = bounded(at_least=0, below=1)  # the epochs schedulers are told off the true ones by up to this


@dataclass(frozen=True)
class RunSeeds(Checked):
    """Which fine-tuning runs of `RUNS`, once per seed (`finetune.runs`, `finetune.seeds`)."""

    runs: tuple[str, ...] = choice(*RUNS)
    seeds: tuple[int, ...] = bounded(at_least=0)

    def __post_init__(self):
        super().__post_init__()
        if len(set(self.seeds)) != len(self.seeds):
            raise Dl2Error(f"seeds: expected distinct seeds, got {list(self.seeds)}")


@dataclass(frozen=True)
class FinetunePlan(RunSeeds):
    """The `finetune` section: the runs and seeds, where they train, and the RL configuration."""

    backend: str = choice(*BACKENDS)
    workers: int = bounded(at_least=0)  # runs trained at once, each in its own process (simulator only; 0: one per core)
    config: RLConfig

    @property
    def processes(self) -> int:
        """Runs trained at once: `workers`, or one per core for 0."""
        return self.workers or os.cpu_count() or 1


PLAN_KEYS = ("runs", "seeds", "backend", "workers")


def learn_settings(values: Mapping[str, Any], presets: Mapping[str, Preset], where: str, name: str = "learn") -> LearnSettings:
    """The `learn` section (`values`), its preset resolved among `presets`."""
    if "preset" not in values:
        raise Dl2Error(f"{where}: {name}.preset is missing")
    preset = preset_named(values["preset"], presets, f"{where}: {name}.preset", world=PS_WORKER)
    return typed(LearnSettings, values, where, name, preset=preset)


def pretrain_config(values: Mapping[str, Any], where: str, name: str = "pretrain") -> PretrainConfig:
    return typed(PretrainConfig, values, where, name)


def finetune_plan(values: Mapping[str, Any], where: str, name: str = "finetune") -> FinetunePlan:
    """The `finetune` section: the plan's keys (`PLAN_KEYS`) and, from the others, the RL configuration."""
    if "seed" in values:
        raise Dl2Error(f"{where}: {name}.seed: use {name}.seeds, a list (one run per seed)")
    rl = typed(RLConfig, {k: v for k, v in values.items() if k not in PLAN_KEYS}, where, name, seed=0)
    return typed(FinetunePlan, {k: v for k, v in values.items() if k in PLAN_KEYS}, where, name, config=rl)
