"""The Pollux world's table (issue 35): DL2's two variants, Pollux, Optimus+Oracle and Tiresias on the same
cells (relative job load x the artifact's workloads), beside the world's lower bound.

Per policy and load, each measure (average JCT, makespan, restarts per job, GPU utilisation) is first the
mean over the load's workloads within one seed, then the mean, standard deviation (ddof 1) and min-max of
those over the policy's seeds: DL2's training seeds, Pollux's seeds (it is randomized), one run for the
deterministic Optimus+Oracle and Tiresias. A run that did not finish (NaN) makes its seed's mean NaN, so a
failure is never averaged away. The bound (`dl2.pollux.bound`) has one value per cell.

Every policy sees the same jobs and pays the same restarts; Optimus+Oracle alone reads each job's true step
times and remaining iterations (its oracle); Pollux, Tiresias and DL2 see only what a running job reveals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from dl2 import plots
from dl2.errors import Dl2Error
from dl2.paths import write_csv_atomic, write_json_atomic, write_text_atomic
from dl2.pollux.bound import lower_bound_jct
from dl2.pollux.grid import LOADS, Cell
from dl2.pollux.workload import read_workload
from dl2.workload.presets import PolluxPreset

MEASURES = ("avg_jct", "makespan", "restarts_per_job", "mean_gpu_util")
DL2_POLICIES = ("dl2-tuned", "dl2-pollux-batch")
BASELINES = ("pollux", "optimus", "tiresias")
POLICIES = (*DL2_POLICIES, *BASELINES)
BOUND = "bound"
NAMES = {"dl2-tuned": "DL2 + tuned", "dl2-pollux-batch": "DL2 + pollux-batch", "pollux": "Pollux",
         "optimus": "Optimus+Oracle", "tiresias": "Tiresias", BOUND: "lower bound"}
COLUMNS = {"avg_jct": "average JCT (s)", "makespan": "makespan (s)", "restarts_per_job": "restarts per job",
           "mean_gpu_util": "GPU utilisation (share of the cluster's GPUs, mean over intervals)"}
FAIRNESS = ("Every policy runs the same jobs through the same simulator and pays the same 30-s restart. Optimus+Oracle "
            "alone has an oracle: it reads each job's true step times and remaining iterations. Pollux, Tiresias and "
            "DL2 see only what running jobs reveal (DL2: each job's application, age, progress, GPUs and restarts).")
WITHIN = 0.05  # DL2 + pollux-batch's allowance over Pollux at 1.0x


@dataclass(frozen=True)
class Target:
    """A claim the table checks at some loads: `policy`'s mean average JCT at most `limit` x `baseline`'s
    (`strict`: below it)."""

    name: str
    text: str
    policy: str
    checks: tuple[tuple[str, str, float, bool], ...]  # (load, baseline, limit, strict)


TARGETS = (
    Target("tuned_below_baselines", "DL2 + tuned below Optimus+Oracle and Tiresias at every load", "dl2-tuned",
           tuple((load, b, 1.0, True) for load in LOADS for b in ("optimus", "tiresias"))),
    Target("pollux_batch_near_pollux", f"DL2 + pollux-batch within {WITHIN:.0%} of Pollux at 1.0x and below at 2.0x",
           "dl2-pollux-batch", (("1.0", "pollux", 1 + WITHIN, False), ("2.0", "pollux", 1.0, True))),
)


def bound_cells(preset: PolluxPreset, cells: Sequence[tuple[str, int]]) -> pd.DataFrame:
    """Per (load, workload): the lower bound's average JCT and makespan (each job alone from its arrival)."""
    rows = []
    for load, w in cells:
        workload = read_workload(Cell(BOUND, load, w, 0).path)
        jct = lower_bound_jct(workload, preset)
        rows.append({"load": load, "workload": w, "avg_jct": float(jct.mean()), "makespan": float((workload.time + jct).max())})
    return pd.DataFrame(rows)


