"""The simulator checked against the kind testbed (issue 34, item 4; `dl2 testbed check`).

The same validation traces `evaluate` draws, under the same policies, replay on kind `repeats` times each and
once in the calibrated simulator (the profiled table and the preset's `restart_seconds`). Per policy: the
testbed's average JCT with its spread over repeats, the simulator's, the simulator's error on the average, the
median error per job, and each policy's rank on both. The check passes when every policy's average is
predicted within `JCT_TOLERANCE`, every policy's median per-job error is under `JOB_ERROR_LIMIT`, and the
policies rank the same on both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd

from dl2 import plots
from dl2.learn.agent import DL2Policy
from dl2.paths import write_json_atomic, write_text_atomic
from dl2.sim.scenario import Scenario
from dl2.sim_to_real.replay import RUN_COLUMNS, evaluate_on_kind, write_outputs
from dl2.workload.traces import Trace

JCT_TOLERANCE = 0.15  # the simulator's average JCT per policy within this fraction of the testbed's
JOB_ERROR_LIMIT = 0.30  # the median over jobs of |simulator - testbed| / testbed, per policy, below this
NAMESPACE = "dl2-check"
CHECK_COLUMNS = ["policy", "kind", "kind_sd", "runs", "sim", "error", "within", "median_job_error", "rank_kind", "rank_sim"]


def check_table(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per policy (`replay.JOB_COLUMNS` rows in): `kind`, the testbed's average JCT (mean over traces and repeats);
    `kind_sd`, the sd of a run's average JCT over the repeats of a trace, averaged over traces; `sim`, the
    simulator's; `error` = sim / kind - 1 and whether it is `within` the tolerance; `median_job_error`, the median
    over jobs of |sim - kind| / kind, kind being the job's mean over repeats; each policy's rank on both (1: best)."""
    per_run = jobs.groupby(RUN_COLUMNS, sort=False)[["jct_testbed", "jct_sim"]].mean().reset_index()
    sd = per_run.groupby(["policy", "seed", "trace"], sort=False).jct_testbed.std(ddof=1).fillna(0.0).groupby("policy", sort=False).mean()
    per_job = jobs.groupby(["policy", "seed", "trace", "job_id"], sort=False)[["jct_testbed", "jct_sim"]].mean()
    job_error = ((per_job.jct_sim - per_job.jct_testbed).abs() / per_job.jct_testbed).groupby("policy", sort=False).median()
    table = per_run.groupby("policy", sort=False).agg(kind=("jct_testbed", "mean"), runs=("jct_testbed", "size"),
                                                      sim=("jct_sim", "mean")).reset_index()
    table["kind_sd"] = table.policy.map(sd)
    table["error"] = table.sim / table.kind - 1.0
    table["within"] = table.error.abs() <= JCT_TOLERANCE
    table["median_job_error"] = table.policy.map(job_error)
    table["rank_kind"] = table.kind.rank(method="min").astype(int)
    table["rank_sim"] = table.sim.rank(method="min").astype(int)
    return table[CHECK_COLUMNS]


def startup_seconds(slots: pd.DataFrame) -> pd.DataFrame:
    """Every configuration start on the testbed (`replay.SLOT_COLUMNS` rows in), with the seconds it did not train:
    over the slots it is marked started in (its first, and the next ones while it had not trained), each slot's
    seconds less those its epochs took at the profiled speed. Starts in which the job finished are left out (their
    prediction is capped at what the job had left). What the simulator's `restart_seconds` models."""
    rows = slots[(slots.num_ps > 0) & (slots.num_workers > 0)].sort_values([*RUN_COLUMNS, "job_id", "slot"])
    starts = []
    for key, job in rows.groupby([*RUN_COLUMNS, "job_id"], sort=False):
        job = job.reset_index(drop=True)
        k = 0
        while k < len(job):
            if not job.started[k]:
                k += 1
                continue
            configuration, lost, m = (job.num_ps[k], job.num_workers[k]), 0.0, k
            while (m < len(job) and job.started[m] and (job.num_ps[m], job.num_workers[m]) == configuration
                   and (m == k or job.slot[m] == job.slot[m - 1] + 1)):
                rate = job.epochs_predicted[m] / job.seconds[m]
                lost += job.seconds[m] - (job.epochs_trained[m] / rate if rate > 0 else 0.0)
                m += 1
            if m < len(job):  # the job went on after the start: its predictions were not capped
                starts.append({**dict(zip([*RUN_COLUMNS, "job_id"], key)), "model": job.model[k], "num_ps": configuration[0],
                               "num_workers": configuration[1], "slots": m - k, "seconds": lost})
            k = max(m, k + 1)
    return pd.DataFrame(starts, columns=[*RUN_COLUMNS, "job_id", "model", "num_ps", "num_workers", "slots", "seconds"])


