"""Generalisation: trained policies on traces unlike those they were trained on (issue 19).

A *shift* changes one thing about the validation traces: their arrival pattern (`arrivals-google`),
the load (`load-200pct`: the same jobs arriving twice as fast; `load-50pct`: half as fast), or the cluster
and workload size (`cluster-dev`: another preset's nodes, jobs and arrival cap, with the policy's own
speed table, job lengths and task limit, so the policy can still act). Names carry no dots: they are
DVC metric keys and MLflow metric names. Every shift draws from the
validation traces' own seeds, so no trace of any shift was trained on, and the unshifted row
(`own`) is the stage's validation result itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from dl2.errors import Dl2Error
from dl2.learn.agent import DL2Policy
from dl2.learn.rollout import run_policy
from dl2.learn.settings import LearnSettings
from dl2.metrics import lower_bound_jct
from dl2.schedulers.builtin import simulate_builtin
from dl2.sim.scenario import Scenario
from dl2.workload.presets import Preset
from dl2.workload.traces import ARRIVAL_PATTERNS, Trace, generate_trace

OWN = "own"
HEURISTICS = ("drf", "optimus")  # beside the learned policies: the teacher and the strongest heuristic


@dataclass(frozen=True)
class Shift:
    """One way the test traces differ from the training traces (`OWN`: not at all)."""

    name: str
    arrivals: str | None = None  # another arrival pattern
    load: float = 1.0  # jobs arrive this many times as fast
    cluster: Preset | None = None  # another preset's cluster and workload size


def shifts(arrivals: Sequence[str], loads: Sequence[float], clusters: Sequence[Preset], own: LearnSettings) -> list[Shift]:
    """`OWN`, then one shift per other arrival pattern, load factor and cluster, in that order; the
    training distribution's own values are left out (they would repeat `OWN`)."""
    for pattern in arrivals:
        if pattern not in ARRIVAL_PATTERNS:
            raise Dl2Error(f"generalisation arrivals: expected one of {', '.join(ARRIVAL_PATTERNS)}, got {pattern!r}")
    for load in loads:
        if not load > 0:
            raise Dl2Error(f"generalisation loads: expected factors above 0, got {load!r}")
    found = [Shift(OWN)]
    found += [Shift(f"arrivals-{a}", arrivals=a) for a in arrivals if a != own.arrivals]
    found += [Shift(f"load-{round(100 * load)}pct", load=float(load)) for load in loads if load != 1]
    found += [Shift(f"cluster-{p.name}", cluster=p) for p in clusters if p.name != own.preset.name]
    return found


def with_load(trace: Trace, factor: float) -> Trace:
    """`trace` with its jobs arriving `factor` times as fast (arrival slot // factor, rounded down)."""
    return replace(trace, arrival=np.floor(trace.arrival / factor).astype(np.int64))


def shifted_world(shift: Shift, settings: LearnSettings, validation: Sequence[Trace], validation_seeds: Sequence,
                  scenario: Scenario) -> tuple[list[Trace], Scenario]:
    """The traces and scenario of `shift`: the validation traces moved by it, drawn from their own seeds."""
    if shift.cluster is None and shift.arrivals is None:
        return [with_load(t, shift.load) for t in validation] if shift.load != 1 else list(validation), scenario
    preset = scenario.preset
    if shift.cluster is not None:
        size = shift.cluster
        preset = replace(preset, num_nodes=size.num_nodes, num_jobs=size.num_jobs, max_arrivals=size.max_arrivals)
    world = Scenario(preset, scenario.options)
    traces = [generate_trace(preset, world.catalog, s, arrivals=shift.arrivals or settings.arrivals) for s in validation_seeds]
    return traces, world


def evaluate_shifts(learned: Mapping[str, Mapping[int, DL2Policy]], heuristics: Sequence[str], shift_list: Sequence[Shift],
                    settings: LearnSettings, validation: Sequence[Trace], validation_seeds: Sequence,
                    scenario: Scenario, progress=None) -> pd.DataFrame:
    """One row per (shift, policy, training seed, trace): the greedy average JCT and the lower bound. Learned
    policies run greedily; heuristics are deterministic and get seed -1. `progress(shift)` hears of each
    shift as it starts."""
    rows = []
    for shift in shift_list:
        if progress is not None:
            progress(shift.name)
        traces, world = shifted_world(shift, settings, validation, validation_seeds, scenario)
        bound = np.array([lower_bound_jct(t, world).mean() for t in traces])
        runs = [(name, -1, np.array([simulate_builtin(t, name, world).jct.mean() for t in traces])) for name in heuristics]
        runs += [(name, seed, run_policy(policy, traces, world, greedy=True).avg_jct)
                 for name, policies in learned.items() for seed, policy in policies.items()]
        rows += [{"shift": shift.name, "policy": name, "seed": seed, "trace": i, "avg_jct": float(j), "lower_bound": float(b)}
                 for name, seed, jct in runs for i, (j, b) in enumerate(zip(jct, bound))]
    return pd.DataFrame(rows)


def shift_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per shift and policy: the mean average JCT (over traces, then training seeds), its sd over seeds, the
    ratio to the lower bound and the gain over Optimus on the same traces (where Optimus ran)."""
    per_seed = results.groupby(["shift", "policy", "seed"], sort=False).agg(avg_jct=("avg_jct", "mean"),
                                                                            bound=("lower_bound", "mean"))
    table = per_seed.groupby(["shift", "policy"], sort=False).agg(
        avg_jct=("avg_jct", "mean"), seed_sd=("avg_jct", "std"), seeds=("avg_jct", "size"), bound=("bound", "mean")).reset_index()
    table["seed_sd"] = table.seed_sd.fillna(0.0)
    table["ratio_to_bound"] = table.avg_jct / table.bound
    optimus = table[table.policy == "optimus"].set_index("shift").avg_jct
    if len(optimus):
        table["gain_vs_optimus"] = 1 - table.avg_jct / table["shift"].map(optimus)
    return table


def shift_metrics(table: pd.DataFrame) -> dict[str, dict[str, dict]]:
    """The table as DVC metrics: shift -> policy -> avg_jct, ratio_to_bound (and gain_vs_optimus)."""
    keys = [k for k in ("avg_jct", "seed_sd", "ratio_to_bound", "gain_vs_optimus") if k in table]
    out: dict[str, dict[str, dict]] = {}
    for row in table.to_dict(orient="records"):
        out.setdefault(row["shift"], {})[row["policy"]] = {k: round(float(row[k]), 6) for k in keys}
    return out
