"""The scoring suite, fixed and versioned: exactly which traces, workloads, loads and seeds `dl2 score` runs.

A score compares only with scores of the same `SUITE_VERSION`: raise it whenever anything here changes.

- PS/worker world: each preset's held-out validation traces exactly as the `evaluate` stage drew them for the
  published run of that preset (`data/published/<preset>/`: the same `learn` settings, so the same 10 traces),
  on the same simulator options (a bundle per job before the policy acts, measured speeds, at most 2000 slots).
  `paper`, `dev` and `paper-large` are the presets with a published evaluation (DL2 is ranked from it); all
  three together take a heuristic about a second, so the suite keeps all.
- Pollux world: the artifact's 8 workloads at its 4 loads (the published grid, `data/published/pollux/`); a
  randomized policy runs once per seed.
- kind (`--kind` only): the example trace, 3 jobs on the testbed's 3 workers, once.
"""

from __future__ import annotations

from dataclasses import dataclass

from dl2.config import load_params
from dl2.learn.settings import LearnSettings, learn_settings
from dl2.learn.workflow import scenario, split_traces
from dl2.paths import PACKAGE_DIR
from dl2.pollux.grid import Cell
from dl2.sim.scenario import Scenario
from dl2.workload.presets import load_presets
from dl2.workload.traces import Trace

SUITE_VERSION = 1


@dataclass(frozen=True)
class PsWorkerPart:
    """One PS/worker preset's validation traces: the `learn` settings that draw them (`split_traces`)."""

    preset: str
    train_traces: int  # the traces drawn before the validation ones, as in the published run
    validation_traces: int = 10
    seed: int = 7
    arrivals: str = "ali"

    @property
    def label(self) -> str:
        return f"ps-worker/{self.preset}"


PS_WORKER_PARTS = (PsWorkerPart("paper", 40), PsWorkerPart("dev", 40), PsWorkerPart("paper-large", 12))
POLLUX_PRESET = "pollux"
POLLUX_LOADS = ("0.5", "1.0", "1.5", "2.0")
POLLUX_WORKLOADS = tuple(range(1, 9))
SEEDS = (0, 1, 2)  # a randomized policy's seeds in either world (the published Pollux grid's)
KIND_PRESET = "testbed"
KIND_TRACE = PACKAGE_DIR.parents[1] / "deploy" / "kind-example" / "trace.csv"


def pollux_label(load: str) -> str:
    return f"pollux/load-{load}"


PARTS = tuple(p.label for p in PS_WORKER_PARTS) + tuple(pollux_label(load) for load in POLLUX_LOADS)
KIND_PART = "kind/example"  # with --kind only


def settings(part: PsWorkerPart) -> LearnSettings:
    """The `learn` settings that draw `part`'s traces: the project's, with the suite's trace keys."""
    values = {**load_params()["learn"], "preset": part.preset, "train_traces": part.train_traces,
              "validation_traces": part.validation_traces, "seed": part.seed, "arrivals": part.arrivals,
              "speed_noise": 0.0, "epoch_error": 0.0, "assign_bundle": True}
    return learn_settings(values, load_presets(), "the scoring suite")


def ps_worker_traces(part: PsWorkerPart) -> tuple[Scenario, list[Trace]]:
    """`part`'s scenario (as `evaluate` runs it) and validation traces."""
    learn = settings(part)
    sc = scenario(learn)
    return sc, split_traces(learn, sc)[1]


def pollux_cells(policy: str, seeds: tuple[int, ...], loads: tuple[str, ...] = POLLUX_LOADS) -> list[Cell]:
    """The Pollux part's runs of `policy` at `loads`: every workload, once per seed of `seeds`."""
    return [Cell(policy, load, w, seed) for load in loads for w in POLLUX_WORKLOADS for seed in seeds]


def describe() -> dict:
    """The suite as data, for score.json."""
    return {"version": SUITE_VERSION,
            "ps-worker": [{"preset": p.preset, "train_traces": p.train_traces, "validation_traces": p.validation_traces,
                           "seed": p.seed, "arrivals": p.arrivals} for p in PS_WORKER_PARTS],
            "pollux": {"preset": POLLUX_PRESET, "loads": list(POLLUX_LOADS), "workloads": list(POLLUX_WORKLOADS)},
            "seeds": list(SEEDS), "kind": {"preset": KIND_PRESET, "trace": KIND_TRACE.relative_to(PACKAGE_DIR.parents[1]).as_posix()}}
