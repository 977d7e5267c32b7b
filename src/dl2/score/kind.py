"""`dl2 score --kind`: the suite's kind trace replayed once on the kind testbed (`dl2 testbed up --kind` first)
under the scheduler, through the `evaluate` stage's testbed path (`dl2.sim_to_real.replay.evaluate_on_kind`),
beside the simulator on the testbed's profiled speed table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from dl2.score import suite
from dl2.score.candidate import Candidate
from dl2.sim.scenario import Scenario, SimOptions
from dl2.sim_to_real.replay import evaluate_on_kind
from dl2.workload.presets import PS_WORKER, get_preset
from dl2.workload.traces import read_trace

NAMESPACE = "dl2-score"


def kind_scenario() -> Scenario:
    """The kind part's scenario: the testbed preset (its profiled speeds), a bundle per job first, as the suite's
    other PS/worker parts."""
    return Scenario(get_preset(suite.KIND_PRESET, world=PS_WORKER), SimOptions(assign_bundle=True))


def score_on_kind(spec: str, candidate: Candidate, folder: Path | None = None,
                  log: Callable[[str], None] = print) -> pd.DataFrame:
    """The kind part's run (`RUN_COLUMNS`, and `avg_jct_sim`: the simulator's on the profiled table): `candidate`
    (named `spec`) on the kind trace once."""
    sc = kind_scenario()
    trace = read_trace(suite.KIND_TRACE, sc.catalog)
    learned = {candidate.name: {0: candidate.model}} if candidate.model is not None else {}
    heuristics = [] if candidate.model is not None else [spec]
    jobs, _ = evaluate_on_kind(learned, heuristics, [trace], sc, folder, namespace=NAMESPACE, log=log)
    return pd.DataFrame([{"part": suite.KIND_PART, "trace": suite.KIND_TRACE.stem, "seed": 0,
                          "avg_jct": float(jobs.jct_testbed.mean()), "avg_jct_sim": float(jobs.jct_sim.mean())}])
