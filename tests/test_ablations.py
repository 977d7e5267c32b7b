"""Ablation plans from params.yaml, resuming a cell, and the reproduction report's claims."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from dl2 import reproduction as rep
from dl2.config import load_params
from dl2.errors import Dl2Error
from dl2.learn import workflow
from dl2.learn.ablations import cells as ab_cells
from dl2.learn.ablations import plan as ab_plan
from dl2.learn.ablations import tables
from dl2.paths import repo_root
from dl2.schedulers import simulate_builtin
from dl2.stages import load_stage
from dl2.workload.presets import presets_from

PARAMS = load_params(repo_root() / "params.yaml")
PRESETS = presets_from(PARAMS, "params.yaml")


def plan_of(axis: str) -> ab_plan.AblationPlan:
    """The project's plan of `axis`, as its `ablate` stage loads it."""
    group = next(g for g, axes in PARAMS["ablations"]["groups"].items() if axis in axes)
    return next(p for p in load_stage(f"ablate@{group}").config.plans if p.axis == axis)


def plan_with(ablations: dict, axis: str, **sections) -> ab_plan.AblationPlan:
    """`axis` of an `ablations` section of one's own, on the project's sections changed by `sections`."""
    main = {name: {**PARAMS[name], **sections.get(name, {})} for name in ab_plan.SECTIONS}
    settings = ab_plan.ablation_settings({"seeds": [0], "workers": 1, "groups": {}, **ablations}, "params.yaml")
    return ab_plan.plan_axis(settings, axis, main, PRESETS, "params.yaml")


def test_every_group_of_the_projects_params_plans_and_names_each_axis_once():
    groups = PARAMS["ablations"]["groups"]
    plans = [plan for group in groups for plan in load_stage(f"ablate@{group}").config.plans]
    axes = [plan.axis for plan in plans]
    assert sorted(axes) == sorted(PARAMS["ablations"]["axes"]) and len(axes) == len(set(axes))
    for plan in plans:
        assert plan.reference in {c.label for c in plan.cells} and plan.seeds == tuple(PARAMS["ablations"]["seeds"])


def test_a_cell_is_the_main_sections_then_the_scale_then_the_axis_base_then_its_own_overrides():
    ablations = {"scale": "small", "scales": {"small": {"finetune": {"updates": 4}}},
                 "axes": {"replay": {"base": {"finetune": {"algorithm": "actor-critic", "shaping": "off", "lr": 0.0001}}, "reference": "on",
                                     "cells": {"on": {"finetune": {"replay": "uniform"}},
                                               "none": {"run": "rl-only", "finetune": {"replay": "off"}}}}}}
    plan = plan_with(ablations, "replay", learn={"window": 20, "train_traces": 40}, finetune={"lr": 0.003, "updates": 200})
    on, none = plan.cells
    assert on.params["finetune"] == {**PARAMS["finetune"], "lr": 0.0001, "updates": 4, "algorithm": "actor-critic", "shaping": "off",
                                     "replay": "uniform"}
    assert (on.finetune.lr, on.finetune.updates, on.finetune.replay) == (0.0001, 4, "uniform")
    assert on.params["learn"] == {**PARAMS["learn"], "window": 20, "train_traces": 40} and on.settings.train_traces == 40
    assert on.run == "sl-rl" and none.run == "rl-only"
    assert none.finetune.replay == "off" and plan.reference == "on"
    assert on.digest(0) != on.digest(1) != none.digest(1)


def test_an_axis_budget_at_the_scale_comes_after_the_axis_base_and_before_the_cell():
    axis = {"base": {"finetune": {"updates": 7, "lr": 0.1}}, "scales": {"full": {"finetune": {"updates": 6000, "lr": 0.2}}},
            "cells": {"a": {}, "b": {"finetune": {"lr": 0.3}}}}
    scales = {"small": {"finetune": {"updates": 4}}, "full": {"finetune": {"updates": 200}}}
    small = plan_with({"scale": "small", "scales": scales, "axes": {"x": axis}}, "x")
    full = plan_with({"scale": "full", "scales": scales, "axes": {"x": axis}}, "x")
    assert [(c.finetune.updates, c.finetune.lr) for c in small.cells] == [(7, 0.1), (7, 0.3)]
    assert [(c.finetune.updates, c.finetune.lr) for c in full.cells] == [(6000, 0.2), (6000, 0.3)]


