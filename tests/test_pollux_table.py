"""The Pollux world's table (issue 35) on small synthetic runs: means over workloads then over seeds, the spread,
the bound, each target failing on its own, comparisons in words, and missing cells named."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from dl2.cli import main
from dl2.errors import Dl2Error
from dl2.paths import write_csv_atomic
from dl2.pollux import table
from dl2.pollux.grid import LOADS, WORKLOADS
from dl2.publish import POLLUX_TABLE_FILES, publish_pollux_table

CELLS = [(load, w) for load in LOADS for w in (1, 2)]
SEEDS = {"dl2-tuned": (0, 1, 2), "dl2-pollux-batch": (0, 1, 2), "pollux": (0, 1, 2), "optimus": (0,), "tiresias": (0,)}
BASE = {"dl2-tuned": 900.0, "dl2-pollux-batch": 700.0, "pollux": 700.0, "optimus": 1000.0, "tiresias": 1100.0}


def _summary(jct=None, cells=CELLS) -> pd.DataFrame:
    """Every policy on every cell: the average JCT `jct(policy, load, workload, seed)` (default: the policy's base,
    plus 10 per workload above 1 and 10 per seed), the other measures fixed."""
    jct = jct or (lambda p, load, w, s: BASE[p] + 10 * (w - 1) + 10 * s)
    rows = [{"policy": p, "load": load, "workload": w, "seed": s, "avg_jct": jct(p, load, w, s), "makespan": 5000.0 + s,
             "restarts_per_job": 1.0, "mean_gpu_util": 0.5}
            for p, seeds in SEEDS.items() for load, w in cells for s in seeds]
    return pd.DataFrame(rows)


def _bound(cells=CELLS) -> pd.DataFrame:
    return pd.DataFrame({"load": [c[0] for c in cells], "workload": [c[1] for c in cells],
                         "avg_jct": [400.0 + 200 * (c[1] - 1) for c in cells], "makespan": [4000.0] * len(cells)})


def test_a_load_is_the_mean_over_workloads_then_over_seeds_with_its_spread():
    loads = table.loads_table(_summary(), _bound()).set_index(["policy", "load"])
    tuned = loads.loc[("dl2-tuned", "1.0")]
    per_seed = [905.0, 915.0, 925.0]  # (900 + 910) / 2 + 10 * seed
    assert tuned.avg_jct == pytest.approx(np.mean(per_seed)) and tuned.seeds == 3 and tuned.failed == 0
    assert tuned.avg_jct_sd == pytest.approx(np.std(per_seed, ddof=1))
    assert (tuned.avg_jct_min, tuned.avg_jct_max) == (905.0, 925.0)
    assert tuned.ratio_to_bound == pytest.approx(915.0 / 500.0)
    assert tuned.makespan == pytest.approx(5001.0) and tuned.mean_gpu_util == 0.5
    optimus = loads.loc[("optimus", "2.0")]
    assert optimus.seeds == 1 and math.isnan(optimus.avg_jct_sd) and optimus.avg_jct == 1005.0
    bound = loads.loc[("bound", "0.5")]
    assert bound.avg_jct == 500.0 and bound.ratio_to_bound == 1.0 and bound.makespan == 4000.0


def test_a_failed_run_makes_its_seed_and_the_load_nan_and_is_counted():
    summary = _summary(lambda p, load, w, s: np.nan if (p, load, w, s) == ("dl2-tuned", "1.0", 2, 1) else BASE[p])
    loads = table.loads_table(summary, _bound()).set_index(["policy", "load"])
    assert loads.loc[("dl2-tuned", "1.0")].failed == 1 and math.isnan(loads.loc[("dl2-tuned", "1.0")].avg_jct)
    assert loads.loc[("dl2-tuned", "0.5")].avg_jct == 900.0
    checks = table.target_checks(loads.reset_index())
    assert table.verdicts(checks)["tuned_below_baselines"] is False


def test_both_targets_hold_on_the_default_runs():
    checks = table.target_checks(table.loads_table(_summary(), _bound()))
    assert table.verdicts(checks) == {"tuned_below_baselines": True, "pollux_batch_near_pollux": False}  # 2.0x: equal, not below
    summary = _summary(lambda p, load, w, s: BASE[p] - (50 if p == "dl2-pollux-batch" and load == "2.0" else 0))
    checks = table.target_checks(table.loads_table(summary, _bound()))
    assert table.verdicts(checks) == {"tuned_below_baselines": True, "pollux_batch_near_pollux": True}


@pytest.mark.parametrize("policy, load, jct, failing", [
    ("dl2-tuned", "1.5", 1050.0, "tuned_below_baselines"),  # above Optimus+Oracle at one load, below Tiresias
    ("dl2-tuned", "0.5", 1000.0, "tuned_below_baselines"),  # equal is not below
    ("dl2-pollux-batch", "1.0", 736.0, "pollux_batch_near_pollux"),  # 5.1% above Pollux at 1.0x
    ("dl2-pollux-batch", "2.0", 701.0, "pollux_batch_near_pollux"),  # above Pollux at 2.0x
])
def test_each_target_fails_on_its_own(policy, load, jct, failing):
    def runs(p, x, w, s):
        if (p, x) == (policy, load):
            return jct
        return BASE[p] - (50 if p == "dl2-pollux-batch" and x == "2.0" else 0)

    checks = table.target_checks(table.loads_table(_summary(runs), _bound()))
    verdicts = table.verdicts(checks)
    assert verdicts[failing] is False
    assert all(v is True for name, v in verdicts.items() if name != failing)
    assert checks[checks.holds.eq(False)].load.tolist() == [load]


def test_within_five_percent_of_pollux_at_one_x_holds_at_the_limit():
    summary = _summary(lambda p, x, w, s: 735.0 if (p, x) == ("dl2-pollux-batch", "1.0") else BASE[p] - (p == "dl2-pollux-batch"))
    checks = table.target_checks(table.loads_table(summary, _bound()))
    assert table.verdicts(checks)["pollux_batch_near_pollux"] is True


def test_targets_on_loads_that_did_not_run_are_not_judged():
    summary, bound = _summary(), _bound()
    loads = table.loads_table(summary[summary.load == "0.5"], bound[bound.load == "0.5"])
    checks = table.target_checks(loads)
    assert set(loads.load) == {"0.5"} and checks.holds.notna().sum() == 2  # 0.5x against Optimus+Oracle and Tiresias
    assert table.verdicts(checks) == {"tuned_below_baselines": None, "pollux_batch_near_pollux": None}
    verdicts = table.verdicts(checks.assign(holds=[False, *checks.holds[1:]]))
    assert verdicts["tuned_below_baselines"] is False  # a known failure outweighs the loads not run


@pytest.mark.parametrize("drop, named", [
    (lambda f: (f.policy == "dl2-pollux-batch") & (f.seed == 2) & (f.load == "1.5") & (f.workload == 2),
     "dl2-pollux-batch seed 2: 1 cell(s) missing (1.5x w2)"),
    (lambda f: f.policy == "tiresias", "tiresias: no runs"),
    (lambda f: (f.policy == "optimus") & (f.load == "2.0"), "optimus seed 0: 2 cell(s) missing (2.0x w1, 2.0x w2)"),
])
def test_missing_cells_are_named(drop, named):
    summary = _summary()
    with pytest.raises(Dl2Error, match="every policy on every cell") as info:
        table.loads_table(summary[~drop(summary)], _bound())
    assert named in str(info.value)


def test_comparisons_say_where_dl2_wins_and_loses_with_the_spread():
    loads = table.loads_table(_summary(), _bound())
    comps = table.comparisons(loads).set_index(["policy", "baseline", "load"])
    assert comps.loc[("dl2-tuned", "optimus", "1.0")].outcome == "wins"
    assert comps.loc[("dl2-tuned", "optimus", "1.0")].every_seed  # DL2's worst seed, 925, below Optimus+Oracle's 1005
    close = comps.loc[("dl2-pollux-batch", "pollux", "1.0")]
    assert close.outcome == "loses" and not close.every_seed  # equal means: not below, and within the spread
    loses = comps.loc[("dl2-tuned", "pollux", "1.0")]
    assert loses.outcome == "loses" and loses.every_seed  # 905..925 above Pollux's 705..725
    assert loses.change == pytest.approx(915.0 / 715.0 - 1)
    words = table.sentences(comps.reset_index())
    assert "At 1.0x, DL2 + tuned averages 915 s (sd 10 over 3 seeds), 28.0% above Pollux's 715 s (sd 10 over 3 seeds): " \
           "DL2 loses, in every seed." in words
    assert any("Optimus+Oracle's 1,005 s (one run): DL2 wins" in s for s in words)
    assert any("1.83x the lower bound's 500 s" in s for s in words)


def test_markdown_and_metrics_carry_every_policy_and_the_verdicts():
    loads = table.loads_table(_summary(), _bound())
    checks = table.target_checks(loads)
    text = table.markdown(loads, checks, table.comparisons(loads), "full")
    assert "| DL2 + tuned | 915 ± 10 (905–925) |" in text and "| lower bound | 500 |" in text
    assert "does not hold" in text and "Optimus+Oracle alone has an oracle" in text
    out = table.metrics(loads, checks, "full")
    assert out["targets"] == table.verdicts(checks) and out["loads"]["optimus@1.0"]["avg_jct_sd"] is None
    assert out["loads"]["dl2-tuned@1.0"]["avg_jct_sd"] == 10.0 and out["scale"] == "full"


def _stage_output(data, scale="full", seeds=(0, 1, 2)) -> None:
    """What the pollux-dl2 stage writes on every cell of the grid, and the published grid's summary beside it."""
    cells = [(load, w) for load in LOADS for w in WORKLOADS]
    summary = _summary(cells=cells)
    dl2 = summary[summary.policy.isin(table.DL2_POLICIES) & summary.seed.isin(seeds)]
    write_csv_atomic(data / "published" / "pollux" / "summary.csv", summary[~summary.policy.isin(table.DL2_POLICIES)])
    write_csv_atomic(data / "pollux-dl2" / "summary.csv", dl2)
    table.write(table.build(dl2, summary, _bound(cells), scale), data / "pollux-dl2")


