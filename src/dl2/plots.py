"""Seaborn figures of the pipeline, and saving them (atomically, and into the active MLflow run)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from dl2.paths import atomic_path  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook")


def save_figure(fig: plt.Figure, path: str | Path, dpi: int = 120, log: bool = True) -> Path:
    """Write `fig` to `path` (format from the suffix) and, with an active MLflow run, log it as an artifact."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip("."), bbox_inches="tight", dpi=dpi)
    if log and mlflow.active_run() is not None:
        mlflow.log_artifact(str(path), artifact_path="figures")
    return path


def arrivals_figure(traces: pd.DataFrame) -> plt.Figure:
    """Jobs arriving per slot, and the job-type mix, per preset (`traces`: one row per job)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    per_slot = traces.groupby(["preset", "trace", "arrival_slot"]).size().rename("arrivals").reset_index()
    sns.lineplot(per_slot, x="arrival_slot", y="arrivals", hue="preset", ax=axes[0])
    axes[0].set(title="Arrivals per slot (mean and 95% CI over traces)", xlabel="slot", ylabel="jobs")
    sns.countplot(traces, y="model", hue="preset", ax=axes[1])
    axes[1].set(title="Job types", xlabel="jobs", ylabel="")
    fig.tight_layout()
    return fig


def jct_bars(summary: pd.DataFrame) -> plt.Figure:
    """Average JCT per policy and preset, bars at the mean over traces with the standard deviation."""
    grid = sns.catplot(summary, kind="bar", x="policy", y="avg_jct", col="preset", errorbar="sd",
                       sharey=False, height=4, aspect=1.2, hue="policy", legend=False)
    for ax, (_, part) in zip(grid.axes.flat, summary.groupby("preset", sort=False)):
        ax.axhline(part.lower_bound_avg_jct.mean(), color="black", ls="--", lw=1, label="lower bound")
        ax.legend(loc="upper right")
    grid.set_axis_labels("", "average JCT (slots)")
    grid.figure.suptitle("Average JCT per policy (mean ± sd over traces)", y=1.03)
    return grid.figure


def jct_cdf(jobs: pd.DataFrame) -> plt.Figure:
    """Distribution of per-job JCT per policy and preset."""
    grid = sns.displot(jobs, kind="ecdf", x="jct", hue="policy", col="preset", height=4, aspect=1.2,
                       facet_kws={"sharex": False})
    grid.set_axis_labels("JCT (slots)", "fraction of jobs")
    grid.figure.suptitle("JCT CDF", y=1.03)
    return grid.figure


def utilization(slots: pd.DataFrame) -> plt.Figure:
    """GPU and CPU utilization per slot, mean over traces, per policy and preset."""
    long = slots.melt(id_vars=["preset", "trace", "policy", "slot"], value_vars=["gpu_util", "cpu_util"],
                      var_name="resource", value_name="utilization")
    grid = sns.relplot(long, kind="line", x="slot", y="utilization", hue="policy", row="resource", col="preset",
                       errorbar=None, height=3, aspect=1.6, facet_kws={"sharex": False})
    grid.figure.suptitle("Cluster utilization over time (mean over traces)", y=1.02)
    return grid.figure


def bound_ratio(summary: pd.DataFrame) -> plt.Figure:
    """Each policy's average JCT divided by the contention-free lower bound, per trace."""
    grid = sns.catplot(summary, kind="box", x="policy", y="ratio_to_lower_bound", col="preset", hue="policy",
                       sharey=False, height=4, aspect=1.2, legend=False)
    for ax in grid.axes.flat:
        ax.axhline(1.0, color="black", ls="--", lw=1)
    grid.set_axis_labels("", "average JCT / lower bound")
    grid.figure.suptitle("Distance to the contention-free lower bound (1 = optimal)", y=1.03)
    return grid.figure


