"""The pipeline for real: papermill-executed notebooks, an MLflow store, and `dvc repro` on a copy; then
`dvc status` after an edit under every dependency, and every notebook run by hand with its defaults."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import nbformat
import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from dl2.errors import Dl2Error
from dl2.paths import repo_root
from dl2.stages import dvc_stages, run_stage, stage_names

pytestmark = pytest.mark.slow


def _tiny_params(path: Path) -> Path:
    params = yaml.safe_load((repo_root() / "params.yaml").read_text())
    params["traces"].update(presets=["paper"], num_traces=2)
    params["baselines"]["policies"] = ["drf", "optimus"]
    params["learn"].update(train_traces=3, validation_traces=2)
    params["pretrain"].update(epochs=1, eval_every=1)
    params["finetune"].update(updates=4, num_envs=2, batch_size=32, rollout_length=16, validate_every=2, checkpoint_every=2)
    params["pollux"].update(loads=[0.5], workloads=[5], reduced_loads=[0.5], reduced_workloads=[5], reduced_seeds=[0])
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture
def store(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    return MlflowClient(uri)


def test_a_failing_stage_is_marked_failed_and_leaves_no_notebook(tmp_path, store):
    params = _tiny_params(tmp_path / "params.yaml")
    data = tmp_path / "data"  # no traces: the baselines notebook fails
    with pytest.raises(Dl2Error, match="stage baselines: notebook failed"):
        run_stage("baselines", params, data, progress=False)
    assert not (data / "executed" / "baselines.ipynb").exists()
    (run,) = store.search_runs([store.get_experiment_by_name("dl2").experiment_id])
    assert run.info.status == "FAILED"


def test_a_stages_notebook_runs_on_the_keys_dl2_stage_read(tmp_path, store, monkeypatch):
    """`dl2 stage` reads the stage's params once and hands them to the notebook: the kernel does not read the
    params file again (here it is gone by the time the notebook starts)."""
    import dl2.notebooks

    params = _tiny_params(tmp_path / "params.yaml")
    data = tmp_path / "data"
    execute = dl2.notebooks.execute

    def once_read(*args, **kwargs):
        params.unlink()
        execute(*args, **kwargs)

    monkeypatch.setattr(dl2.notebooks, "execute", once_read)
    run_stage("traces", params, data, progress=False)
    assert not params.exists() and len(list((data / "traces" / "paper").glob("trace_*.csv"))) == 2


def _dvc(cwd: Path, *args: str) -> str:
    dvc = Path(sys.executable).with_name("dvc")
    done = subprocess.run([str(dvc), *args], cwd=cwd, capture_output=True, text=True, env=os.environ.copy())
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_dvc_repro_runs_once_then_only_what_a_parameter_touches(tmp_path, monkeypatch):
    root = repo_root()
    copy = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        if name.startswith("data/") and not name.startswith(("data/reference/", "data/published/", "data/testbed/")):
            continue
        if (root / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, copy / name)
    _tiny_params(copy / "params.yaml")
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    monkeypatch.setenv("DL2_ROOT", str(copy))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    first = _dvc(copy, "repro")
    names = stage_names()
    for name in names:
        assert f"Running stage '{name}'" in first
        assert (copy / "data" / "executed" / f"{name.replace('@', '-')}.ipynb").is_file()
    assert "KeyboardInterrupt" not in first and "without encryption" not in first  # a successful run is quiet
    assert len(list((copy / "data" / "traces" / "paper").glob("trace_*.csv"))) == 2
    for figure in ("avg_jct", "bound_ratio", "jct_cdf", "utilization"):
        assert (copy / "data" / "report" / f"{figure}.png").stat().st_size > 1000
    assert "metrics.json" in _dvc(copy, "metrics", "show")

    # one MLflow run per stage, in the SQLite store at the project root, in the training-runs view
    store = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    experiment = store.get_experiment_by_name("dl2")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    every_run = store.search_runs([experiment.experiment_id])
    runs = [r for r in every_run if "dl2.cell" not in r.data.tags]
    assert sorted(r.data.tags["dl2.stage"] for r in runs) == sorted(name.split("@")[0] for name in names)
    assert sorted(r.info.run_name for r in runs) == sorted(name.replace("@", "-") for name in names)  # no two alike
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.source.git.commit"]
        assert "notebook" in [a.path for a in store.list_artifacts(run.info.run_id)]
    baselines = next(r for r in runs if r.data.tags["dl2.stage"] == "baselines")
    assert baselines.data.params["baselines.policies"] == "drf,optimus"
    assert baselines.data.metrics["paper.drf.avg_jct"] > baselines.data.metrics["paper.optimus.avg_jct"]
    report = next(r for r in runs if r.data.tags["dl2.stage"] == "report")
    assert {"avg_jct.png", "utilization.png"} <= {Path(a.path).name for a in store.list_artifacts(report.info.run_id, "figures")}

    # the reduced ablation suite: one MLflow run per cell, nested under its group's stage run
    params = yaml.safe_load((copy / "params.yaml").read_text())["ablations"]
    cells = [r for r in every_run if "dl2.cell" in r.data.tags]
    for group, axes in params["groups"].items():
        stage_run = next(r for r in runs if r.data.tags.get("dl2.group") == group)
        for axis in axes:
            mine = {r.data.tags["dl2.cell"] for r in cells if r.data.tags["dl2.axis"] == axis}
            assert mine == set(params["axes"][axis]["cells"]), axis
            assert all(r.data.tags["mlflow.parentRunId"] == stage_run.info.run_id for r in cells if r.data.tags["dl2.axis"] == axis)
            summary = pd.read_csv(copy / "data" / "ablations" / group / axis / "summary.csv", dtype={"cell": str})
            assert list(summary.cell) == list(params["axes"][axis]["cells"]) and (summary.jct > 0).all()
    shifted = pd.read_csv(copy / "data" / "evaluate" / "generalisation.csv")  # every policy under every shift
    assert set(shifted["shift"]) == {"own", "arrivals-google", "arrivals-poisson", "load-50pct", "load-200pct", "cluster-dev",
                                     "cluster-paper-large"}
    assert {"dl2", "rl-only", "offline-rl", "sl-only", "drf", "optimus"} == set(shifted.policy)
    claims = pd.read_csv(copy / "data" / "reproduction" / "claims.csv")
    assert {"Fig. 9", "Table 2"} <= set(claims.source) and set(claims.status) <= {"reproduced", "direction only", "not reproduced"}
    report_html = (copy / "data" / "reproduction" / "report.html").read_text()
    assert report_html.startswith("<!DOCTYPE html>") and "data:image/png;base64," in report_html

    # the Pollux world: its three baselines on a shipped workload beside the artifact's numbers, in the report too
    pollux_cells = pd.read_csv(copy / "data" / "pollux" / "cells.csv", dtype={"load": str}).set_index("policy")
    assert sorted(pollux_cells.index) == ["optimus", "pollux", "tiresias"]
    assert pollux_cells.within[["optimus", "tiresias"]].tolist() == [True, True]  # deterministic: within 0.1%
    assert pollux_cells.within.isna()["pollux"]  # one seed: not judged
    pollux_run = next(r for r in runs if r.data.tags["dl2.stage"] == "pollux-baselines")
    assert pollux_run.data.metrics["within_tolerance"] == pollux_run.data.metrics["verdicts"] == 2
    assert (copy / "data" / "pollux" / "fig8a.png").stat().st_size > 1000
    assert "The Pollux world" in report_html

    # the same report on the committed full-scale results, which hold every Table 2 axis
    published = pd.read_csv(copy / "data" / "reproduction-published" / "claims.csv")
    assert {"Fig. 9", "Table 2"} <= set(published.source) and "not run" not in set(published.status)
    published_html = (copy / "data" / "reproduction-published" / "report.html").read_text()
    assert "committed full-scale results" in published_html
    assert "NaN" not in re.sub(r'src="data:image/png;base64,[^"]*"', "", published_html)  # read by people: no NaN
    published_axes = [folder.name for folder in (copy / "data" / "published" / "ablations").iterdir() if folder.is_dir()]
    assert set(published_axes) == set(params["axes"]) and all(f"<h2>Ablation: {axis}</h2>" in published_html for axis in published_axes)

    # numba caches compiled code beside the sources the stages depend on: that is not a change
    (copy / "src" / "dl2" / "sim" / "__pycache__").mkdir(exist_ok=True)
    (copy / "src" / "dl2" / "sim" / "__pycache__" / "engine.advance-46.py311.nbi").write_bytes(b"index")
    second = _dvc(copy, "repro")
    assert "Running stage" not in second

    _dvc_status_follows_every_dependency(copy)
    _notebooks_run_by_hand_read_the_stages_configuration(copy, store, runs)

    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["report"]["figure_dpi"] = 80
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = _dvc(copy, "repro")
    assert "Running stage 'report'" in third
    assert "Running stage 'traces'" not in third and "Running stage 'baselines'" not in third


def _dvc_status_follows_every_dependency(copy: Path) -> None:
    """An edit under any dependency of a stage makes `dvc status` report that stage changed, naming it."""
    stages = dvc_stages()
    for dep in sorted({d for spec in stages.values() for d in spec["deps"]}):
        path = copy / dep
        edited = path if path.is_file() else next(p for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts)
        before = edited.read_bytes()
        edited.write_bytes(before + b"\n")
        try:
            status = json.loads(_dvc(copy, "status", "--json"))
        finally:
            edited.write_bytes(before)
        for name, spec in stages.items():
            if dep in spec["deps"]:
                changed = [entry.get("changed deps", {}) for entry in status.get(name, [])]
                assert any(dep in deps for deps in changed), (dep, name, status.get(name))
    assert json.loads(_dvc(copy, "status", "--json")) == {}


def _notebooks_run_by_hand_read_the_stages_configuration(copy: Path, store: MlflowClient, runs: list) -> None:
    """Each notebook, opened by hand (its parameters cell as committed, run from notebooks/), loads the
    configuration its stage ran with: the params its MLflow run logs are those `dl2 stage` logged."""
    from nbclient import NotebookClient

    from dl2.notebooks import StageKernelManager

    experiment = store.get_experiment_by_name("dl2").experiment_id
    for name in sorted({n.split("@")[0].removesuffix("-published") for n in stage_names()}):
        nb = nbformat.read(copy / "notebooks" / f"{name}.ipynb", as_version=4)
        setup = next(i for i, cell in enumerate(nb.cells) if "stages.load_stage(" in cell.source)
        nb.cells = nb.cells[: setup + 1]  # the parameters and the configuration: what a hand run reads first
        NotebookClient(nb, resources={"metadata": {"path": str(copy / "notebooks")}}, kernel_name="python3",
                       kernel_manager_class=StageKernelManager).execute()
        by_hand = next(r for r in store.search_runs([experiment], order_by=["attributes.start_time DESC"])
                       if "dl2.cell" not in r.data.tags)
        default = {"ablate": "ablate@learner"}.get(name, name)  # the notebook's default stage
        pipeline = next(r for r in runs if r.info.run_name == default.replace("@", "-"))
        assert by_hand.info.run_id != pipeline.info.run_id and by_hand.data.params == pipeline.data.params, name
        store.set_terminated(by_hand.info.run_id, "KILLED")
