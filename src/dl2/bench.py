"""`dl2 bench`: simulator throughput and time per trace per policy, for `paper` and `paper-large`."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np

from dl2.config import get_preset
from dl2.paths import write_json_atomic
from dl2.schedulers import policy_names
from dl2.sim.run import simulate
from dl2.sim.scenario import Scenario
from dl2.workload.traces import generate_trace

PRESETS = ("paper", "paper-large")


def run_benchmark(out: str | Path | None = None, repeats: int = 20, num_traces: int = 5) -> dict:
    """Median milliseconds per trace and slots per second, per preset and policy; written as JSON to `out`."""
    results: dict = {"machine": {"python": platform.python_version(), "processor": platform.machine()},
                     "repeats": repeats, "traces": num_traces, "presets": {}}
    for name in PRESETS:
        scenario = Scenario(get_preset(name))
        traces = [generate_trace(scenario.preset, scenario.catalog, s) for s in np.random.SeedSequence(0).spawn(num_traces)]
        per_policy = {}
        for policy in policy_names():
            simulate(traces[0], policy, scenario)  # compile / load from cache outside the timing
            times, slots = [], 0
            for trace in traces:
                for _ in range(repeats):
                    start = time.perf_counter()
                    result = simulate(trace, policy, scenario)
                    times.append(time.perf_counter() - start)
                slots += result.num_slots * repeats
            per_policy[policy] = {
                "ms_per_trace_median": 1e3 * float(np.median(times)),
                "ms_per_trace_p90": 1e3 * float(np.percentile(times, 90)),
                "slots_per_second": slots / float(np.sum(times)),
            }
        drf = per_policy["drf"]["ms_per_trace_median"]
        for policy, row in per_policy.items():
            row["time_vs_drf"] = row["ms_per_trace_median"] / drf
        results["presets"][name] = {"num_jobs": scenario.preset.num_jobs, "num_nodes": scenario.preset.num_nodes, "policies": per_policy}
    if out is not None:
        write_json_atomic(out, results)
    return results