def verdict(table: pd.DataFrame) -> dict:
    """Whether the simulator passes the check on `check_table`'s rows, criterion by criterion, and each policy's row
    (by policy: a DVC metric)."""
    within = bool(table.within.all())
    jobs_ok = bool((table.median_job_error < JOB_ERROR_LIMIT).all())
    same_ranking = bool((table.rank_kind == table.rank_sim).all())
    return {"jct_tolerance": JCT_TOLERANCE, "job_error_limit": JOB_ERROR_LIMIT, "every_policy_within": within,
            "median_job_error_below_limit": jobs_ok, "same_ranking": same_ranking, "passed": within and jobs_ok and same_ranking,
            "largest_error": float(table.error.abs().max()),
            "policies": {row.pop("policy"): row for row in table.to_dict(orient="records")}}


def markdown(table: pd.DataFrame, verdict_: Mapping) -> str:
    """`check_table` and its verdict as the Markdown `check.md` holds."""
    shown = table.assign(error=table.error.map("{:+.1%}".format), median_job_error=table.median_job_error.map("{:.1%}".format))
    lines = [shown.to_markdown(index=False, floatfmt=".3f"), "",
             f"- every policy's average JCT within ±{JCT_TOLERANCE:.0%}: {verdict_['every_policy_within']} "
             f"(largest error {verdict_['largest_error']:.1%})",
             f"- median per-job error under {JOB_ERROR_LIMIT:.0%} for every policy: {verdict_['median_job_error_below_limit']}",
             f"- the policies rank the same on kind and in the simulator: {verdict_['same_ranking']}",
             f"- passed: {verdict_['passed']}"]
    if "elastic" in verdict_:
        lines.append("- resizes on kind: " + ("surviving pods rejoin (elastic jobs)" if verdict_["elastic"] else "whole restarts"))
    if verdict_.get("startup_seconds_median") is not None:
        lines.append(f"- the simulator's restart cost: {verdict_['restart_seconds']:g} s; a configuration's start-up on the "
                     f"testbed (`startup.csv`), median over {verdict_['starts']} starts: {verdict_['startup_seconds_median']:.1f} s")
    return "\n".join(lines) + "\n"


def run_check(traces: Sequence[Trace], scenario: Scenario, heuristics: Sequence[str], learned: Mapping[str, DL2Policy],
              repeats: int, out: Path, folder: str | Path | None = None, log: Callable[[str], None] = print,
              restart_seconds: float | None = None, elastic: bool = True) -> dict:
    """Replay `traces` on the kind testbed (in `folder`) under every heuristic and learned policy (greedy),
    `repeats` times each, beside the simulator on `scenario`: the heuristics as `dl2 compare` runs them (no bundle
    first), the learned policies with `scenario`'s options (DL2's bundle per job first, where its settings say
    so). `restart_seconds`: the simulator predicts with this restart cost instead of the preset's (the replays, and
    which are kept, do not depend on it). `elastic` False: every resize on kind restarts the job's configuration
    whole, to compare with elastic jobs (each mode keeps its own replays). Writes `jobs.csv`, `slots.csv`,
    `speed_error.csv`, `startup.csv`, `check.csv`, `check.md`, `check.json` and `sim_to_real.png` into `out`. Every
    finished replay is kept in the testbed's folder, so an interrupted check run again replays only what had not
    finished. Returns the verdict."""
    plain = Scenario(scenario.preset, dataclasses.replace(scenario.options, assign_bundle=False))

    def predicting(sc: Scenario) -> Scenario:
        if restart_seconds is None:
            return sc
        return dataclasses.replace(sc, preset=dataclasses.replace(sc.preset, restart_seconds=restart_seconds))

    parts = [evaluate_on_kind({}, heuristics, traces, plain, folder, namespace=NAMESPACE, log=log, repeats=repeats, keep=True,
                              predict=predicting(plain), elastic=elastic)]
    if learned:
        parts.append(evaluate_on_kind({label: {0: policy} for label, policy in learned.items()}, (), traces, scenario, folder,
                                      namespace=NAMESPACE, log=log, repeats=repeats, keep=True, predict=predicting(scenario),
                                      elastic=elastic))
    jobs = pd.concat([j for j, _ in parts], ignore_index=True)
    slots = pd.concat([s for _, s in parts], ignore_index=True)
    table, starts = check_table(jobs), startup_seconds(slots)
    result = {**verdict(table), "traces": len(traces), "repeats": repeats, "preset": scenario.preset.name,
              "restart_seconds": predicting(scenario).preset.restart_seconds, "slot_seconds": scenario.preset.slot_seconds,
              "elastic": elastic, "startup_seconds_median": float(starts.seconds.median()) if len(starts) else None, "starts": len(starts)}
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, jobs, slots)
    write_text_atomic(out / "startup.csv", starts.to_csv(index=False))
    write_text_atomic(out / "check.csv", table.to_csv(index=False))
    write_text_atomic(out / "check.md", markdown(table, result))
    plots.save_figure(plots.sim_to_real(jobs), out / "sim_to_real.png")
    write_json_atomic(out / "check.json", result)  # last: its presence says the check finished
    return result