def learning_curves(history: pd.DataFrame, x: str, panels: dict[str, list[str]]) -> plt.Figure:
    """One panel per entry of `panels` (title -> history columns), against `x`."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (title, columns) in zip(axes[0], panels.items()):
        present = [c for c in columns if c in history]
        long = history.melt(id_vars=[x], value_vars=present, var_name="series").dropna()
        sns.lineplot(long, x=x, y="value", hue="series", marker="o", ax=ax)
        ax.set(title=title, xlabel=x, ylabel="")
    fig.tight_layout()
    return fig


def fig9_bars(results: pd.DataFrame) -> plt.Figure:
    """Paper Fig. 9: average JCT per policy (mean ± sd over validation traces and seeds), with the lower bound;
    one bar per row, so that every policy's name reads in full however many there are."""
    order = results.groupby("policy", sort=False).avg_jct.mean().sort_values(ascending=False).index
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.4 * len(order)))
    sns.barplot(results, y="policy", x="avg_jct", order=order, errorbar="sd", hue="policy", legend=False, ax=ax)
    ax.axvline(results.lower_bound.mean(), color="black", ls="--", lw=1)
    ax.set(title="Average JCT on validation traces (mean ± sd)", ylabel="", xlabel="average JCT (slots); dashed: the lower bound")
    fig.tight_layout()
    return fig


def fig10_curves(history: pd.DataFrame, lines: dict[str, float]) -> plt.Figure:
    """Paper Fig. 10: validation JCT (greedy) against training updates per run (mean ± sd over seeds),
    with fixed references (e.g. DRF, SL only, the lower bound) as horizontal lines; a star marks each
    seed's kept policy where the history has a `chosen` column."""
    fig, ax = plt.subplots(figsize=(8, 4))
    runs = list(history.run.unique())
    sns.lineplot(history, x="update", y="val_jct_greedy", hue="run", hue_order=runs, marker="o", errorbar="sd", ax=ax)
    if "chosen" in history:
        sns.scatterplot(history[history.chosen.astype(bool)], x="update", y="val_jct_greedy", hue="run", hue_order=runs,
                        marker="*", s=250, edgecolor="black", legend=False, ax=ax)
    for (label, value), style in zip(lines.items(), ["-.", ":", "--", "-"]):
        ax.axhline(value, color="black" if label == "lower bound" else "gray", ls=style, lw=1, label=label)
    ax.set(title="Validation JCT during RL fine-tuning", xlabel="update", ylabel="average JCT (slots)")
    ax.legend()
    fig.tight_layout()
    return fig


def ablation_figure(results: pd.DataFrame, curves: pd.DataFrame, axis: str) -> plt.Figure:
    """One ablation axis: greedy validation JCT per cell (mean ± sd over seeds, the lower bound dashed), and
    the cells' learning curves where they have any."""
    panels = 2 if len(curves) else 1
    cells = results.cell.nunique()
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, max(4.0, 1.5 + 0.4 * cells)), squeeze=False)
    ax = axes[0, 0]
    sns.barplot(results, y="cell", x="val_jct_greedy", errorbar="sd", hue="cell", legend=False, ax=ax)
    ax.axvline(results.lower_bound.mean(), color="black", ls="--", lw=1)
    ax.set(title=f"Ablation: {axis}", ylabel="", xlabel="average JCT (slots); dashed: the lower bound")
    if panels == 2:
        sns.lineplot(curves, x="update", y="val_jct_greedy", hue="cell", errorbar="sd", marker="o", ax=axes[0, 1])
        axes[0, 1].set(title="Validation JCT during fine-tuning", xlabel="update", ylabel="average JCT (slots)")
    fig.tight_layout()
    return fig