def check_complete(summary: pd.DataFrame, cells: Sequence[tuple[str, int]], policies: Sequence[str] = POLICIES) -> None:
    """Raise, naming them, unless every policy has a run of every cell for each of its seeds."""
    problems = []
    want = set(cells)
    for policy in policies:
        runs = summary[summary.policy == policy]
        if runs.empty:
            problems.append(f"{policy}: no runs")
            continue
        for seed, part in runs.groupby("seed"):
            missing = sorted(want - set(zip(part.load, part.workload)))
            if missing:
                shown = ", ".join(f"{load}x w{w}" for load, w in missing[:6]) + (" ..." if len(missing) > 6 else "")
                problems.append(f"{policy} seed {seed}: {len(missing)} cell(s) missing ({shown})")
    if problems:
        raise Dl2Error("the Pollux table needs every policy on every cell: " + "; ".join(problems))


def _on_cells(frame: pd.DataFrame, cells: Sequence[tuple[str, int]]) -> pd.DataFrame:
    keys = pd.DataFrame(list(cells), columns=["load", "workload"])
    return frame.merge(keys, on=["load", "workload"])


def loads_table(summary: pd.DataFrame, bound: pd.DataFrame, policies: Sequence[str] = POLICIES) -> pd.DataFrame:
    """Per policy and load: each measure's mean over the workloads, its mean, `_sd`, `_min` and `_max` over the
    policy's seeds, the seeds, the failed runs and the average JCT's ratio to the bound's; then the bound's rows.
    `summary`: a row per run (policy, load, workload, seed and `MEASURES`); `bound`: `bound_cells`."""
    cells = list(zip(bound.load, bound.workload))
    check_complete(summary, cells, policies)
    runs = _on_cells(summary[summary.policy.isin(policies)], cells)
    keys = ["policy", "load", "seed"]
    per_seed = runs.groupby(keys)[list(MEASURES)].mean()
    failed = runs.avg_jct.isna().groupby([runs[k] for k in keys]).sum()
    per_seed.loc[failed[failed > 0].index] = np.nan
    grouped = per_seed.groupby(["policy", "load"])
    table = grouped.size().rename("seeds").to_frame()
    table["failed"] = failed.groupby(["policy", "load"]).sum().astype(int)
    for m in MEASURES:
        stats = grouped[m].agg(["mean", "std", "min", "max"]).rename(columns={"mean": m, "std": f"{m}_sd", "min": f"{m}_min",
                                                                              "max": f"{m}_max"})
        table = table.join(stats)
    table.loc[table.failed > 0, table.columns[2:]] = np.nan  # a failed seed's mean is NaN: so is the load's
    table = table.reset_index()
    bound_loads = bound.groupby("load")[["avg_jct", "makespan"]].mean()
    table["ratio_to_bound"] = table.avg_jct.to_numpy() / bound_loads.avg_jct.reindex(table.load).to_numpy()
    bound_rows = bound_loads.reset_index().assign(policy=BOUND, seeds=1, failed=0, ratio_to_bound=1.0)
    order = {p: k for k, p in enumerate([*policies, BOUND])}
    table = pd.concat([table, bound_rows], ignore_index=True).reindex(columns=table.columns)
    return table.sort_values(["load", "policy"], key=lambda c: c.map(order) if c.name == "policy" else c,
                             kind="mergesort", ignore_index=True)


def cells_table(summary: pd.DataFrame, bound: pd.DataFrame, policies: Sequence[str] = POLICIES) -> pd.DataFrame:
    """Per policy, load and workload: each measure's mean over the seeds, the average JCT's sd over them, the
    seeds, the failed runs, the bound's average JCT and the ratio to it."""
    runs = _on_cells(summary[summary.policy.isin(policies)], list(zip(bound.load, bound.workload)))
    grouped = runs.groupby(["policy", "load", "workload"])
    table = grouped[list(MEASURES)].mean(numeric_only=True)
    table.insert(0, "seeds", grouped.size())
    table.insert(1, "failed", grouped.avg_jct.apply(lambda s: int(s.isna().sum())))
    table.insert(3, "avg_jct_sd", grouped.avg_jct.std())
    table = table.reset_index().merge(bound[["load", "workload", "avg_jct"]].rename(columns={"avg_jct": "bound_avg_jct"}),
                                      on=["load", "workload"])
    table["ratio_to_bound"] = table.avg_jct / table.bound_avg_jct
    return table