def test_publish_copies_a_full_scale_table_beside_the_grid(tmp_path, capsys):
    _stage_output(tmp_path)
    assert main(["publish", "--pollux-table", "--data-dir", str(tmp_path)]) == 0
    assert f"published {len(POLLUX_TABLE_FILES)} files" in capsys.readouterr().out
    published = tmp_path / "published" / "pollux"
    for name, source in POLLUX_TABLE_FILES.items():
        assert (published / name).read_bytes() == (tmp_path / "pollux-dl2" / source).read_bytes()
    assert "| DL2 + tuned |" in (published / "table.md").read_text()


@pytest.mark.parametrize("setup, named", [
    (lambda d: _stage_output(d, scale="reduced"), "a reduced run; only the full scale is published"),
    (lambda d: _stage_output(d, seeds=(0, 1)), "seeds run: dl2-tuned (2), dl2-pollux-batch (2)"),
    (lambda d: (_stage_output(d), (d / "pollux-dl2" / "metrics.json").write_text('{"scale": "full"}')), "does not follow"),
    (lambda d: (_stage_output(d), (d / "pollux-dl2" / "table.md").unlink()), "table.md: no such file"),
])
def test_publish_refuses_a_reduced_short_stale_or_partial_run(tmp_path, setup, named):
    setup(tmp_path)
    with pytest.raises(Dl2Error, match=re.escape(named)):
        publish_pollux_table(tmp_path)
    assert not (tmp_path / "published" / "pollux" / "table.json").exists()