def test_a_cells_digest_follows_what_it_computes_not_how_runs_are_scheduled():
    ablations = {"scale": "small", "scales": {"small": {}}, "axes": {"x": {"cells": {"a": {}}}}}
    cell = plan_with(ablations, "x").cells[0]
    assert plan_with(ablations, "x", finetune={"workers": 3, "seeds": [5], "runs": ["rl-only"]}).cells[0].digest(0) == cell.digest(0)
    assert plan_with(ablations, "x", finetune={"lr": 0.5}).cells[0].digest(0) != cell.digest(0) != cell.digest(1)


def test_a_network_override_that_repeats_the_presets_value_is_the_reference_not_a_new_cell():
    def cell(axis, label):
        return next(c for c in plan_of(axis).cells if c.label == label)
    reference = cell("pretraining", "sl-rl")  # the per-job network: 2 x 128, one-hot job types
    for axis, label in [("layers", "2"), ("width", "128"), ("window", "20"), ("job-type", "one-hot"), ("teacher", "drf")]:
        assert cell(axis, label).digest(0) == reference.digest(0), (axis, label)
    for axis, label in [("layers", "3"), ("width", "64"), ("window", "30"), ("job-type", "integer")]:
        assert cell(axis, label).digest(0) != reference.digest(0), (axis, label)
    paper_net = cell("batch-norm", "off")  # the paper's network has no batch norm of its own: `off` repeats it
    assert paper_net.digest(0) == replace(paper_net, settings=replace(paper_net.settings, batch_norm=None)).digest(0)


def _with(axis_spec=None, **section):
    return {"scale": "small", "scales": {"small": {}}, "axes": {"x": axis_spec or {"cells": {"a": {}}}}, **section}


@pytest.mark.parametrize("ablations, axis, key", [
    (_with(), "y", "ablations.axes"),
    (_with({"cells": {}}), "x", "ablations.axes.x.cells"),
    (_with({"cells": {"a": {"run": "best"}}}), "x", "ablations.axes.x.cells.a.run"),
    (_with({"cells": {"a": {"network": {}}}}), "x", "ablations.axes.x.cells.a: network"),
    (_with({"cells": {"a": {"finetune": {"lr": "fast"}}}}), "x", "ablations.axes.x.cells.a: finetune.lr"),
    (_with({"cells": {"a": {"learn": {"arrivals": "bursty"}}}}), "x", "ablations.axes.x.cells.a: learn.arrivals"),
    (_with({"cells": {"a": {"learn": {"speed_noise": 1.5}}}}), "x", "ablations.axes.x.cells.a: learn.speed_noise"),
    (_with({"cells": {"a": {}}, "reference": "b"}), "x", "ablations.axes.x.reference"),
    (_with({"cells": {"a": {}}, "scales": {"huge": {}}}), "x", "ablations.axes.x.scales"),
    (_with({"cells": {"a": {}}, "scales": {"small": {"finetune": {"updates": 0}}}}), "x", "ablations.axes.x.cells.a: finetune.updates"),
    (_with(scale="huge"), "x", "ablations.scale"),
    (_with(seeds=[0, 0]), "x", "ablations.seeds"),
    (_with(workers=-1), "x", "ablations.workers"),
])
def test_a_bad_ablation_names_the_cell_and_key(ablations, axis, key):
    with pytest.raises(Dl2Error, match="params.yaml: " + key.replace(".", r"\.")):
        plan_with(ablations, axis)


def test_an_unknown_group_or_a_group_of_unknown_axes_is_refused():
    settings = ab_plan.ablation_settings({"seeds": [0], "workers": 1, **_with(groups={"g": ["x"]})}, "params.yaml")
    with pytest.raises(Dl2Error, match=r"ablations\.groups: no group 'z'"):
        ab_plan.group_plans(settings, "z", PARAMS, PRESETS, "params.yaml")
    settings = replace(settings, groups={"g": ["x", "nope"]})
    with pytest.raises(Dl2Error, match=r"ablations\.groups\.g"):
        ab_plan.group_plans(settings, "g", PARAMS, PRESETS, "params.yaml")


