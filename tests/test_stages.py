"""The pipeline's stages: dvc.yaml is the one list of what each stage reads, every stage depends on all the
code and data it runs, and a notebook loads its configuration the one way `dl2 stage` does."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import yaml

from dl2.config import load_params
from dl2.errors import Dl2Error
from dl2.paths import repo_root
from dl2.stages import declared_params, dvc_stages, load_stage, notebook_of, stage_names

ROOT = repo_root()
PARAMS = load_params(ROOT / "params.yaml")
PATH_PARAMETERS = {"params_file", "data_dir", "overrides", "run_id", "stage_params"}
STAGE_PARAMETERS = {"ablate": {"group"}, "reproduction": {"published"}}  # what tells a shared notebook which stage it runs


def without(params: dict, dotted: str) -> dict:
    out = copy.deepcopy(params)
    *parents, last = dotted.split(".")
    node = out
    for key in parents:
        node = node[key]
    del node[last]
    return out


def test_every_stage_of_dvc_yaml_loads_from_the_projects_params():
    names = stage_names()
    assert {"traces", "baselines", "report", "pretrain", "finetune", "evaluate", "reproduction", "reproduction-published"} <= set(names)
    assert {f"ablate@{group}" for group in PARAMS["ablations"]["groups"]} <= set(names)
    for name in names:
        stage = load_stage(name)
        assert stage.notebook == notebook_of(name) and (ROOT / "notebooks" / f"{stage.notebook}.ipynb").is_file()
        assert dvc_stages()[name]["cmd"] == f"dl2 stage {name}"


@pytest.mark.parametrize("name", stage_names())
def test_a_stage_reads_every_key_dvc_yaml_declares_for_it_and_nothing_else(name, tmp_path):
    """Nothing else: a stage is handed only its declared keys (`Stage.params`), so it cannot read others.
    Every declared key: without it, the stage does not load, and the error names it."""
    declared = declared_params(name)
    assert set(load_stage(name).params) == {key.split(".")[0] for key in declared}
    for key in declared:
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump(without(PARAMS, key)))
        with pytest.raises(Dl2Error, match=str(path)) as info:
            load_stage(name, path)
        assert key.split(".")[-1] in str(info.value), (key, str(info.value))


def test_a_stage_is_handed_exactly_its_declared_keys():
    evaluate = load_stage("evaluate")
    assert evaluate.params["finetune"] == {k: PARAMS["finetune"][k] for k in ("runs", "seeds", "backend")}
    learner = load_stage("ablate@learner")
    assert learner.params["ablations"]["groups"] == {"learner": PARAMS["ablations"]["groups"]["learner"]}
    assert "workers" in learner.params["ablations"] and "report" not in learner.params
    assert set(load_stage("reproduction").params) == {"report", "ablations"}


@pytest.mark.parametrize("name", stage_names())
def test_every_stage_depends_on_the_whole_package_its_data_libraries_and_notebook(name):
    deps = dvc_stages()[name]["deps"]
    assert {"src/dl2", "data/reference", "data/testbed", "uv.lock", f"notebooks/{notebook_of(name)}.ipynb"} <= set(deps)
    assert all((ROOT / d).exists() or d.startswith("data/") for d in deps)


def test_overrides_change_only_keys_the_stage_reads():
    stage = load_stage("finetune", overrides={"finetune": {"updates": 7}, "learn": {"window": 12}})
    assert stage.config.finetune.learner.updates == 7 and stage.config.learn.window == 12
    assert stage.params["finetune"]["updates"] == 7  # what MLflow logs is what ran
    with pytest.raises(Dl2Error, match=r"overrides: pretrain\.epochs: stage finetune does not read it"):
        load_stage("finetune", overrides={"pretrain": {"epochs": 3}})
    with pytest.raises(Dl2Error, match=r"with the notebook's overrides\): finetune\.updates: expected a number at least 1"):
        load_stage("finetune", overrides={"finetune": {"updates": 0}})


def test_a_stage_handed_the_keys_it_reads_reads_no_file(monkeypatch, tmp_path):
    """What `dl2 stage` hands its notebook (`Stage.params`, read once) loads the same configuration without
    params.yaml or dvc.yaml; overrides on top are still checked against dvc.yaml."""
    read = {name: load_stage(name) for name in ("finetune", "ablate@learner", "evaluate")}
    monkeypatch.setenv("DL2_ROOT", str(tmp_path))  # neither file here
    gone = tmp_path / "params.yaml"
    for name, stage in read.items():
        again = load_stage(name, gone, params=stage.params)
        assert again.config == stage.config and again.params == stage.params, name
    with pytest.raises(Dl2Error, match="params file not found"):
        load_stage("finetune", gone)
    monkeypatch.delenv("DL2_ROOT")
    changed = load_stage("finetune", gone, {"finetune": {"updates": 7}}, read["finetune"].params)
    assert changed.config == load_stage("finetune", overrides={"finetune": {"updates": 7}}).config
    with pytest.raises(Dl2Error, match=r"overrides: pretrain\.epochs: stage finetune does not read it"):
        load_stage("finetune", gone, {"pretrain": {"epochs": 3}}, read["finetune"].params)


def _cells(name: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())["cells"]


@pytest.mark.parametrize("notebook", sorted({notebook_of(n) for n in stage_names()}))
def test_a_notebooks_parameters_are_paths_and_overrides_and_it_loads_its_stage_as_dl2_stage_does(notebook):
    cells = _cells(notebook)
    (parameters,) = [c for c in cells if "parameters" in c["metadata"].get("tags", [])]
    assigned = {line.split("=")[0].strip() for line in "".join(parameters["source"]).splitlines() if "=" in line}
    assert assigned == PATH_PARAMETERS | STAGE_PARAMETERS.get(notebook, set())
    setup = next(c for c in cells if c["cell_type"] == "code" and c is not parameters)
    assert "stages.load_stage(" in "".join(setup["source"]) and "params_file, overrides, stage_params)" in "".join(setup["source"])
    every_line = "".join("".join(c["source"]) for c in cells)
    assert "load_params" not in every_line and "params.yaml\")" not in every_line  # no second way to read params
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in cells if c["cell_type"] == "code")
    ids = [c.get("id") for c in cells]
    assert None not in ids and len(set(ids)) == len(ids), "every cell has its own id (nbformat 4.5)"


def test_the_dvc_file_is_read_from_the_project(monkeypatch, tmp_path):
    monkeypatch.setenv("DL2_ROOT", str(tmp_path))
    (tmp_path / "dvc.yaml").write_text("stages:\n  traces:\n    cmd: dl2 stage traces\n    params: [traces]\n")
    assert stage_names() == ("traces",) and declared_params("traces") == ("traces",)
    with pytest.raises(Dl2Error, match="unknown stage 'baselines' \\(known: traces\\)"):
        declared_params("baselines")
    assert Path(repo_root()) == tmp_path


def test_every_finetune_backend_has_its_environments(tmp_path):
    from dl2.backends.environments import training_environments
    from dl2.kube.resources import PodCluster, PodRuntime
    from dl2.learn.settings import BACKENDS

    for backend in BACKENDS:
        runtime = PodRuntime("image", "python", [], [], "/shared", tmp_path)
        pods = PodCluster(tmp_path / "kubeconfig", "dl2", 3, (8, 8), runtime)
        environments = training_environments(backend, kubeconfig=tmp_path / "kubeconfig", pods=pods)  # connects only when used
        assert callable(environments("sl-rl"))


@pytest.mark.parametrize(("stage", "section"), [("ablate@learner", "ablations"), ("pollux-baselines", "pollux")])
def test_a_stage_runs_its_reduced_scale_in_its_own_process_and_its_full_scale_on_every_core(stage, section):
    def workers(**overrides) -> int:
        return load_stage(stage, overrides={section: overrides}).config.workers

    assert workers(scale="reduced", workers=0) == 1  # a pool's processes cost more to start than the cells take
    assert workers(scale="full", workers=0) == os.cpu_count()
    assert workers(scale="reduced", workers=3) == workers(scale="full", workers=3) == 3