def target_checks(loads: pd.DataFrame, targets: Sequence[Target] = TARGETS) -> pd.DataFrame:
    """One row per check of every target: DL2's and the baseline's mean average JCT at the load, their ratio, the
    limit and whether it holds (None where the load did not run; False where DL2 failed a run there)."""
    jct = loads.set_index(["policy", "load"]).avg_jct
    rows = []
    for target in targets:
        for load, baseline, limit, strict in target.checks:
            ours, theirs = jct.get((target.policy, load), np.nan), jct.get((baseline, load), np.nan)
            ran = (target.policy, load) in jct.index and (baseline, load) in jct.index
            ratio = ours / theirs
            holds = None if not ran else bool(ratio < limit if strict else ratio <= limit)
            rows.append({"target": target.name, "load": load, "policy": target.policy, "baseline": baseline,
                         "ours": ours, "theirs": theirs, "ratio": ratio, "limit": limit, "strict": strict, "holds": holds})
    return pd.DataFrame(rows)


def verdicts(checks: pd.DataFrame, targets: Sequence[Target] = TARGETS) -> dict[str, bool | None]:
    """Per target: False if any check fails, True if all hold, None (not judged) if some did not run."""
    out: dict[str, bool | None] = {}
    for target in targets:
        holds = list(checks[checks.target == target.name].holds)
        out[target.name] = False if False in holds else (None if None in holds else True)
    return out


def comparisons(loads: pd.DataFrame) -> pd.DataFrame:
    """Each DL2 variant against each baseline and the bound at each load: the change in mean average JCT, whether
    DL2 wins (lower mean), and whether it does so in every seed (DL2's worst seed below the baseline's best, or
    for a loss its best above the baseline's worst)."""
    by = loads.set_index(["policy", "load"])
    rows = []
    for policy in DL2_POLICIES:
        for baseline in (*BASELINES, BOUND):
            for load in sorted(set(loads.load)):
                if (policy, load) not in by.index or (baseline, load) not in by.index:
                    continue
                ours, theirs = by.loc[(policy, load)], by.loc[(baseline, load)]
                change = ours.avg_jct / theirs.avg_jct - 1
                wins = bool(change < 0)
                if baseline == BOUND:
                    clear = True
                elif wins:
                    clear = bool(ours.avg_jct_max < theirs.avg_jct_min)
                else:
                    clear = bool(ours.avg_jct_min > theirs.avg_jct_max)
                rows.append({"policy": policy, "baseline": baseline, "load": load, "ours": ours.avg_jct,
                             "ours_sd": ours.avg_jct_sd, "ours_seeds": int(ours.seeds), "theirs": theirs.avg_jct,
                             "theirs_sd": theirs.avg_jct_sd, "theirs_seeds": int(theirs.seeds), "change": change,
                             "outcome": "failed" if np.isnan(change) else ("wins" if wins else "loses"),
                             "every_seed": clear and not np.isnan(change)})
    return pd.DataFrame(rows)


def _spread(mean: float, sd: float, seeds: int) -> str:
    if np.isnan(mean):
        return "did not finish every run"
    if seeds < 2:
        return f"{mean:,.0f} s (one run)"
    return f"{mean:,.0f} s (sd {sd:,.0f} over {seeds} seeds)"


def sentences(comps: pd.DataFrame) -> list[str]:
    """`comparisons` in words, one sentence per row, the spread of each side stated."""
    out = []
    for r in comps.itertuples():
        ours = f"At {r.load}x, {NAMES[r.policy]} averages {_spread(r.ours, r.ours_sd, r.ours_seeds)}"
        if r.baseline == BOUND:
            out.append(f"{ours}, {r.change + 1:.2f}x the lower bound's {r.theirs:,.0f} s." if r.outcome != "failed"
                       else f"{ours}.")
            continue
        theirs = f"{NAMES[r.baseline]}'s {_spread(r.theirs, r.theirs_sd, r.theirs_seeds)}"
        if r.outcome == "failed":
            out.append(f"{ours}: no comparison with {theirs}.")
            continue
        word = "below" if r.outcome == "wins" else "above"
        seeds = "in every seed" if r.every_seed else "within the spread over seeds"
        out.append(f"{ours}, {abs(r.change):.1%} {word} {theirs}: DL2 {'wins' if r.outcome == 'wins' else 'loses'}, {seeds}.")
    return out