@pytest.mark.slow
def test_a_stored_cell_result_is_reused_and_a_stale_one_is_not(tmp_path):
    cell = plan_of("pretraining").cells[0]
    stored = {"digest": cell.digest(0), "cell": cell.label, "seed": 0, "val_jct_greedy": 1.5}
    (tmp_path / f"{cell.label}-s0.json").write_text(json.dumps(stored))
    assert ab_cells.stored_result(cell, 0, tmp_path) == stored  # resumed: nothing to train
    sl_only = next(c for c in plan_of("pretraining").cells if c.run == "sl-only")
    (tmp_path / f"{sl_only.label}-s0.json").write_text(json.dumps({**stored, "digest": "stale"}))
    assert ab_cells.stored_result(sl_only, 0, tmp_path) is None
    result = ab_cells.run_cell(sl_only, 0, tmp_path)
    assert result["digest"] == sl_only.digest(0) and np.isfinite(result["val_jct_greedy"]) and result["history"] == {}
    measured = workflow.scenario(sl_only.settings)
    _, validation = workflow.split_traces(sl_only.settings, measured)
    assert result["teacher"] == np.mean([simulate_builtin(t, "drf", measured).jct.mean() for t in validation])  # the cell's teacher


@pytest.mark.slow
def test_a_group_in_two_worker_processes_gives_the_results_of_one_process(tmp_path):
    pretraining, job_type = plan_of("pretraining"), plan_of("job-type")  # two axes of one group, cheap cells (pretraining only)
    plans = [replace(pretraining, cells=tuple(c for c in pretraining.cells if c.run == "sl-only")),
             replace(job_type, cells=tuple(replace(c, run="sl-only") for c in job_type.cells))]
    serial = ab_cells.run_plans(plans, tmp_path / "serial", workers=1, progress=False)
    parallel = ab_cells.run_plans(plans, tmp_path / "parallel", workers=2, progress=False)
    assert list(parallel) == ["pretraining", "job-type"] and [r["cell"] for r in parallel["job-type"]] == ["one-hot", "integer"]
    assert parallel == serial
    assert (tmp_path / "parallel" / "job-type" / "integer-s0.json").is_file()


def test_cells_that_compute_the_same_in_two_axes_train_once(tmp_path, monkeypatch):
    pretraining = plan_of("pretraining")
    sl_only = next(c for c in pretraining.cells if c.run == "sl-only")
    plans = [replace(pretraining, cells=(sl_only,)),
             replace(pretraining, axis="again", cells=(replace(sl_only, axis="again", label="same"),))]
    trained = []
    run_cell = ab_cells.run_cell
    monkeypatch.setattr(ab_cells, "run_cell", lambda cell, *args: trained.append(cell.label) or run_cell(cell, *args))
    results = ab_cells.run_plans(plans, tmp_path, workers=1, progress=False)
    assert trained == ["sl-only"]
    (first,), (again,) = results["pretraining"], results["again"]
    assert (again["axis"], again["cell"]) == ("again", "same") and again["val_jct_greedy"] == first["val_jct_greedy"]
    assert json.loads((tmp_path / "again" / "same-s0.json").read_text()) == again
    trained.clear()
    assert ab_cells.run_plans(plans, tmp_path, workers=1, progress=False) == results and trained == []  # resumed as stored


def test_cells_that_pretrain_alike_share_one_pretrained_policy_and_the_result_is_the_same(tmp_path):
    prioritized, uniform = plan_of("replay").cells[:2]  # they differ only in fine-tuning
    ab_cells.run_cell(prioritized, 0, tmp_path / "shared" / "replay")
    stored = list((tmp_path / "shared" / "pretrained").glob("*.pt"))
    reused = ab_cells.run_cell(uniform, 0, tmp_path / "shared" / "replay")
    assert list((tmp_path / "shared" / "pretrained").glob("*.pt")) == stored and len(stored) == 1
    fresh = ab_cells.run_cell(uniform, 0, tmp_path / "alone" / "replay")
    for result in (fresh, reused):
        del result["history"]["seconds"]  # wall time
    assert json.dumps(fresh, sort_keys=True) == json.dumps(reused, sort_keys=True)  # NaN-safe


def test_summary_compares_every_cell_with_the_reference():
    results = pd.DataFrame([{"cell": c, "seed": s, "val_jct_greedy": j, "val_jct_sampled": j, "lower_bound": 5.0, "optimus": 6.5}
                            for c, js in (("full", (6.0, 6.2)), ("no-replay", (7.5, 8.1))) for s, j in enumerate(js)])
    table = tables.summary(results, "full").set_index("cell")
    assert table.loc["full", "vs_reference"] == 0.0
    assert table.loc["no-replay", "vs_reference"] == pytest.approx(7.8 / 6.1 - 1)
    assert table.loc["no-replay", "sd"] == pytest.approx(np.std([7.5, 8.1], ddof=1))
    assert table.loc["full", "ratio_to_bound"] == pytest.approx(1.22)
    assert table.loc["full", "vs_optimus"] == pytest.approx(6.1 / 6.5 - 1) and "vs_teacher" not in table
    with_teacher = tables.summary(results.assign(teacher=[10.0, 10.0, 7.0, 7.0]), "full").set_index("cell")
    assert with_teacher.loc["no-replay", "vs_teacher"] == pytest.approx(7.8 / 7.0 - 1)
    assert list(with_teacher.columns) == [*table.columns[:-4], "teacher", *table.columns[-4:-1], "vs_teacher", "reference"]


