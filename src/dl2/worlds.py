"""Worlds (DESIGN §7): a cluster-and-job model with its own preset type, trace format, simulator, built-in
policies and learning shape, behind one interface, so that `dl2 simulate`, `dl2 compare` and the stages
take any preset and run it in its world. A number compares only with numbers of the same world.

- `ps-worker`: the DL2 paper's world (DESIGN §3): jobs get parameter servers and workers each slot.
- `pollux`: the Pollux artifact's GPU cluster (`dl2.pollux`): jobs get GPUs every interval and restart
  when they change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dl2 import compare as ps_worker
from dl2.errors import Dl2Error
from dl2.learn.pollux.features import JOB_FEATURES as POLLUX_JOB_FEATURES
from dl2.pollux import compare as pollux
from dl2.pollux.apps import APP_NAMES
from dl2.pollux.policies import POLICIES as POLLUX_POLICIES
from dl2.pollux.workload import COLUMNS as WORKLOAD_COLUMNS
from dl2.pollux.workload import read_workload
from dl2.schedulers.builtin import BUILTIN_POLICIES
from dl2.schedulers.names import check_policy
from dl2.sim.scenario import Scenario, SimOptions
from dl2.workload.catalog import load_catalog
from dl2.workload.presets import POLLUX, PS_WORKER, AnyPreset, PolluxPreset, Preset
from dl2.workload.traces import COLUMNS as TRACE_COLUMNS
from dl2.workload.traces import read_trace


@dataclass(frozen=True)
class LearningShape:
    """What a learning environment of the world shows and decides: one decision adds one of `roles` to a
    job of the window (or stops), and each job is seen through `job_features`."""

    job_types: tuple[str, ...]
    roles: tuple[str, ...]
    job_features: tuple[str, ...]

    def num_actions(self, window: int) -> int:
        return len(self.roles) * window + 1


@dataclass(frozen=True)
class World:
    """A world: its preset type, trace format, built-in policies, learning shape, and how to run it."""

    name: str
    preset_type: type
    trace_columns: tuple[str, ...]
    policies: tuple[str, ...]  # built-in; a user's class (module:Class) runs too
    learning: LearningShape
    read_trace: Callable[[Path], Any]
    _compare: Callable[[Sequence[Path], Sequence[str], Any, Sequence[int], SimOptions, bool], ps_worker.Comparison]
    aggregate: Callable[[pd.DataFrame], pd.DataFrame]

    def compare(self, traces: Sequence[Path], policies: Sequence[str], preset: AnyPreset, seeds: Sequence[int] = (0,),
                options: SimOptions | None = None, progress: bool = True) -> ps_worker.Comparison:
        """Every policy on every trace of this world under `preset`: one row per run, per job, per slot or
        interval. `options` are the PS/worker simulator's; `seeds` seed randomized policies."""
        if not isinstance(preset, self.preset_type):
            raise Dl2Error(f"preset {preset.name!r} is of the {preset.world} world, not the {self.name} world")
        return self._compare(traces, policies, preset, seeds, options or SimOptions(), progress)


def _ps_worker(traces: Sequence[Path], policies: Sequence[str], preset: Preset, seeds: Sequence[int], options: SimOptions,
               progress: bool) -> ps_worker.Comparison:
    return ps_worker.compare(traces, policies, Scenario(preset, options), progress)


def _pollux(traces: Sequence[Path], policies: Sequence[str], preset: PolluxPreset, seeds: Sequence[int], options: SimOptions,
            progress: bool) -> ps_worker.Comparison:
    policies = [check_policy(policy, POLLUX_POLICIES, classes=True, world=POLLUX) for policy in policies]  # all before any runs
    tables = pollux.compare(traces, policies, preset, seeds, progress)
    return ps_worker.Comparison(tables.summary, tables.jobs, tables.intervals)


WORLDS = {
    PS_WORKER: World(
        PS_WORKER, Preset, TRACE_COLUMNS, BUILTIN_POLICIES,
        LearningShape(job_types=load_catalog().names, roles=("worker", "ps", "bundle"),
                      job_features=("job type", "slots since arrival", "remaining epochs", "dominant share", "workers", "ps")),
        lambda path: read_trace(path, load_catalog()), _ps_worker, ps_worker.aggregate),
    POLLUX: World(
        POLLUX, PolluxPreset, WORKLOAD_COLUMNS, POLLUX_POLICIES,
        LearningShape(job_types=APP_NAMES, roles=("gpu",),
                      job_features=POLLUX_JOB_FEATURES),
        read_workload, _pollux, pollux.aggregate),
}


def world_of(preset: AnyPreset) -> World:
    """The world a preset belongs to."""
    return WORLDS[preset.world]
