"""The `pollux-dl2` stage and `dl2 pollux-train` (issue 35): the settings at each scale from params.yaml's
`pollux_dl2` section, errors that name the key or the flag, and the tables set beside the baselines."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from dl2.cli import main
from dl2.config import load_params
from dl2.errors import Dl2Error
from dl2.learn.pollux.runs import cells_table, loads_table, stage_metrics
from dl2.learn.pollux.settings import SHIPPED_SEEDS, PolluxTrainSettings
from dl2.paths import repo_root
from dl2.stages import load_stage

PARAMS = load_params(repo_root() / "params.yaml")


def _stage(tmp_path, change=None, **overrides):
    params = copy.deepcopy(PARAMS)
    if change:
        change(params["pollux_dl2"])
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return load_stage("pollux-dl2", path, {"pollux_dl2": overrides} if overrides else None).config


def test_the_full_scale_is_the_issues_run_and_the_reduced_one_replaces_only_its_keys(tmp_path):
    section = PARAMS["pollux_dl2"]
    full = _stage(tmp_path, scale="full")
    assert full.seeds == (0, 1, 2) and len(full.settings.train_seeds) == 8
    assert len(full.settings.eval_loads) * len(full.settings.eval_workloads) == 32
    assert not set(full.settings.train_seeds) & set(SHIPPED_SEEDS)
    reduced = _stage(tmp_path, scale="reduced")
    assert reduced.seeds == tuple(section["reduced_seeds"])
    for key in PolluxTrainSettings().to_dict():
        expected = section["reduced"].get(key, section["run"][key])
        if key == "eval_loads":
            expected = [f"{x:.1f}" for x in expected]
        assert reduced.settings.to_dict()[key] == expected, key
    assert reduced.settings.eval_loads == ("0.5",) and reduced.settings.eval_workloads == (5,)  # pollux-baselines' cell
    assert full.preset.name == reduced.preset.name == "pollux"


@pytest.mark.parametrize("change, named", [
    (lambda s: s["run"].pop("window"), "pollux_dl2.run.window is missing"),
    (lambda s: s["run"].update(window=0), "pollux_dl2.run.window: must be positive"),
    (lambda s: s["reduced"].update(teacher="pollux"), "pollux_dl2.reduced.teacher: expected one of"),
    (lambda s: s["reduced"].update(eval_loads=[0.7]), "pollux_dl2.reduced.eval_loads: load: "),
    (lambda s: s["run"].update(train_seeds=[3]), "pollux_dl2.run.train_seeds: "),
    (lambda s: s["run"].update(variant="goodput"), "pollux_dl2.run.variant: expected one of"),
    (lambda s: s["run"].update(eval_workloads=[9]), "pollux_dl2.run.eval_workloads: "),
    (lambda s: s["reduced"].update(widow=3), "pollux_dl2.reduced.widow: unknown key"),
])
def test_a_bad_setting_is_refused_naming_the_file_and_key(tmp_path, change, named):
    with pytest.raises(Dl2Error, match=str(tmp_path / "params.yaml")) as info:
        _stage(tmp_path, change)
    assert named in str(info.value)


@pytest.mark.parametrize("flags, named", [
    (["--window", "0"], "--window: must be positive"),
    (["--teacher", "pollux"], "--teacher: expected one of"),
    (["--train-seeds", "2"], "--train-seeds: "),
    (["--eval-loads", "0.7"], "--eval-loads: load: "),
    (["--eval-workloads", "0"], "--eval-workloads: "),
    (["--seed", "-1"], "--seed: "),
])
def test_the_command_refuses_a_bad_flag_naming_it_before_training(tmp_path, capsys, flags, named):
    assert main(["pollux-train", "--out", str(tmp_path / "out"), *flags]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _evaluation() -> pd.DataFrame:
    rows = [("0.5", 5, 0, 1000.0), ("0.5", 5, 1, 3000.0), ("1.0", 1, 0, 4000.0), ("1.0", 1, 1, float("nan")),
            ("1.0", 2, 0, 6000.0), ("1.0", 2, 1, 8000.0)]
    return pd.DataFrame(rows, columns=["load", "workload", "seed", "avg_jct"])


def test_cells_and_loads_are_means_over_seeds_and_workloads_beside_the_baselines():
    baselines = pd.DataFrame({"load": ["0.5", "1.0", "1.0"], "workload": [5, 1, 2], "optimus": [1000.0, 2000.0, 4000.0],
                              "tiresias": [500.0, 1000.0, 1000.0], "pollux": [400.0, 800.0, 1600.0]})
    cells = cells_table(_evaluation(), baselines).set_index(["load", "workload"])
    assert cells.loc[("0.5", 5), "dl2"] == 2000.0 and cells.loc[("0.5", 5), "dl2_std"] == 1000.0  # spread over seeds
    assert cells.loc[("1.0", 1), "dl2"] == 4000.0 and cells.loc[("1.0", 1), "failed"] == 1  # the finished seed's
    assert cells.loc[("1.0", 2), "ratio_to_optimus"] == 7000.0 / 4000.0
    loads = loads_table(cells.reset_index()).set_index("load")
    assert loads.loc["1.0", "dl2"] == 5500.0 and loads.loc["1.0", "optimus"] == 3000.0 and loads.loc["1.0", "workloads"] == 2
    assert loads.loc["1.0", "ratio_to_pollux"] == 5500.0 / 1200.0
    metrics = stage_metrics(cells.reset_index(), loads.reset_index(), [0, 1])
    assert metrics["failed_runs"] == 1 and metrics["cells"] == 3 and metrics["seeds"] == [0, 1]
    assert metrics["loads"]["0.5"]["ratio_to_tiresias"] == 4.0


def test_a_cell_no_seed_finished_is_written_as_null():
    evaluation = _evaluation().assign(avg_jct=lambda f: np.where(f.workload == 1, np.nan, f.avg_jct))
    cells = cells_table(evaluation[evaluation.load == "1.0"].query("workload == 1"))
    assert math.isnan(cells["dl2"].item())
    metrics = stage_metrics(cells, loads_table(cells), [0, 1])
    assert metrics["loads"]["1.0"]["dl2"] is None and metrics["failed_runs"] == 2
    assert metrics["loads"]["1.0"]["optimus"] > 0  # the published baseline of that cell
