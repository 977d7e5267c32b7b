"""`dl2 bench --bound`: how long the capacity-aware bound (`dl2.capacity_bound`) takes, per preset of the
PS/worker world on one validation trace each (`learn.seed`'s first validation trace, as evaluate draws it):
the seconds to find the useful configs (once per preset and process), to build and solve the LP, the LP's
size and the horizon it needed."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from dl2.bench_record import finish, stamp
from dl2.capacity_bound import capacity_bound, useful_configs
from dl2.config import load_params, section
from dl2.learn.settings import learn_settings
from dl2.learn.workflow import scenario as learn_scenario
from dl2.learn.workflow import split_traces
from dl2.metrics import lower_bound_jct
from dl2.workload.presets import presets_from

PRESETS = ("dev", "paper", "paper-large", "testbed")


def bound_benchmark(out: str | Path, repeats: int = 3) -> dict:
    """Per preset: median seconds of `capacity_bound` (LP built and solved, configs already found) over `repeats`,
    HiGHS's own share, the configs' one-off seconds, the LP's variables and horizon; written as JSON to `out`."""
    params = load_params()
    results: dict = {**stamp(), "repeats": repeats, "presets": {}}
    for name in PRESETS:
        values = {**section(params, "learn", "params.yaml"), "preset": name}
        settings = learn_settings(values, presets_from(params, "params.yaml"), "params.yaml")
        scenario = learn_scenario(settings)
        trace = split_traces(settings, scenario)[1][0]
        start = time.perf_counter()
        configs = [useful_configs(scenario, m) for m in range(scenario.catalog.num_models)]
        config_seconds = time.perf_counter() - start
        wall, solve = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            bound = capacity_bound(trace, scenario, label=f"{name} validation trace 0")
            wall.append(time.perf_counter() - start)
            solve.append(bound.solve_seconds)
        results["presets"][name] = {"jobs": len(trace), "configs": sum(len(c.speed) for c in configs),
                                    "config_seconds": round(config_seconds, 4), "seconds": round(float(np.median(wall)), 4),
                                    "solve_seconds": round(float(np.median(solve)), 4), "variables": bound.variables,
                                    "horizon": bound.horizon, "capacity_bound": bound.avg_jct,
                                    "lower_bound": float(lower_bound_jct(trace, scenario).mean())}
    return finish(results, out)