def test_the_results_table_has_the_teachers_jct_only_when_every_result_measured_it():
    row = {"axis": "teacher", "cell": "fifo", "run": "sl-rl", "seed": 0, "val_jct_greedy": 6.0, "val_jct_sampled": 6.1,
           "lower_bound": 5.5, "optimus": 6.5}
    assert list(tables.results_table([{**row, "teacher": 9.0}, {**row, "seed": 1, "teacher": 9.0}]).teacher) == [9.0, 9.0]
    assert "teacher" not in tables.results_table([{**row, "teacher": 9.0}, {**row, "seed": 1}])


def test_curves_have_one_column_order_for_fresh_and_stored_results():
    fresh = {"cell": "a", "seed": 0, "history": {"update": [10, 20], "val_jct_greedy": [9.0, 8.0], "decisions": [5, 9]}}
    stored = json.loads(json.dumps(fresh, sort_keys=True))
    assert list(stored["history"]) != list(fresh["history"])
    pd.testing.assert_frame_equal(tables.curves([fresh]), tables.curves([stored]))
    assert list(tables.curves([fresh]).columns[:3]) == ["cell", "seed", "update"]


def test_convergence_times_every_cell_to_one_target_the_worst_cells_best_plus_five_percent():
    curve = pd.DataFrame({"cell": ["1"] * 4 + ["8"] * 4, "seed": 0, "update": [10, 20, 30, 40] * 2,
                          "decisions": [1, 2, 3, 4, 8, 16, 24, 32], "seconds": [1.0, 2.0, 3.0, 4.0, 5.0, 9.0, 13.0, 17.0],
                          "val_jct_greedy": [9.0, 6.6, 6.4, 6.3, 9.0, 6.5, 6.0, 5.8]})
    table = tables.convergence(curve).set_index("cell")
    # cell 1's best (6.3) is the worse: the target is 6.615, which cell 1 reaches at update 20 and cell 8 at 20 too;
    # timing each to within 5% of its own best would have had cell 8 (best 5.8, target 6.09) at update 30
    assert table.target.tolist() == pytest.approx([6.615, 6.615])
    assert table.loc["1"].to_dict() == pytest.approx({"seed": 0, "target": 6.615, "update": 20, "decisions": 2, "seconds": 2.0})
    assert table.loc["8"].to_dict() == pytest.approx({"seed": 0, "target": 6.615, "update": 20, "decisions": 16, "seconds": 9.0})


def test_cluster_claims_compare_updates_wall_time_and_samples_against_one_cluster():
    convergence = pd.DataFrame({"cell": ["1", "1", "4", "4"], "seed": [0, 1, 0, 1], "target": 6.0,
                                "update": [80, 80, 20, 20], "decisions": [80, 80, 80, 80], "seconds": [80.0, 80.0, 60.0, 100.0]})
    claims = {c["claim"].split("in ")[-1]: c for c in rep.cluster_claims(convergence)}
    assert claims["updates (x)"] | {"ours": round(claims["updates (x)"]["ours"], 6)} == {
        "source": "parallel clusters", "claim": "4 clusters reach the target faster than 1, in updates (x)",
        "paper": 4.0, "ours": 4.0, "status": "reproduced"}
    assert claims["wall time (x)"]["ours"] == pytest.approx(1.0) and claims["wall time (x)"]["status"] == "not reproduced"
    assert claims["samples (x)"]["paper"] == 1.0 and claims["samples (x)"]["status"] == "reproduced"
    assert rep.cluster_claims(convergence[convergence.cell == "4"]) == []


def test_cluster_claims_add_the_wall_time_with_a_cpu_per_cluster_from_the_clusters_bench():
    convergence = pd.DataFrame({"cell": ["1", "2"], "seed": [0, 0], "target": 6.0, "update": [50, 80],
                                "decisions": [50, 160], "seconds": [20.0, 60.0]})
    timing = {"to_published_target": {"1": {"speedup_vs_1": 1.0}, "2": {"speedup_vs_1": 0.7}}}
    claims = rep.cluster_claims(convergence, timing)
    assert len(claims) == len(rep.CLUSTER_MEASURES) + 1
    assert claims[-1] == {"source": "parallel clusters", "claim": "2 clusters reach the target faster than 1, in wall time, "
                          "a CPU each (x)", "paper": 2.0, "ours": 0.7, "status": "not reproduced"}
    assert rep.cluster_claims(convergence, {"to_published_target": {}}) == rep.cluster_claims(convergence)


