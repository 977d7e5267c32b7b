"""The pipeline's stages: what each reads of `params.yaml`, loading its configuration, and running its notebook.

`dvc.yaml` is the one list of what each stage reads: DVC reruns a stage when one of its params changes,
and `load_stage` hands the stage exactly those keys of the params file, so a stage that read anything else
could not load. A notebook builds its configuration with `load_stage` whether `dl2 stage` runs it or a
person does in JupyterLab, from the same keys (plus the overrides its parameters cell holds).

`run_stage` reads and checks the stage's keys once, makes one MLflow run per execution (stage and commit
tags, those keys), and executes the notebook with papermill, handing it those keys (`stage_params`: the
kernel reads neither params.yaml nor dvc.yaml again); the notebook logs metrics and figures into the run,
and the executed notebook is added to it. The run ends FAILED if the notebook raised, and the executed
notebook lands only on success.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from dl2.config import default_params_path, load_params
from dl2.errors import Dl2Error
from dl2.paths import atomic_path, repo_root
from dl2.stage_configs import BUILDERS
from dl2.tracking import create_stage_run, open_run, tracking_uri


@dataclass(frozen=True)
class Stage:
    """One stage of `dvc.yaml`, loaded from a params file."""

    name: str  # as dvc.yaml names it: "finetune", "ablate@learner", "reproduction-published"
    notebook: str  # notebooks/<notebook>.ipynb
    params: dict  # the keys of the params file that dvc.yaml declares for the stage (what MLflow logs)
    config: Any  # the stage's typed configuration (one of `dl2.stage_configs`' *Stage classes)

    def open_run(self, run_id: str | None = None) -> Any:
        """Make the stage's MLflow run active: the pipeline's (`run_id`) or, run by hand in JupyterLab, a new
        one. Close it with `mlflow.end_run()` at the end of the notebook."""
        return open_run(run_id or create_stage_run(self.name, self.notebook, self.params))


# --- dvc.yaml ---------------------------------------------------------------------------------------


def dvc_file() -> Path:
    return repo_root() / "dvc.yaml"


def dvc_stages() -> dict[str, dict]:
    """Every stage of `dvc.yaml` by name, matrix stages expanded (`ablate@learner`), `${item.x}` filled in."""
    path = dvc_file()
    stages = load_params(path).get("stages") or {}
    out = {}
    for name, spec in stages.items():
        matrix = spec.get("matrix")
        if not matrix:
            out[name] = spec
            continue
        ((key, values),) = matrix.items()
        for value in values:
            out[f"{name}@{value}"] = _filled({k: v for k, v in spec.items() if k != "matrix"}, f"${{item.{key}}}", str(value))
    return out


def _filled(node: Any, placeholder: str, value: str) -> Any:
    """`node` with `placeholder` replaced by `value` in every string it holds."""
    if isinstance(node, str):
        return node.replace(placeholder, value)
    if isinstance(node, list):
        return [_filled(v, placeholder, value) for v in node]
    if isinstance(node, dict):
        return {_filled(k, placeholder, value): _filled(v, placeholder, value) for k, v in node.items()}
    return node


def stage_names() -> tuple[str, ...]:
    return tuple(dvc_stages())


def notebook_of(name: str) -> str:
    """The notebook a stage runs: its name before `@`, `reproduction` for `reproduction-published`."""
    return name.split("@")[0].removesuffix("-published")


def declared_params(name: str) -> tuple[str, ...]:
    """The params keys `dvc.yaml` declares for stage `name` (sections, or dotted keys within them)."""
    stages = dvc_stages()
    if name not in stages:
        raise Dl2Error(f"unknown stage {name!r} (known: {', '.join(stages)})")
    keys = stages[name].get("params") or []
    if not all(isinstance(k, str) for k in keys):
        raise Dl2Error(f"{dvc_file()}: stages.{name}.params: dl2 reads only keys of params.yaml, got {keys!r}")
    return tuple(keys)


def declared_subset(params: Mapping[str, Any], keys: tuple[str, ...], where: str) -> dict:
    """The part of `params` under `keys` (`ablations.scale` keeps `{"ablations": {"scale": ...}}`), sharing its
    values (`load_params` gives each caller a copy of its own)."""
    subset: dict = {}
    for key in keys:
        node, out, parts = params, subset, key.split(".")
        for k, part in enumerate(parts):
            if not isinstance(node, Mapping) or part not in node:
                raise Dl2Error(f"{where}: {'.'.join(parts[:k + 1])} is missing")
            node = node[part]
            if k < len(parts) - 1:
                out = out.setdefault(part, {})
        out[parts[-1]] = node
    return subset


def _with_overrides(subset: dict, overrides: Mapping[str, Any], keys: tuple[str, ...], name: str) -> dict:
    """`subset` with `overrides` (nested like params.yaml) merged in; each must fall under a declared key."""
    out = copy.deepcopy(subset)
    for path, value in _leaves(overrides):
        dotted = ".".join(path)
        if not any(dotted == k or dotted.startswith(f"{k}.") for k in keys):
            raise Dl2Error(f"overrides: {dotted}: stage {name} does not read it (dvc.yaml declares: {', '.join(keys)})")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = copy.deepcopy(value)
    return out


def _leaves(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    leaves = []
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            leaves += _leaves(value, (*prefix, str(key)))
        else:
            leaves.append(((*prefix, str(key)), value))
    return leaves


def load_stage(name: str, params_file: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
               params: Mapping[str, Any] | None = None) -> Stage:
    """Stage `name`'s configuration from the keys of `params_file` (default: the project's params.yaml) that
    dvc.yaml declares for it, or from `params`, those keys as read before (what `dl2 stage` hands its
    notebook: then no file is read), with `overrides` on top (a hand run's changes); errors name the file
    and key."""
    params_file = Path(params_file or default_params_path()).resolve()
    where = str(params_file)
    if params is None:
        subset = declared_subset(load_params(params_file), declared_params(name), where)
    else:
        subset = dict(params)
    if overrides:
        subset = _with_overrides(subset, overrides, declared_params(name), name)
        where = f"{where} (with the notebook's overrides)"
    notebook = notebook_of(name)
    return Stage(name, notebook, subset, BUILDERS[notebook](subset, where, name))


# --- running ----------------------------------------------------------------------------------------


def run_stage(name: str, params_file: str | Path | None = None, data_dir: str | Path | None = None,
              executed: str | Path | None = None, progress: bool = True) -> Path:
    """Execute stage `name`'s notebook with papermill; returns the executed notebook's path."""
    import papermill  # here, not at the top: every notebook's kernel imports this module, and needs no papermill

    from dl2.notebooks import execute

    root = repo_root()
    params_file = Path(params_file or default_params_path()).resolve()
    stage = load_stage(name, params_file)  # a bad parameter stops here, before any run or file is made
    data_dir = Path(data_dir or root / "data").resolve()
    executed = Path(executed or data_dir / "executed" / f"{name.replace('@', '-')}.ipynb").resolve()
    parameters = {"params_file": str(params_file), "data_dir": str(data_dir), "stage_params": stage.params,
                  **_notebook_parameters(name)}
    run_id = create_stage_run(stage.name, stage.notebook, stage.params)
    parameters["run_id"] = run_id
    client = MlflowClient(tracking_uri())
    status = "FAILED"
    try:
        with atomic_path(executed) as tmp:
            try:
                execute(root / "notebooks" / f"{stage.notebook}.ipynb", tmp, parameters, cwd=root, progress=progress)
            except papermill.PapermillExecutionError as exc:
                raise Dl2Error(f"stage {name}: notebook failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}") from None
        client.log_artifact(run_id, str(executed), artifact_path="notebook")
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
    return executed


def _notebook_parameters(name: str) -> dict:
    """What tells a shared notebook which stage it runs: an ablation group, the published results."""
    if "@" in name:
        return {"group": name.split("@")[1]}
    if name.endswith("-published"):
        return {"published": True}
    return {}

