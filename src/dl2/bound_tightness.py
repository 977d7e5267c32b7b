"""How tight the capacity-aware bound is (`dl2 bound tightness`): on small traces, the best schedule found by
any means, replayed in the real simulator, against the bound; and the bound on `dev`'s validation traces
beside the published DL2 and Optimus.

"Any means": every built-in heuristic, and a local search over schedules of one shape, `PriorityGreedy`:
jobs in a priority order, each given its target #PS and #workers, or else the fastest of its model's useful
configs (`dl2.capacity_bound.useful_configs`) that still fits, packed first-fit onto the nodes. The search
starts from arrival, shortest-first and random orders with every job at its fastest config, then swaps two
jobs or moves one job's target to another config, keeping a change that lowers the average JCT."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from dl2.backends.sim import simulate
from dl2.capacity_bound import capacity_bound, useful_configs
from dl2.config import load_params, section
from dl2.errors import Dl2Error
from dl2.learn.settings import learn_settings
from dl2.learn.workflow import scenario as learn_scenario
from dl2.learn.workflow import split_traces
from dl2.metrics import lower_bound_jct
from dl2.paths import write_json_atomic
from dl2.schedulers import policy_names
from dl2.schedulers.base import Allocation, Observation
from dl2.sim.scenario import Scenario
from dl2.workload.presets import Preset, get_preset, presets_from
from dl2.workload.traces import Trace, generate_trace

# small traces: `dev` with 8 jobs (its arrivals per slot, so its contention, on its own cluster and on a quarter
# of it) and `paper` with 8 jobs on a sixth of its cluster
SMALL = {"dev-8": ("dev", dict(num_jobs=8)), "dev-8-on-12": ("dev", dict(num_jobs=8, num_nodes=12)),
         "paper-8-on-16": ("paper", dict(num_jobs=8, num_nodes=16))}


class PriorityGreedy:
    """Every slot, jobs in `order` (job ids, first = most urgent) each get their `target` (#PS, #workers) if it
    fits beside those before them, else the fastest of `fallback` (per model, (#PS, #workers) by descending
    speed) that does; tasks go first-fit onto the nodes, bundles first."""

    name = "priority-greedy"

    def __init__(self, order: list[int], target: dict[int, tuple[int, int]], fallback: dict[int, list[tuple[int, int]]]):
        self.rank = {job: k for k, job in enumerate(order)}
        self.target = target
        self.fallback = fallback

    def schedule(self, obs: Observation) -> Allocation:
        alloc = obs.allocation()
        for j in sorted(range(len(obs.job_ids)), key=lambda j: self.rank[int(obs.job_ids[j])]):
            job = int(obs.job_ids[j])
            for ps, workers in [self.target[job], *self.fallback[int(obs.models[j])]]:
                if _place(alloc, j, ps, workers):
                    break
        return alloc


def _place(alloc: Allocation, j: int, ps: int, workers: int) -> bool:
    """Place #PS and #workers of job `j` first-fit (bundles, then the rest), or nothing if they do not all fit."""
    saved = [a.copy() for a in (*alloc.jobs, *alloc.cluster)]
    bundles = min(ps, workers)
    tasks = ["bundle"] * bundles + ["ps"] * (ps - bundles) + ["worker"] * (workers - bundles)
    nodes = range(len(alloc.cluster.used))
    if all(any(alloc.place(j, role, node) for node in nodes) for role in tasks):
        return True
    for array, copy in zip((*alloc.jobs, *alloc.cluster), saved, strict=True):
        array[...] = copy
    return False


def best_found(trace: Trace, scenario: Scenario, evaluations: int, seed: int, bound_jct: np.ndarray | None = None) -> dict[str, float]:
    """The lowest average JCT of every built-in heuristic and of `evaluations` `PriorityGreedy` schedules
    (local search seeded `seed`), and which gave it. `bound_jct` (the capacity bound's per-job JCTs) adds a
    start: jobs by their completion in the LP (arrival + its JCT there)."""
    best = {name: float(simulate(trace, name, scenario).jct.mean()) for name in policy_names()}
    configs = {m: useful_configs(scenario, m) for m in range(scenario.catalog.num_models)}
    fallback = {m: [(int(c.ps[k]), int(c.workers[k])) for k in np.argsort(-c.speed, kind="stable")] for m, c in configs.items()}
    model = dict(zip(trace.job_id.tolist(), trace.model.tolist(), strict=True))
    fastest = {job: fallback[m][0] for job, m in model.items()}
    rng = np.random.default_rng(seed)
    ids = trace.job_id.tolist()
    alone = dict(zip(ids, lower_bound_jct(trace, scenario).tolist(), strict=True))
    starts = [sorted(ids, key=lambda j: (trace.arrival[ids.index(j)], j)), sorted(ids, key=lambda j: (alone[j], j))]
    if bound_jct is not None:
        done = dict(zip(ids, (trace.arrival + bound_jct).tolist(), strict=True))
        starts.append(sorted(ids, key=lambda j: (done[j], j)))
    starts += [list(rng.permutation(ids)) for _ in range(2)]

    def jct(order: list[int], target: dict[int, tuple[int, int]]) -> float:
        return float(simulate(trace, PriorityGreedy(order, target, fallback), scenario).jct.mean())

    scored = [(jct(o, fastest), o, fastest) for o in starts]
    value, order, target = min(scored, key=lambda s: s[0])
    for _ in range(max(evaluations - len(starts), 0)):
        new_order, new_target = list(order), dict(target)
        if rng.random() < 0.5 and len(ids) > 1:
            a, b = rng.choice(len(ids), 2, replace=False)
            new_order[a], new_order[b] = new_order[b], new_order[a]
        else:
            job = ids[int(rng.integers(len(ids)))]
            options = fallback[model[job]]  # by speed: step to a neighbour (half the time), else anywhere
            now = options.index(target[job])
            step = int(rng.choice([-1, 1])) if rng.random() < 0.5 else int(rng.integers(len(options))) - now
            new_target[job] = options[min(max(now + step, 0), len(options) - 1)]
        candidate = jct(new_order, new_target)
        if candidate < value:
            value, order, target = candidate, new_order, new_target
    best["search"] = value
    name = min(best, key=lambda k: best[k])
    return {"best_avg_jct": best[name], "best_by": name, **{f"{k}_avg_jct": v for k, v in best.items()}}


def small_preset(name: str) -> Preset:
    """A preset of `SMALL`: the preset it is made from with fewer jobs (and nodes)."""
    base, changes = SMALL[name]
    return replace(get_preset(base), name=name, **changes)


def tightness(num_traces: int = 10, evaluations: int = 200, seed: int = 0) -> dict:
    """Per small preset and trace: the capacity-aware and contention-free bounds, the best schedule found and
    their ratios; per preset the mean and worst ratio."""
    out: dict = {"evaluations": evaluations, "seed": seed, "presets": {}}
    for name in SMALL:
        scenario = Scenario(small_preset(name))
        rows = []
        for k, s in enumerate(np.random.SeedSequence(seed).spawn(num_traces)):
            trace = generate_trace(scenario.preset, scenario.catalog, s)
            bound = capacity_bound(trace, scenario, label=f"{name} trace {k}")
            found = best_found(trace, scenario, evaluations, seed + k, bound.per_job)
            rows.append({"trace": k, "jobs": len(trace), "capacity_bound": bound.avg_jct,
                         "lower_bound": float(lower_bound_jct(trace, scenario).mean()), **found,
                         "best_over_capacity_bound": found["best_avg_jct"] / bound.avg_jct,
                         "solve_seconds": bound.solve_seconds})
        ratios = np.array([r["best_over_capacity_bound"] for r in rows])
        out["presets"][name] = {"preset": repr(scenario.preset), "traces": rows, "mean_best_over_bound": float(ratios.mean()),
                                "max_best_over_bound": float(ratios.max()),
                                "mean_bound_over_lower_bound": float(np.mean([r["capacity_bound"] / r["lower_bound"] for r in rows]))}
    return out


# the published evaluations (data/published/<preset>/results.csv) and the `learn.train_traces` their commands set
PUBLISHED = {"dev": 40, "paper": 40, "paper-large": 12}


def published_ratios(preset: str, published: Path, policies: tuple[str, ...] = ("dl2", "optimus", "drf")) -> dict:
    """The capacity bound on the validation traces of the published evaluation of `preset` (regenerated from
    `learn.seed` as evaluate drew them: `dl2.learn.workflow.split_traces`), beside each policy's published
    average JCT there (mean over training seeds). The traces are checked against the published contention-free
    bound first, so a drift in trace generation is an error, not a silent mismatch."""
    params = load_params()
    values = {**section(params, "learn", "params.yaml"), "preset": preset, "train_traces": PUBLISHED[preset]}
    settings = learn_settings(values, presets_from(params, "params.yaml"), "params.yaml")
    scenario = learn_scenario(settings)
    _, traces = split_traces(settings, scenario)
    results_csv = published / preset / "results.csv"
    results = pd.read_csv(results_csv)
    jct = results.groupby(["policy", "trace"]).avg_jct.mean()
    published_bound = results.groupby("trace").lower_bound.first()
    rows = []
    for k, trace in enumerate(traces):
        alone = float(lower_bound_jct(trace, scenario).mean())
        if not np.isclose(alone, published_bound[k], rtol=1e-12):
            raise Dl2Error(f"{results_csv}: trace {k}'s lower bound is {published_bound[k]}, the regenerated trace's {alone}")
        bound = capacity_bound(trace, scenario, label=f"{preset} validation trace {k}")
        rows.append({"trace": k, "capacity_bound": bound.avg_jct, "lower_bound": alone, "solve_seconds": bound.solve_seconds,
                     "variables": bound.variables} | {f"{p}_avg_jct": float(jct[(p, k)]) for p in policies})
    mean_bound = float(np.mean([r["capacity_bound"] for r in rows]))
    return {"traces": rows, "capacity_bound_mean": mean_bound,
            "lower_bound_mean": float(np.mean([r["lower_bound"] for r in rows])),
            # as metrics.json divides: the mean average JCT over the mean bound
            "ratio_to_capacity_bound": {p: float(np.mean([r[f"{p}_avg_jct"] for r in rows])) / mean_bound for p in policies},
            "ratio_to_lower_bound": {p: float(np.mean([r[f"{p}_avg_jct"] for r in rows])) /
                                     float(np.mean([r["lower_bound"] for r in rows])) for p in policies}}


def bound_report(out: str | Path, num_traces: int, evaluations: int, seed: int, published: Path) -> dict:
    """`tightness` and `published_ratios` for every preset of `PUBLISHED`, with the date and dl2's commit; written
    as JSON to `out`."""
    report = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "command": f"dl2 bound tightness --traces {num_traces} "
              f"--evaluations {evaluations} --seed {seed}",
              "published": {name: published_ratios(name, published) for name in PUBLISHED},
              "small": tightness(num_traces, evaluations, seed)}
    write_json_atomic(out, report)
    return report