def wins_and_losses(comps: pd.DataFrame) -> list[str]:
    """Per DL2 variant, the baselines and loads where its mean average JCT is lower (wins) and where it is not."""
    out = []
    for policy, part in comps[comps.baseline != BOUND].groupby("policy", sort=False):
        for outcome in ("wins", "loses", "failed"):
            rows = part[part.outcome == outcome]
            if len(rows):
                where = "; ".join(f"{NAMES[b]} at {', '.join(g.load)}x" for b, g in rows.groupby("baseline", sort=False))
                out.append(f"{NAMES[policy]} {'did not finish against' if outcome == 'failed' else outcome + ' against'} {where}.")
    return out


def metrics(loads: pd.DataFrame, checks: pd.DataFrame, scale: str) -> dict:
    """The DVC metrics: per policy@load each measure's mean, the average JCT's spread and ratio to the bound; the
    targets' verdicts."""
    def number(v: float) -> float | None:
        return None if pd.isna(v) else round(float(v), 6)

    keep = [*MEASURES, "avg_jct_sd", "avg_jct_min", "avg_jct_max", "ratio_to_bound"]
    return {"scale": scale,
            "targets": verdicts(checks),
            "loads": {f"{r['policy']}@{r['load']}": {"seeds": int(r["seeds"]), "failed": int(r["failed"]),
                                                     **{k: number(r[k]) for k in keep}}
                      for r in loads.to_dict("records")}}


def _cell(mean: float, sd: float, low: float, high: float, seeds: float, digits: int) -> str:
    if pd.isna(mean):
        return "-"
    text = f"{mean:,.{digits}f}"
    if seeds > 1 and not pd.isna(sd):
        text += f" ± {sd:,.{digits}f} ({low:,.{digits}f}–{high:,.{digits}f})"
    return text


def markdown(loads: pd.DataFrame, checks: pd.DataFrame, comps: pd.DataFrame, scale: str) -> str:
    """The table in Markdown: a table per measure (rows: policies; columns: loads; mean ± sd (min–max) over
    seeds), the targets and the comparisons in words."""
    lines = [f"# The Pollux world: DL2 beside Pollux, Optimus+Oracle, Tiresias and the lower bound ({scale} scale)", "",
             FAIRNESS, ""]
    load_names = sorted(set(loads.load))
    for m in MEASURES:
        digits = 0 if m in ("avg_jct", "makespan") else 3
        lines += [f"## {COLUMNS[m]}", "", "| policy | " + " | ".join(f"{x}x" for x in load_names) + " |",
                  "|---" * (len(load_names) + 1) + "|"]
        for policy, part in loads.groupby("policy", sort=False):
            by_load = part.set_index("load")
            if by_load[m].isna().all() and policy == BOUND:
                continue
            row = [_cell(*by_load.loc[x, [m, f"{m}_sd", f"{m}_min", f"{m}_max", "seeds"]], digits) if x in by_load.index
                   else "-" for x in load_names]
            lines.append(f"| {NAMES.get(policy, policy)} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Targets", ""]
    for target, holds in verdicts(checks).items():
        text = next(t.text for t in TARGETS if t.name == target)
        lines.append(f"- {text}: **{ {True: 'holds', False: 'does not hold', None: 'not judged (loads missing)'}[holds] }**")
    lines += ["", "## Where DL2 wins and loses", "", *(f"- {s}" for s in wins_and_losses(comps)),
              "", "## Each comparison", "", *(f"- {s}" for s in sentences(comps)), ""]
    return "\n".join(lines)


