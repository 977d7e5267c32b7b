"""Running a pipeline stage: its notebook, parameterized from `params.yaml`, executed by papermill.

One MLflow run per execution: the runner creates it (stage and commit tags, parameters), the notebook
logs metrics and figures into it, and the runner adds the executed notebook and closes it, FAILED if the
notebook raised. The executed notebook lands in place only when the stage succeeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import papermill
from mlflow.tracking import MlflowClient

from dl2.config import BaselinesParams, TracesParams, load_params, load_presets
from dl2.errors import Dl2Error
from dl2.paths import atomic_path, repo_root
from dl2.tracking import create_stage_run, tracking_uri

STAGES = ("traces", "baselines", "report", "pretrain", "finetune", "evaluate", "ablate", "reproduction")
LEARN_STAGES = ("pretrain", "finetune", "evaluate", "ablate", "reproduction")


def stage_parameters(stage: str, params: dict[str, Any], where: str, group: str | None = None) -> dict[str, Any]:
    """The notebook parameters of `stage`, checked: its params.yaml section (and what it reads of others);
    `group` names the group of ablation axes an `ablate` stage runs."""
    if stage not in STAGES:
        raise Dl2Error(f"unknown stage {stage!r} (known: {', '.join(STAGES)})")
    if (stage == "ablate") != (group is not None):
        raise Dl2Error("an ablate stage needs --group (and only an ablate stage takes one)")
    if stage in LEARN_STAGES:
        parameters = _learn_parameters(stage, params, where)
        if stage == "ablate":
            from dl2.learn.ablations import group_axes, plan

            for axis in group_axes(params, group, where):
                plan(params, axis, where)
            parameters.update(group=group, ablations=params.get("ablations") or {})
        if stage == "reproduction":
            parameters.update(ablations=params.get("ablations") or {}, report=params.get("report") or {})
        return parameters
    traces = TracesParams.from_params(params, where)
    presets = load_presets(where)
    for name in traces.presets:
        if name not in presets:
            raise Dl2Error(f"{where}: traces.presets: unknown preset {name!r} (known: {', '.join(presets)})")
    if stage == "traces":
        return {"presets": list(traces.presets), "num_traces": traces.num_traces, "seed": traces.seed,
                "arrivals": traces.arrivals, "lengths": traces.lengths}
    if stage == "baselines":
        b = BaselinesParams.from_params(params, where)
        return {"presets": list(traces.presets), "policies": list(b.policies), "fine_grained_jct": b.fine_grained_jct}
    report = params.get("report") or {}
    dpi = report.get("figure_dpi", 120)
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not 20 <= dpi <= 600:
        raise Dl2Error(f"{where}: report.figure_dpi: expected an integer from 20 to 600, got {dpi!r}")
    return {"presets": list(traces.presets), "figure_dpi": dpi}


def _learn_parameters(stage: str, params: dict[str, Any], where: str) -> dict[str, Any]:
    from dl2.learn import workflow

    settings = workflow.learn_settings(params, where)
    if settings.preset not in load_presets(where):
        raise Dl2Error(f"{where}: learn.preset: unknown preset {settings.preset!r}")
    workflow.pretrain_config(params, where)
    workflow.finetune_plan(params, where)
    evaluate = params.get("evaluate") or {}
    if not isinstance(evaluate.get("heuristics", []), list):
        raise Dl2Error(f"{where}: evaluate.heuristics: expected a list of policy names")
    return {"learn": params.get("learn") or {}, "pretrain": params.get("pretrain") or {},
            "finetune": params.get("finetune") or {}, "evaluate": evaluate}


def run_stage(stage: str, params_file: str | Path | None = None, data_dir: str | Path | None = None,
              executed: str | Path | None = None, progress: bool = True, group: str | None = None,
              published: bool = False) -> Path:
    """Execute `notebooks/<stage>.ipynb` with its parameters; returns the executed notebook's path.
    `published`: the reproduction report on the committed full-scale results instead of this run's."""
    if published and stage != "reproduction":
        raise Dl2Error("--published reports on the committed results: only the reproduction stage takes it")
    root = repo_root()
    params_file = Path(params_file or root / "params.yaml").resolve()
    params = load_params(params_file)
    parameters = stage_parameters(stage, params, str(params_file), group)
    data_dir = Path(data_dir or root / "data").resolve()
    name = f"ablate-{group}" if group else f"{stage}-published" if published else stage
    executed = Path(executed or data_dir / "executed" / f"{name}.ipynb").resolve()
    parameters.update(params_file=str(params_file), data_dir=str(data_dir))
    if published:
        parameters["published"] = True
    reads = ("learn", "pretrain", "finetune") if stage in LEARN_STAGES else ("traces",)
    sections = ("ablations",) if stage in ("ablate", "reproduction") else ()
    logged = {section: params[section] for section in params if section in (stage, "presets", *reads, *sections)}
    if group:
        section = params["ablations"]
        logged["ablations"] = {"scale": section.get("scale"), "seeds": section.get("seeds"), "group": group,
                               "axes": {a: section["axes"][a] for a in section["groups"][group]}}
    run_id = create_stage_run(stage, logged, {"dl2.group": group} if group else None)
    parameters["run_id"] = run_id
    client = MlflowClient(tracking_uri())
    status = "FAILED"
    try:
        with atomic_path(executed) as tmp:
            try:
                papermill.execute_notebook(
                    str(root / "notebooks" / f"{stage}.ipynb"), str(tmp), parameters=parameters,
                    cwd=str(root), kernel_name="python3", progress_bar=progress, log_output=False,
                )
            except papermill.PapermillExecutionError as exc:
                raise Dl2Error(f"stage {stage}: notebook failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}") from None
        client.log_artifact(run_id, str(executed), artifact_path="notebook")
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
    return executed