def test_a_malformed_clusters_bench_report_names_its_file(tmp_path):
    broken = tmp_path / "clusters.json"
    broken.write_text("{not json")
    with pytest.raises(Dl2Error, match="clusters.json: not JSON"):
        rep.optional_json(broken)
    assert rep.optional_json(tmp_path / "absent.json") is None


@pytest.mark.parametrize("paper, ours, every_seed, expected", [
    (0.3, 0.28, True, "reproduced"), (0.3, 0.5, True, "reproduced"), (0.3, 0.1, True, "direction only"),
    (0.3, 0.1, False, "not reproduced"), (0.3, -0.1, True, "not reproduced"), (0.3, float("nan"), True, "not run")])
def test_a_claims_status(paper, ours, every_seed, expected):
    assert rep.status(paper, ours, every_seed) == expected


def test_table2_claims_read_the_ablations_cells_without_the_part_seed_by_seed():
    jcts = {"replay": {"prioritized": (6.0, 8.0), "off": (7.0, 10.0)},   # worse in both seeds
            "critic": {"slot": (6.0, 8.0), "off": (7.2, 7.8)},           # worse on average, better in seed 1
            "reward": {"slot": (6.0, 8.0), "job": (5.9, 7.0)},           # better
            "ppo-critic": {"slot": (6.0, 8.0), "off": (12.0, 12.0)}}     # dl2's PPO without its critic: far worse
    results = {axis: pd.DataFrame([{"cell": c, "seed": s, "val_jct_greedy": j, "val_jct_sampled": j, "lower_bound": 5.0, "optimus": 6.5}
                                   for c, js in cells.items() for s, j in enumerate(js)]) for axis, cells in jcts.items()}
    summaries = {axis: tables.summary(frame, next(iter(jcts[axis]))) for axis, frame in results.items()}
    paper = {"per_action_reward": 0.291, "no_critic": 0.211, "no_job_aware_exploration": 0.288, "no_experience_replay": 0.396}
    claims = {c["claim"].split(":")[0]: c for c in rep.table2_claims(summaries, paper, results)}
    assert claims["no experience replay"]["ours"] == pytest.approx(17 / 14 - 1)
    assert claims["no experience replay"]["status"] == "direction only" and claims["no experience replay"]["every_seed"]
    assert claims["no critic"]["ours"] == pytest.approx(0.0714, abs=1e-3) and claims["no critic"]["status"] == "not reproduced"
    assert claims["per action reward"]["status"] == "not reproduced"
    assert claims["no job aware exploration"]["status"] == "not run" and claims["no job aware exploration"]["every_seed"] is None
    (ppo,) = rep.table2_claims(summaries, paper, results, rep.TABLE2_PPO, "Table 2 (PPO)")
    assert ppo["source"] == "Table 2 (PPO)" and ppo["claim"].startswith("no critic")
    assert ppo["ours"] == pytest.approx(24 / 14 - 1) and ppo["status"] == "reproduced" and ppo["every_seed"]


def test_the_html_report_is_one_self_contained_page():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    page = rep.html_report("t <1>", [("s", [rep.paragraph("a & b"), rep.figure_html(fig)])])
    assert page.startswith("<!DOCTYPE html>") and "t &lt;1&gt;" in page and "a &amp; b" in page
    assert "data:image/png;base64," in page and "src=\"http" not in page


def test_the_published_report_ranks_every_built_in_of_the_scoreboard():
    files = rep.report_files(repo_root() / "data", published=True)
    board = rep.read_scoreboard(files.scoreboard)
    published = json.loads(files.scoreboard.read_text())["parts"]
    assert len(board) == sum(len(policies) for policies in published.values())
    dev = board[board.part == "ps-worker/dev"]
    assert dev.policy.iloc[0] == "dl2" and dev["rank"].tolist() == list(range(1, len(dev) + 1))
    assert board[board.part.str.startswith("pollux/")].x_capacity.isna().all()
    (heading, blocks), = rep._scoreboard_sections(board)
    html = "".join(blocks)
    assert "scoreboard" in heading and "NaN" not in html and "ps-worker/dev" in html and "<td>-</td>" in html
    assert rep._scoreboard_sections(rep.read_scoreboard(None)) == []
