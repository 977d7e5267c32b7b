"""The `pollux-dl2` stage and `dl2 pollux-train` (issue 35): the settings of each variant at each scale from
params.yaml's `pollux_dl2` section, errors that name the key or the flag, and DL2's runs as one summary."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import yaml

from dl2.cli import main
from dl2.config import load_params
from dl2.errors import Dl2Error
from dl2.learn.pollux import runs
from dl2.learn.pollux.settings import SHIPPED_SEEDS, PolluxTrainSettings
from dl2.learn.pollux.train import PolluxTrainResult
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
    assert full.seeds == (0, 1, 2) and [s.variant for s in full.settings] == ["tuned", "pollux-batch"]
    assert all(s.to_dict() == {**full.settings[0].to_dict(), "variant": s.variant} for s in full.settings)
    assert len(full.settings[0].train_seeds) == 8
    assert len(full.settings[0].eval_loads) * len(full.settings[0].eval_workloads) == 32
    assert not set(full.settings[0].train_seeds) & set(SHIPPED_SEEDS)
    reduced = _stage(tmp_path, scale="reduced")
    assert reduced.seeds == tuple(section["reduced_seeds"]) and len(reduced.settings) == 2
    for settings in reduced.settings:
        for key in PolluxTrainSettings().to_dict():
            expected = settings.variant if key == "variant" else section["reduced"].get(key, section["run"].get(key))
            if key == "eval_loads":
                expected = [f"{x:.1f}" for x in expected]
            assert settings.to_dict()[key] == expected, key
    assert reduced.settings[0].eval_loads == ("0.5",) and reduced.settings[0].eval_workloads == (5,)  # pollux-baselines' cell
    assert full.preset.name == reduced.preset.name == "pollux"


@pytest.mark.parametrize("change, named", [
    (lambda s: s["run"].pop("window"), "pollux_dl2.run.window is missing"),
    (lambda s: s["run"].update(window=0), "pollux_dl2.run.window: must be positive"),
    (lambda s: s["reduced"].update(teacher="pollux"), "pollux_dl2.reduced.teacher: expected one of"),
    (lambda s: s["reduced"].update(eval_loads=[0.7]), "pollux_dl2.reduced.eval_loads: load: "),
    (lambda s: s["run"].update(train_seeds=[3]), "pollux_dl2.run.train_seeds: "),
    (lambda s: s.update(variants=["goodput"]), "pollux_dl2.variants: "),
    (lambda s: s.update(variants=[]), "pollux_dl2.variants: expected a non-empty list"),
    (lambda s: s["run"].update(variant="tuned"), "pollux_dl2.run.variant: the variants are pollux_dl2.variants"),
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
    (["--variant", "goodput"], "--variant: expected one of"),
])
def test_the_command_refuses_a_bad_flag_naming_it_before_training(tmp_path, capsys, flags, named):
    assert main(["pollux-train", "--out", str(tmp_path / "out"), *flags]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_runs_are_one_summary_in_the_baselines_format_keyed_by_variant_and_seed():
    def run(variant, jct):
        evaluation = pd.DataFrame({"policy": f"dl2-{variant}", "load": ["0.5", "1.0"], "workload": [5, 1], "avg_jct": jct,
                                   "makespan": 9.0, "error": ["", "late"]})
        history = pd.DataFrame({"epoch": [0]})
        return PolluxTrainResult(None, history, history, evaluation, evaluation, {})

    results = {("tuned", 0): run("tuned", [1.0, np.nan]), ("tuned", 1): run("tuned", [2.0, 3.0]),
               ("pollux-batch", 0): run("pollux-batch", [4.0, 5.0])}
    summary = runs.summary(results)
    assert list(summary.columns[:4]) == ["policy", "load", "workload", "seed"] and "makespan" in summary.columns
    assert summary.groupby("policy").seed.unique().map(list).to_dict() == {"dl2-tuned": [0, 1], "dl2-pollux-batch": [0]}
    pretrain, _ = runs.histories(results)
    assert list(zip(pretrain.variant, pretrain.seed)) == list(results)
