"""The report's sim-to-real section (DESIGN §6): the kind testbed's profiled speeds beside the authors' table, how
far the speeds the pods reached during whole traces are from the profile, and the testbed's JCTs beside the
simulator's predictions (on the profiled table) for the same traces and policies.

It reads the profile (`data/testbed`: `dl2 testbed profile`) and, where one ran, a testbed evaluation
(`evaluate` with `finetune.backend: kind`: `jobs.csv`, `slots.csv`; committed in `data/published/testbed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from dl2 import plots
from dl2.sim_to_real import profile as profiling
from dl2.sim_to_real import replay
from dl2.workload.catalog import load_catalog
from dl2.workload.speed import MeasuredSpeedModel

PROFILE_NOTE = ("Each job type's stand-in trained alone on the kind testbed at every (#PS, #workers) it allows, each "
                "measurement a fresh job, the speed counted between two checkpoints (start-up left out); sd and cv are "
                "over the repeats. The authors measured their real models on GPUs, so the absolute speeds do not compare: "
                "the figure sets each configuration's speed relative to (1 PS, 1 worker), ours measured and theirs as the simulator "
                "interpolates their table, which shows how each scales.")

GAP_NOTE = ("The same traces and policies on the kind testbed (pods that really train, slot by slot) and in the simulator "
            "on the profiled table. ratio: the testbed's average JCT over the simulator's. Per slot, the speed error sets "
            "the epochs the pods trained beside the table's epochs for the same #PS and #workers, in slots the "
            "configuration ran throughout and in those it started in (the pods' start-up, which the DL2 simulator "
            "does not model); a job's last slot is left out.")


@dataclass(frozen=True)
class SimToReal:
    """Everything the section shows."""

    spread: pd.DataFrame  # the profile per (model, configuration): mean speed, sd, cv over repeats
    relative: pd.DataFrame  # speeds relative to (1, 1), ours (each repeat) and the authors'
    jobs: pd.DataFrame  # per job: testbed and simulator JCT (empty without a testbed evaluation)
    slots: pd.DataFrame  # per slot and job: epochs trained and predicted

    @property
    def summary(self) -> pd.DataFrame:
        return replay.summary(self.jobs)

    @property
    def speed_error(self) -> pd.DataFrame:
        return replay.speed_error(self.slots)


def relative_speeds(profile: pd.DataFrame, authors_table: str = "public_release") -> pd.DataFrame:
    """Per model and configuration, the speed over the speed at (1, 1): each repeat of the testbed's profile
    (`source` "kind testbed"), and the authors' table as the simulator interpolates it ("authors": their
    measurements do not hold every configuration)."""
    ours = []
    for (model, _repeat), group in profile.groupby(["model", "repeat"], sort=False):
        at = group.set_index(["num_ps", "num_workers"]).steps_per_second
        if (1, 1) in at.index:
            for (p, w), speed in at.items():
                ours.append({"model": model, "config": f"({p}, {w})", "relative_speed": speed / at[1, 1], "source": "kind testbed"})
    catalog = load_catalog(authors_table)
    speeds = MeasuredSpeedModel(catalog, authors_table)
    theirs = []
    for model in profile.model.unique():
        m = catalog.index(model)
        for p, w in profile[profile.model == model][["num_ps", "num_workers"]].drop_duplicates().itertuples(index=False):
            relative = float(speeds.speed(m, p, w) / speeds.speed(m, 1, 1))
            theirs.append({"model": model, "config": f"({p}, {w})", "relative_speed": relative, "source": "authors"})
    return pd.DataFrame(ours + theirs, columns=["model", "config", "relative_speed", "source"])


def read(profile_dir: Path, testbed_dir: Path) -> SimToReal | None:
    """The section's data: None without a profile; the testbed tables empty where none ran."""
    if not (profile_dir / "profile.csv").is_file():
        return None
    profile = pd.read_csv(profile_dir / "profile.csv")
    jobs_file, slots_file = testbed_dir / "jobs.csv", testbed_dir / "slots.csv"
    jobs = pd.read_csv(jobs_file) if jobs_file.is_file() else pd.DataFrame(columns=replay.JOB_COLUMNS)
    slots = pd.read_csv(slots_file) if slots_file.is_file() else pd.DataFrame(columns=replay.SLOT_COLUMNS)
    return SimToReal(profiling.spread(profile), relative_speeds(profile), jobs, slots)


def figures(s: SimToReal) -> dict[str, plt.Figure]:
    """The profile beside the authors' table; with a testbed evaluation, the JCT gap and the speed error."""
    out = {"profile": plots.profiled_speeds(s.relative[s.relative.source == "kind testbed"], s.relative[s.relative.source == "authors"])}
    if len(s.jobs):
        out["gap"] = plots.sim_to_real(s.jobs)
        out["speed_error"] = plots.speed_error(s.speed_error)
    return out
