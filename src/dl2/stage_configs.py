"""Each pipeline stage's typed configuration, built from the keys of `params.yaml` that `dvc.yaml` declares
for it (`dl2.stages.load_stage` hands them over; a builder that reached for another key would find it
missing). One builder per notebook; errors name the file and the key."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dl2.config import Checked, bounded, checked, choice, section, typed
from dl2.distributed.executor import Executor
from dl2.errors import Dl2Error
from dl2.learn.ablations.plan import AblationPlan, ablation_settings, group_plans
from dl2.learn.pollux.decisions import VARIANTS
from dl2.learn.pollux.settings import PolluxTrainSettings
from dl2.learn.settings import FinetunePlan, FinetuneRuns, LearnSettings, PretrainConfig, finetune_plan, learn_settings, pretrain_config
from dl2.pollux.grid import Cell, load_name, plan
from dl2.pollux.policies import POLICIES as POLLUX_POLICIES
from dl2.schedulers.builtin import BUILTIN_POLICIES
from dl2.schedulers.names import check_policy
from dl2.workload.presets import POLLUX, PS_WORKER, PolluxPreset, Preset, preset_named, presets_from
from dl2.workload.traces import ARRIVAL_PATTERNS, LENGTH_PATTERNS


@dataclass(frozen=True)
class TracesParams(Checked):
    """The `traces` section."""

    presets: tuple[str, ...]
    num_traces: int = bounded(at_least=1)
    seed: int = bounded(at_least=0)
    arrivals: str = choice(*ARRIVAL_PATTERNS)
    lengths: str = choice(*LENGTH_PATTERNS)


@dataclass(frozen=True)
class BaselinesParams(Checked):
    """The `baselines` section."""

    policies: tuple[str, ...] = checked(check_policy, builtin=BUILTIN_POLICIES, classes=True)  # built-in heuristics or module:Class
    fine_grained_jct: bool


@dataclass(frozen=True)
class ReportParams(Checked):
    """The `report` section."""

    figure_dpi: int = bounded(at_least=20, at_most=600)


@dataclass(frozen=True)
class EvaluateParams(Checked):
    """The `evaluate` section."""

    heuristics: tuple[str, ...] = checked(check_policy, builtin=BUILTIN_POLICIES)
    # run on the kind testbed beside DL2 (finetune.backend: kind)
    testbed_heuristics: tuple[str, ...] = checked(check_policy, builtin=BUILTIN_POLICIES)
    testbed_traces: int = bounded(at_least=1)  # validation traces replayed on the kind testbed
    testbed_repeats: int = bounded(at_least=1)  # replays of each (policy, trace) on the testbed
    shift_traces: int = bounded(at_least=1)  # validation traces each policy also plays moved by every shift
    shift_arrivals: tuple[str, ...] = choice(*ARRIVAL_PATTERNS)  # the other arrival patterns
    shift_loads: tuple[float, ...] = bounded(above=0)  # load factors (2: jobs arrive twice as fast)
    shift_clusters: tuple[str, ...]  # presets whose cluster and workload size the policies also play


@dataclass(frozen=True)
class PolluxParams(Checked):
    """The `pollux` section: the Pollux world's Fig. 8a grid on the artifact's shipped workloads."""

    preset: str  # a preset of the pollux world
    policies: tuple[str, ...] = checked(check_policy, builtin=POLLUX_POLICIES, world=POLLUX)
    loads: tuple[float, ...]  # relative job loads (the artifact ships 0.5, 1.0, 1.5 and 2.0)
    workloads: tuple[int, ...] = bounded(at_least=1, at_most=8)
    seeds: tuple[int, ...] = bounded(at_least=0)  # a randomized policy (pollux) runs once per seed
    scale: str = choice("reduced", "full")  # reduced: every policy on the reduced_* cells only
    reduced_loads: tuple[float, ...]
    reduced_workloads: tuple[int, ...] = bounded(at_least=1, at_most=8)
    reduced_seeds: tuple[int, ...] = bounded(at_least=0)
    workers: int = bounded(at_least=0)  # cells run at once (0: `pool_size`)

    def __post_init__(self):
        super().__post_init__()
        for key in ("loads", "reduced_loads"):
            try:
                tuple(map(load_name, getattr(self, key)))
            except Dl2Error as exc:
                raise Dl2Error(f"{key}: {exc}") from None

    def cells(self) -> list[Cell]:
        """The grid's cells at this scale (`dl2.pollux.grid.plan`): the reduced_* ones at the reduced scale."""
        if self.scale == "reduced":
            return plan(self.policies, self.reduced_loads, self.reduced_workloads, self.reduced_seeds)
        return plan(self.policies, self.loads, self.workloads, self.seeds)