def test_the_report_states_the_published_table_from_its_numbers(tmp_path):
    from dl2 import reproduction as rep

    _stage_output(tmp_path)
    publish_pollux_table(tmp_path)
    published = rep.read_pollux_table(tmp_path / "published" / "pollux")
    assert rep.read_pollux_table(tmp_path) is None
    figure = table.figure(published.loads)
    (heading, blocks), = rep._pollux_table_sections(published, {"pollux_table": figure}, 60)
    page = "".join(blocks)
    assert "DL2 beside Pollux" in heading and "full scale" in page and "Optimus+Oracle alone has an oracle" in page
    assert "DL2 + tuned below Optimus+Oracle and Tiresias at every load: holds." in page
    assert "within 5% of Pollux at 1.0x and below at 2.0x: does not hold." in page
    assert "DL2 + tuned wins against Optimus+Oracle at 0.5, 1.0, 1.5, 2.0x; Tiresias at 0.5, 1.0, 1.5, 2.0x." in page
    assert "DL2 + tuned loses against Pollux at 0.5, 1.0, 1.5, 2.0x." in page
    assert "(sd 10 over 3 seeds)" in page and "data:image/png;base64," in page and "NaN" not in page


def test_the_bound_of_a_cell_is_its_jobs_alone_from_their_arrival():
    from dl2.pollux.bound import lower_bound_jct
    from dl2.pollux.grid import Cell
    from dl2.pollux.workload import read_workload
    from dl2.workload.presets import get_preset

    preset = get_preset("pollux")
    bound = table.bound_cells(preset, [("0.5", 5)])
    workload = read_workload(Cell("any", "0.5", 5, 0).path)
    jct = lower_bound_jct(workload, preset)
    assert bound.to_dict("records") == [{"load": "0.5", "workload": 5, "avg_jct": jct.mean(), "makespan": (workload.time + jct).max()}]
