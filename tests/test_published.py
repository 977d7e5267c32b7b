"""The committed full-scale results (`data/published/`): DVC metrics that follow from the committed raw results."""

import json

import pandas as pd
import pytest
import yaml

from dl2.learn.ablations import tables as ab
from dl2.learn.evaluate import summary_metrics, summary_table
from dl2.paths import repo_root

PUBLISHED = repo_root() / "data" / "published"
TOP_LEVEL_METRICS = yaml.safe_load((repo_root() / "dvc.yaml").read_text()).get("metrics", [])


def test_every_published_metrics_file_is_a_dvc_metric_and_documented():
    files = sorted(p.relative_to(repo_root()).as_posix() for p in PUBLISHED.rglob("*.json"))
    assert files and files == sorted(TOP_LEVEL_METRICS)
    readme = (PUBLISHED / "README.md").read_text()
    assert all(f"## `{f.split('/')[2]}/`" in readme for f in files), "each folder has a section: its command and files"


@pytest.mark.parametrize("preset", ["paper", "paper-long", "dev", "paper-large"])
def test_published_evaluation_metrics_follow_from_its_per_trace_results(preset):
    folder = PUBLISHED / preset
    metrics = json.loads((folder / "metrics.json").read_text())
    per_policy = {policy: value for policy, value in metrics.items() if isinstance(value, dict)}
    assert per_policy == summary_metrics(summary_table(pd.read_csv(folder / "results.csv")))


@pytest.mark.parametrize("preset", sorted(p.parent.name for p in PUBLISHED.glob("*/generalisation.csv")))
def test_published_generalisation_metrics_follow_from_its_per_trace_results(preset):
    from dl2.learn.generalisation import shift_metrics, shift_table

    folder = PUBLISHED / preset
    metrics = json.loads((folder / "generalisation.json").read_text())
    assert metrics == shift_metrics(shift_table(pd.read_csv(folder / "generalisation.csv")))


@pytest.mark.parametrize("group", sorted(p.stem.removeprefix("ablate-") for p in (PUBLISHED / "ablations").glob("ablate-*.json")))
def test_published_ablation_metrics_follow_from_its_per_seed_results(group):
    metrics = json.loads((PUBLISHED / "ablations" / f"ablate-{group}.json").read_text())
    for axis, entry in metrics.items():
        results = pd.read_csv(PUBLISHED / "ablations" / axis / "results.csv", dtype={"cell": str})
        summary = ab.summary(results, entry["reference"])
        assert entry == ab.axis_metrics(summary, entry["reference"], results.seed.nunique())
        published = pd.read_csv(PUBLISHED / "ablations" / axis / "summary.csv", dtype={"cell": str})
        pd.testing.assert_frame_equal(published, summary, check_exact=False, rtol=1e-12)


def test_published_testbed_metrics_follow_from_its_per_job_results():
    from dl2.publish import testbed_metrics

    folder = PUBLISHED / "testbed"
    jobs = pd.read_csv(folder / "evaluate" / "jobs.csv")
    assert len(jobs) and jobs.jct_testbed.notna().all(), "every job of the testbed run finished"
    assert json.loads((folder / "metrics.json").read_text()) == testbed_metrics(jobs, pd.read_csv(folder / "results.csv"))


def test_published_pollux_grid_follows_from_its_runs_and_holds_the_artifacts_tolerances():
    from dl2.pollux import grid

    folder = PUBLISHED / "pollux"
    summary = pd.read_csv(folder / "summary.csv", dtype={"load": str})
    cells = grid.cells_table(summary)
    loads, reductions = grid.loads_table(cells), grid.reductions_table(cells)
    assert json.loads((folder / "metrics.json").read_text()) == json.loads(json.dumps(grid.grid_metrics(cells, loads, reductions)))
    for name, table in (("cells", cells), ("loads", loads), ("reductions", reductions)):
        published = pd.read_csv(folder / f"{name}.csv", dtype={"load": str})
        pd.testing.assert_frame_equal(published, table, check_exact=False, rtol=1e-12, check_dtype=False)
    # the full grid: every policy, load and workload, Pollux over three seeds, and every verdict holds
    assert len(cells) == 96 and (cells[cells.policy == "pollux"].seeds >= grid.MIN_SEEDS).all()
    assert cells.within.all() and loads.within.all() and reductions.within.all()
    jobs = pd.read_csv(folder / "jobs.csv", dtype={"load": str})
    assert len(jobs) == sum(len(grid.Cell(**c).path.read_text().splitlines()) - 1
                            for c in summary[["policy", "load", "workload", "seed"]].to_dict("records"))


def test_a_published_pollux_table_follows_from_its_runs_the_grid_and_the_bound():
    from dl2.pollux import table

    folder = PUBLISHED / "pollux"
    if not (folder / "table.json").is_file():
        pytest.skip("no full-scale pollux-dl2 table published yet (docs/pollux.md#the-table)")
    bound = pd.read_csv(folder / "bound.csv", dtype={"load": str})
    rebuilt = table.build(table.read_summary(folder / "dl2_summary.csv"), table.read_summary(folder / "summary.csv"), bound, "full")
    assert json.loads((folder / "table.json").read_text()) == json.loads(json.dumps(rebuilt.metrics()))
    assert len(bound) == 32 and rebuilt.metrics()["scale"] == "full"