@dataclass(frozen=True)
class PolluxDl2Params(Checked):
    """The `pollux_dl2` section: DL2 trained and evaluated greedily in the Pollux world (issue 35)."""

    preset: str  # a preset of the pollux world
    scale: str = choice("reduced", "full")  # reduced: `reduced`'s keys replace `run`'s, `reduced_seeds` the seeds
    variants: tuple[str, ...] = choice(*VARIANTS)  # one training run per variant and seed
    seeds: tuple[int, ...] = bounded(at_least=0)  # one training run per variant and seed
    reduced_seeds: tuple[int, ...] = bounded(at_least=0)
    run: dict  # every key of `dl2.learn.pollux.settings.PolluxTrainSettings` but `variant`, at the full scale
    reduced: dict  # some of those keys, at the reduced scale


def pollux_train_settings(values: Mapping[str, Any], where: str, prefix: str, complete: bool) -> PolluxTrainSettings:
    """`PolluxTrainSettings` from a mapping of its keys (every one of them if `complete`), loads as numbers;
    errors name the file and `prefix.key`."""
    values = dict(values)
    if complete:
        missing = [f.name for f in dataclasses.fields(PolluxTrainSettings) if f.name not in values]
        if missing:
            raise Dl2Error(f"{where}: {prefix}.{missing[0]} is missing")
    if "eval_loads" in values:
        loads = values["eval_loads"]
        if not isinstance(loads, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in loads):
            raise Dl2Error(f"{where}: {prefix}.eval_loads: expected a list of relative loads, got {loads!r}")
        try:
            values["eval_loads"] = [load_name(float(x)) for x in loads]
        except Dl2Error as exc:
            raise Dl2Error(f"{where}: {prefix}.eval_loads: {exc}") from None
    return typed(PolluxTrainSettings, values, where, prefix)


def pool_size(workers: int, scale: str) -> int:
    """The processes a stage runs its cells in: `workers`, or for 0 one per core, but one (the stage's own) at the
    reduced scale, whose few cells take seconds each: a pool's processes would cost more to start (torch's
    imports, loading or compiling the same compiled code in each) than they save."""
    if workers:
        return workers
    return 1 if scale == "reduced" else os.cpu_count() or 1


@dataclass(frozen=True)
class TracesStage:
    presets: tuple[Preset, ...]
    traces: TracesParams


@dataclass(frozen=True)
class BaselinesStage:
    presets: tuple[Preset, ...]
    baselines: BaselinesParams


@dataclass(frozen=True)
class ReportStage:
    presets: tuple[str, ...]
    report: ReportParams


@dataclass(frozen=True)
class PretrainStage:
    learn: LearnSettings
    pretrain: PretrainConfig


@dataclass(frozen=True)
class FinetuneStage:
    learn: LearnSettings
    finetune: FinetunePlan
    executor: Executor


@dataclass(frozen=True)
class EvaluateStage:
    learn: LearnSettings
    runs: FinetuneRuns  # the fine-tuned models to evaluate, and where they were fine-tuned: on kind, they are also evaluated there
    evaluate: EvaluateParams
    shift_clusters: tuple[Preset, ...]  # evaluate.shift_clusters, resolved
    executor: Executor


@dataclass(frozen=True)
class AblateStage:
    group: str
    plans: tuple[AblationPlan, ...]  # one per axis of the group
    workers: int  # cells trained at once (on the local executor)
    executor: Executor


@dataclass(frozen=True)
class PolluxBaselinesStage:
    preset: PolluxPreset
    pollux: PolluxParams
    executor: Executor

    @property
    def workers(self) -> int:
        return pool_size(self.pollux.workers, self.pollux.scale)


@dataclass(frozen=True)
class PolluxDl2Stage:
    preset: PolluxPreset
    pollux_dl2: PolluxDl2Params
    settings: tuple[PolluxTrainSettings, ...]  # one per variant, at the stage's scale
    seeds: tuple[int, ...]  # at the stage's scale


@dataclass(frozen=True)
class ReproductionStage:
    report: ReportParams
    published: bool  # on the committed full-scale results (data/published) instead of this run's outputs
    ablation_scale: str | None  # the scale of this run's ablations (None on the published results)


def _traces(params: dict, where: str, name: str) -> TracesStage:
    traces = typed(TracesParams, section(params, "traces", where), where, "traces")
    return TracesStage(_presets(params, traces.presets, where), traces)


def _baselines(params: dict, where: str, name: str) -> BaselinesStage:
    baselines = typed(BaselinesParams, section(params, "baselines", where), where, "baselines")
    return BaselinesStage(_presets(params, _preset_names(params, where), where), baselines)