def sim_to_real(jobs: pd.DataFrame) -> plt.Figure:
    """The same traces and policies on the testbed and in the simulator on its profiled table: per job, the
    testbed's JCT against the simulator's (the diagonal: no gap), and per policy the average JCT of each."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    sns.scatterplot(jobs, x="jct_sim", y="jct_testbed", hue="policy", style="model", s=60, ax=axes[0])
    top = float(max(jobs.jct_sim.max(), jobs.jct_testbed.max())) * 1.05
    axes[0].plot([0, top], [0, top], color="black", ls="--", lw=1)
    axes[0].set(title="Per job: JCT on the testbed against the simulator's", xlabel="simulator (profiled table), slots",
                ylabel="kind testbed, slots", xlim=(0, top), ylim=(0, top))
    axes[0].legend(fontsize=7, loc="upper left")
    averages = jobs.melt(id_vars=["policy", "seed", "trace"], value_vars=["jct_testbed", "jct_sim"], var_name="where",
                         value_name="jct").replace({"jct_testbed": "kind testbed", "jct_sim": "simulator"})
    sns.barplot(averages, y="policy", x="jct", hue="where", errorbar="sd", ax=axes[1])
    axes[1].set(title="Average JCT per policy (mean ± sd over jobs)", xlabel="JCT (slots)", ylabel="")
    fig.tight_layout()
    return fig


def profiled_speeds(ours: pd.DataFrame, authors: pd.DataFrame) -> plt.Figure:
    """Per job type, the speed at each (#PS, #workers) relative to (1, 1): the testbed's profile (mean ± sd over
    repeats) beside the authors' measurements at the same configurations (`config`, `relative_speed`,
    `model`, `source` columns)."""
    both = pd.concat([ours, authors], ignore_index=True)
    grid = sns.catplot(both, kind="bar", x="config", y="relative_speed", hue="source", col="model", col_wrap=4,
                       errorbar="sd", height=2.6, aspect=1.1)
    grid.set_axis_labels("(#PS, #workers)", "speed / speed at (1, 1)")
    grid.set_titles("{col_name}")
    grid.figure.suptitle("Speed against configuration: the kind testbed's profile and the authors' table", y=1.03)
    return grid.figure


def speed_error(errors: pd.DataFrame) -> plt.Figure:
    """Per job type: epochs the testbed's pods trained over those the profiled table predicts, in slots where the
    configuration ran throughout and where it started (the pods' start-up inside the slot)."""
    long = errors.melt(id_vars="model", value_vars=["steady_ratio", "started_ratio"], var_name="slots", value_name="ratio")
    long["slots"] = long.slots.map({"steady_ratio": "configuration ran the whole slot",
                                    "started_ratio": "configuration started in the slot"})
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.45 * errors.model.nunique()))
    sns.barplot(long, y="model", x="ratio", hue="slots", ax=ax)
    ax.axvline(1.0, color="black", ls="--", lw=1)
    ax.set(title="Sim-to-real speed: trained / predicted epochs per slot", xlabel="ratio (1: the table is right)", ylabel="")
    fig.tight_layout()
    return fig


def generalisation(results: pd.DataFrame) -> plt.Figure:
    """Each policy's average JCT over the lower bound under every shift of the test traces (mean ± sd over
    training seeds and traces); 1 is the bound."""
    data = results.assign(ratio=results.avg_jct / results.lower_bound)
    fig, ax = plt.subplots(figsize=(9, 4))
    sns.barplot(data, x="shift", y="ratio", hue="policy", errorbar="sd", ax=ax)
    ax.axhline(1.0, color="black", ls="--", lw=1)
    ax.set(title="Generalisation: trained policies on traces unlike their training traces", xlabel="",
           ylabel="average JCT / lower bound")
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def pollux_loads(loads: pd.DataFrame) -> plt.Figure:
    """The Pollux world's Fig. 8a: average JCT against relative job load per policy, ours (solid) beside the
    artifact's stored results (dashed), each the mean over the workloads run (`loads`: `grid.loads_table`)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    palette = dict(zip(sorted(loads.policy.unique()), sns.color_palette(n_colors=loads.policy.nunique())))
    for policy, part in loads.groupby("policy"):
        x = part.load.astype(float)
        ax.plot(x, part.ours / 3600, marker="o", color=palette[policy], label=f"{policy} (dl2)")
        ax.plot(x, part.artifact / 3600, ls="--", marker="x", color=palette[policy], label=f"{policy} (artifact)")
    ax.set(xlabel="relative job load", ylabel="average JCT (hours)", title="Pollux world: average JCT per load (Fig. 8a)")
    ax.legend(fontsize="small", ncols=2)
    fig.tight_layout()
    return fig


def pollux_cells(cells: pd.DataFrame) -> plt.Figure:
    """Every grid cell's relative error against the artifact, per policy, with each policy's tolerance band
    (`cells`: `grid.cells_table`)."""
    fig, ax = plt.subplots(figsize=(9, 4))
    shown = cells.assign(error_pct=100 * cells.rel_error, cell=cells.load + "/w" + cells.workload.astype(str))
    sns.stripplot(shown, x="cell", y="error_pct", hue="policy", dodge=True, ax=ax, size=5)
    for tolerance in shown.groupby("policy").tolerance.first().unique():
        ax.axhspan(-100 * tolerance, 100 * tolerance, alpha=0.08, color="grey")
    ax.axhline(0, color="black", lw=0.8)
    ax.set(xlabel="load / workload", ylabel="ours vs artifact (%)", title="Average JCT per cell against the artifact's")
    ax.tick_params(axis="x", rotation=90, labelsize="x-small")
    fig.tight_layout()
    return fig
