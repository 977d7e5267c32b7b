"""The learning stages' settings, typed from `params.yaml`'s `learn`, `pretrain` and `finetune` sections (the
ablation cells build theirs from overridden copies of the same sections). No torch here: reading and
checking settings never loads it.

The `finetune` section holds the plan (which runs, seeds, where, how many at once) and the learner's keys:
those every learner reads (`LearnerSettings`), and each learner's own (`PPOSettings`, `ActorCriticSettings`).
It holds every learner's keys, so that an ablation cell switches the learner with `algorithm` alone; the
learner `algorithm` names reads its own, and the others' are checked as their learner checks them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from dl2.config import Checked, bounded, check_keys, checked, choice, typed
from dl2.errors import Dl2Error
from dl2.learn.architecture import NET_PRESETS
from dl2.schedulers.builtin import BUILTIN_POLICIES
from dl2.schedulers.names import check_policy
from dl2.workload.presets import PS_WORKER, Preset, preset_named
from dl2.workload.traces import ARRIVAL_PATTERNS


@dataclass(frozen=True)
class Run:
    """A way of training DL2 that the pipeline compares."""

    pretrained: bool  # starts from the pretrained policy
    speed_model: str | None  # the speed model RL fine-tunes on; None: no fine-tuning (the pretrained policy alone)


RUNS = {
    "sl-rl": Run(pretrained=True, speed_model="measured"),  # DL2
    "rl-only": Run(pretrained=False, speed_model="measured"),
    "offline-rl": Run(pretrained=True, speed_model="analytical"),
    "sl-only": Run(pretrained=True, speed_model=None),  # an ablation cell's run; `evaluate` always shows it
}
FINETUNE_RUNS = tuple(name for name, run in RUNS.items() if run.speed_model is not None)  # `finetune.runs`
BACKENDS = ("sim", "k8s", "kind")  # where fine-tuning trains (`dl2.backends.training_environments`)


def check_backend(name: Any, key: str = "finetune.backend") -> str:
    """`name` if fine-tuning can train there (`BACKENDS`), else a Dl2Error naming `key`."""
    if name not in BACKENDS:
        raise Dl2Error(f"{key}: expected one of {', '.join(BACKENDS)}, got {name!r}")
    return name


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

    def canonical(self) -> LearnSettings:
        """These settings with each network override that repeats its preset's value dropped: two settings
        that build the same network are then equal (`hidden: [128, 128]` on the per-job network is no override)."""
        preset = NET_PRESETS[self.network]
        return dataclasses.replace(self, **{key: None for key in ("hidden", "one_hot", "batch_norm")
                                            if getattr(self, key) == getattr(preset, key)})


@dataclass(frozen=True)
class PretrainConfig(Checked):
    """The `pretrain` section."""

    teacher: str = checked(check_policy, builtin=BUILTIN_POLICIES)  # a built-in heuristic: its decisions are recorded
    epochs: int = bounded(at_least=1)
    batch_size: int = bounded(at_least=1)
    lr: float = bounded(above=0)
    seed: int = bounded(at_least=0)
    eval_every: int = bounded(at_least=1)  # epochs between validation-JCT measurements
    label_smoothing: float = bounded(at_least=0, below=1)  # weight spread over the legal actions, so RL can still explore


@dataclass(frozen=True)
class LearnerSettings(Checked):
    """What every fine-tuning learner reads of the `finetune` section; each learner's settings add its own keys.
    A run's seed is not among them: each run of the plan has one (`finetune.seeds`)."""

    algorithm: ClassVar[str]  # the learner (`finetune.algorithm`)
    leaves_off: ClassVar[dict[str, tuple[Any, str]]]  # other learners' keys it needs at their off value: (value, why)

    updates: int = bounded(at_least=1)  # learner updates: actor-critic, one per `num_envs` completed slots; ppo, one per rollout
    num_envs: int = bounded(at_least=1)  # parallel clusters feeding one learner
    lr: float = bounded(at_least=0)
    lr_schedule: str = choice("constant", "linear")  # linear: decays to 0 at the last update
    entropy: float = bounded(at_least=0)
    batch_size: int = bounded(at_least=1)  # ppo: minibatch; actor-critic: replay batch
    critic: str = choice("slot", "td", "off")  # slot (authors' code) | td (paper) | off (moving-average baseline)
    gamma: float = bounded(at_least=0, at_most=1)
    validate_every: int = bounded(at_least=1)
    checkpoint_every: int = bounded(at_least=1)
    select_traces: int = bounded(at_least=0)  # held-out traces to keep the best validated weights on (0: the last weights)


@dataclass(frozen=True)
class PPOSettings(LearnerSettings):
    """dl2's own learner (`algorithm: ppo`, `dl2.learn.ppo`): per-decision credit, learned on-policy."""

    algorithm: ClassVar[str] = "ppo"
    leaves_off: ClassVar[dict[str, tuple[Any, str]]] = {
        "exploration": ("off", "learns on-policy"), "replay": ("off", "learns on-policy"),
        "reward": ("slot", "credits each decision itself")}

    shaping: str = choice("off", "env", "analytical")  # potential from no model | the training world's speeds | analytical
    gae_lambda: float = bounded(at_least=0, at_most=1)
    clip: float = bounded(above=0)
    ppo_epochs: int = bounded(at_least=1)  # passes over each rollout
    rollout_length: int = bounded(at_least=1)  # decisions per environment per update