def _report(params: dict, where: str, name: str) -> ReportStage:
    return ReportStage(_preset_names(params, where), typed(ReportParams, section(params, "report", where), where, "report"))


def _preset_names(params: dict, where: str) -> tuple[str, ...]:
    """`traces.presets`, the presets whose traces a stage reads."""
    names = section(params, "traces", where).get("presets")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise Dl2Error(f"{where}: traces.presets: expected a list of preset names, got {names!r}")
    return tuple(names)


def _presets(params: dict, names: tuple[str, ...], where: str) -> tuple[Preset, ...]:
    """The presets `names` (`traces.presets`), checked like every preset of the `presets` section."""
    presets = presets_from(params, where)
    return tuple(preset_named(name, presets, f"{where}: traces.presets", world=PS_WORKER) for name in names)


def _learn(params: dict, where: str) -> LearnSettings:
    return learn_settings(section(params, "learn", where), presets_from(params, where), where)


def _pretrain(params: dict, where: str, name: str) -> PretrainStage:
    return PretrainStage(_learn(params, where), pretrain_config(section(params, "pretrain", where), where))


def _finetune(params: dict, where: str, name: str) -> FinetuneStage:
    return FinetuneStage(_learn(params, where), finetune_plan(section(params, "finetune", where), where),
                         _executor(params, where))


def _evaluate(params: dict, where: str, name: str) -> EvaluateStage:
    runs = typed(FinetuneRuns, section(params, "finetune", where), where, "finetune")
    evaluate = typed(EvaluateParams, section(params, "evaluate", where), where, "evaluate")
    presets = presets_from(params, where)
    clusters = tuple(preset_named(n, presets, f"{where}: evaluate.shift_clusters", world=PS_WORKER) for n in evaluate.shift_clusters)
    return EvaluateStage(_learn(params, where), runs, evaluate, clusters, _executor(params, where))


def _ablate(params: dict, where: str, name: str) -> AblateStage:
    group = name.split("@")[1]
    ablations = ablation_settings(section(params, "ablations", where), where)
    plans = group_plans(ablations, group, params, presets_from(params, where), where)
    return AblateStage(group, tuple(plans), pool_size(ablations.workers, ablations.scale), _executor(params, where))


def _executor(params: dict, where: str) -> Executor:
    return typed(Executor, section(params, "executor", where), where, "executor")


def _pollux_baselines(params: dict, where: str, name: str) -> PolluxBaselinesStage:
    pollux = typed(PolluxParams, section(params, "pollux", where), where, "pollux")
    preset = preset_named(pollux.preset, presets_from(params, where), f"{where}: pollux.preset", world=POLLUX)
    return PolluxBaselinesStage(preset, pollux, _executor(params, where))


def _pollux_dl2(params: dict, where: str, name: str) -> PolluxDl2Stage:
    section_ = typed(PolluxDl2Params, section(params, "pollux_dl2", where), where, "pollux_dl2")
    preset = preset_named(section_.preset, presets_from(params, where), f"{where}: pollux_dl2.preset", world=POLLUX)
    for key in ("run", "reduced"):
        if "variant" in getattr(section_, key):
            raise Dl2Error(f"{where}: pollux_dl2.{key}.variant: the variants are pollux_dl2.variants")
    variant = section_.variants[0]
    pollux_train_settings({**section_.run, "variant": variant}, where, "pollux_dl2.run", complete=True)
    pollux_train_settings(section_.reduced, where, "pollux_dl2.reduced", complete=False)
    full = section_.scale == "full"
    values = section_.run if full else {**section_.run, **section_.reduced}
    prefix = "pollux_dl2.run" if full else "pollux_dl2.reduced"
    settings = tuple(pollux_train_settings({**values, "variant": v}, where, prefix, complete=True) for v in section_.variants)
    return PolluxDl2Stage(preset, section_, settings, section_.seeds if full else section_.reduced_seeds)


def _reproduction(params: dict, where: str, name: str) -> ReproductionStage:
    report = typed(ReportParams, section(params, "report", where), where, "report")
    if name.endswith("-published"):
        return ReproductionStage(report, True, None)
    scale = section(params, "ablations", where).get("scale")
    if not isinstance(scale, str):
        raise Dl2Error(f"{where}: ablations.scale: expected a scale name, got {scale!r}")
    return ReproductionStage(report, False, scale)


BUILDERS: dict[str, Callable[[dict, str, str], Any]] = {  # notebook -> builder(params, file, stage name)
    "traces": _traces, "baselines": _baselines, "report": _report, "pretrain": _pretrain,
    "finetune": _finetune, "evaluate": _evaluate, "ablate": _ablate, "reproduction": _reproduction,
    "pollux-baselines": _pollux_baselines, "pollux-dl2": _pollux_dl2,
}