def figure(loads: pd.DataFrame) -> plt.Figure:
    """Average JCT against relative job load, a line per policy (its mean over seeds, the band its min-max over
    seeds), the lower bound dashed."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    policies = [p for p in loads.policy.unique() if p != BOUND]
    palette = dict(zip(policies, sns.color_palette(n_colors=len(policies))))
    for policy, part in loads.groupby("policy", sort=False):
        x = part.load.astype(float)
        if policy == BOUND:
            ax.plot(x, part.avg_jct / 3600, ls="--", marker="_", markersize=14, color="black", label=NAMES[BOUND])
            continue
        ax.plot(x, part.avg_jct / 3600, marker="o", color=palette[policy], label=NAMES.get(policy, policy))
        ax.fill_between(x, part.avg_jct_min / 3600, part.avg_jct_max / 3600, color=palette[policy], alpha=0.2, lw=0)
    ax.set(xlabel="relative job load", ylabel="average JCT (hours)", xticks=sorted(loads.load.astype(float).unique()),
           title="Pollux world: average JCT per load (mean over workloads; band: min-max over seeds)")
    ax.set_ylim(bottom=0)
    ax.title.set_fontsize("medium")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class PolluxTable:
    """Every table of one run of the comparison (`build`)."""

    summary: pd.DataFrame  # a row per run of every policy on the cells
    bound: pd.DataFrame  # `bound_cells`
    cells: pd.DataFrame  # `cells_table`
    loads: pd.DataFrame  # `loads_table`
    checks: pd.DataFrame  # `target_checks`
    comparisons: pd.DataFrame  # `comparisons`
    scale: str  # the DL2 stage's scale ("reduced" or "full")

    def metrics(self) -> dict:
        return metrics(self.loads, self.checks, self.scale)

    def markdown(self) -> str:
        return markdown(self.loads, self.checks, self.comparisons, self.scale)


def read_summary(path: Path) -> pd.DataFrame:
    """A summary CSV (a row per run; the grid's `summary.csv`), loads as names ("1.0")."""
    if not path.is_file():
        raise Dl2Error(f"{path}: no such file (`dvc pull`, or the stage that writes it)")
    return pd.read_csv(path, dtype={"load": str})


def build(dl2_summary: pd.DataFrame, baselines: pd.DataFrame, bound: pd.DataFrame, scale: str) -> PolluxTable:
    """DL2's runs (the variants it holds) and the baselines' (the grid's `summary.csv`) on the bound's cells, in
    every table; a target on a variant that did not run is not judged."""
    policies = [p for p in DL2_POLICIES if p in set(dl2_summary.policy)] + list(BASELINES)
    unknown = sorted(set(dl2_summary.policy) - set(DL2_POLICIES))
    if unknown:
        raise Dl2Error(f"DL2's runs: unknown policies {unknown} (expected {', '.join(DL2_POLICIES)})")
    summary = pd.concat([dl2_summary, baselines[baselines.policy.isin(BASELINES)]], ignore_index=True)
    summary = _on_cells(summary[["policy", "load", "workload", "seed", *MEASURES]], list(zip(bound.load, bound.workload)))
    loads = loads_table(summary, bound, policies)
    checks = target_checks(loads)
    return PolluxTable(summary, bound, cells_table(summary, bound, policies), loads, checks, comparisons(loads), scale)


TABLE_FILES = {"bound.csv": "bound", "cells.csv": "cells", "table.csv": "loads", "targets.csv": "checks",
               "comparisons.csv": "comparisons"}  # file: PolluxTable field


def write(t: PolluxTable, folder: Path, dpi: int = 120) -> dict:
    """The tables (`TABLE_FILES`), `table.md`, `table.png` and the DVC metrics `metrics.json`, each written
    atomically into `folder`; the metrics."""
    for name, field in TABLE_FILES.items():
        write_csv_atomic(folder / name, getattr(t, field))
    write_text_atomic(folder / "table.md", t.markdown())
    fig = figure(t.loads)
    plots.save_figure(fig, folder / "table.png", dpi)
    plt.close(fig)
    out = t.metrics()
    write_json_atomic(folder / "metrics.json", out)
    return out