@dataclass(frozen=True)
class ActorCriticSettings(LearnerSettings):
    """The paper's learner (`algorithm: actor-critic`, `dl2.learn.actor_critic`): the slot's reward, experience
    replay, job-aware exploration."""

    algorithm: ClassVar[str] = "actor-critic"
    leaves_off: ClassVar[dict[str, tuple[Any, str]]] = {"shaping": ("off", "does not shape rewards")}

    reward: str = choice("slot", "job")  # every decision gets the slot's reward | job: its job's share
    replay: str = choice("off", "uniform", "prioritized")
    replay_size: int = bounded(at_least=1)
    learn_start: int = bounded(at_least=1)  # decisions buffered before the first update
    exploration: str = choice("off", "paper", "code", "epsilon")
    learn_rule_actions: bool  # the policy gradient also follows the actions exploration chose (the authors' code)
    epsilon: float = bounded(at_least=0, below=1)


LEARNER_SETTINGS: dict[str, type[LearnerSettings]] = {cls.algorithm: cls for cls in (ActorCriticSettings, PPOSettings)}
ALGORITHMS = tuple(LEARNER_SETTINGS)


@dataclass(frozen=True)
class FinetuneRuns(Checked):
    """Which fine-tuning runs of `RUNS`, once per seed, and where they train (`finetune.runs`, `seeds`, `backend`)."""

    runs: tuple[str, ...] = choice(*FINETUNE_RUNS)
    seeds: tuple[int, ...] = bounded(at_least=0)
    backend: str = checked(check_backend)

    def __post_init__(self):
        super().__post_init__()
        if len(set(self.seeds)) != len(self.seeds):
            raise Dl2Error(f"seeds: expected distinct seeds, got {list(self.seeds)}")


@dataclass(frozen=True)
class FinetunePlan(FinetuneRuns):
    """The `finetune` section: the runs, their seeds and where they train, how many at once, and the learner."""

    workers: int = bounded(at_least=0)  # runs trained at once, each in its own process (simulator only; 0: one per core)
    learner: LearnerSettings

    @property
    def processes(self) -> int:
        """Runs trained at once: `workers`, or one per core for 0."""
        return self.workers or os.cpu_count() or 1


PLAN_KEYS = tuple(f.name for f in dataclasses.fields(FinetunePlan) if f.name != "learner")


def learn_settings(values: Mapping[str, Any], presets: Mapping[str, Preset], where: str, name: str = "learn") -> LearnSettings:
    """The `learn` section (`values`), its preset resolved among `presets`."""
    if "preset" not in values:
        raise Dl2Error(f"{where}: {name}.preset is missing")
    preset = preset_named(values["preset"], presets, f"{where}: {name}.preset", world=PS_WORKER)
    return typed(LearnSettings, values, where, name, preset=preset)


def pretrain_config(values: Mapping[str, Any], where: str, name: str = "pretrain") -> PretrainConfig:
    return typed(PretrainConfig, values, where, name)


def finetune_plan(values: Mapping[str, Any], where: str, name: str = "finetune") -> FinetunePlan:
    """The `finetune` section: the plan's keys (`PLAN_KEYS`) and the learner's settings."""
    return typed(FinetunePlan, {k: v for k, v in values.items() if k in PLAN_KEYS}, where, name,
                 learner=learner_settings(values, where, name))


def learner_settings(values: Mapping[str, Any], where: str, name: str = "finetune") -> LearnerSettings:
    """The settings of the learner `values["algorithm"]` names, from a `finetune` section (`values`; its plan's
    keys, `PLAN_KEYS`, are left to the plan). Every learner's keys must be there; the other learners' are
    checked as theirs are, and those that would turn on what this learner does not do must be off."""
    if "seed" in values:
        raise Dl2Error(f"{where}: {name}.seed: use {name}.seeds, a list (one run per seed)")
    if "algorithm" not in values:
        raise Dl2Error(f"{where}: {name}.algorithm is missing")
    algorithm = values["algorithm"]
    if algorithm not in LEARNER_SETTINGS:
        raise Dl2Error(f"{where}: {name}.algorithm: expected one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    keys = {cls: [f.name for f in dataclasses.fields(cls)] for cls in LEARNER_SETTINGS.values()}
    known = ["algorithm", *dict.fromkeys(key for names in keys.values() for key in names)]
    for key in values:
        if key not in known and key not in PLAN_KEYS:
            raise Dl2Error(f"{where}: {name}.{key}: unknown key (known: {', '.join([*PLAN_KEYS, *known])})")
    chosen = LEARNER_SETTINGS[algorithm]
    settings = typed(chosen, {k: v for k, v in values.items() if k in keys[chosen]}, where, name)
    for other in LEARNER_SETTINGS.values():
        if other is not chosen:  # its own keys, as it would check them
            check_keys(other, values, [k for k in keys[other] if k not in keys[chosen]], where, name)
    for key, (off, why) in chosen.leaves_off.items():
        if values[key] != off:
            raise Dl2Error(f"{where}: {name}.{key}: algorithm {algorithm} {why}, set {key}: {off} (got {values[key]!r})")
    return settings
