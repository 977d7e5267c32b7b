"""MLflow helpers: one SQLite store at the repository root, one run per pipeline stage execution, and one
nested run per ablation cell."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from dl2.checkout import git_commit
from dl2.paths import repo_root

if TYPE_CHECKING:
    import pandas as pd

    from dl2.learn.ablations.plan import AblationPlan

EXPERIMENT = "dl2"
# MLflow 3 opens an experiment in its GenAI view unless told that it tracks model training
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
PARAMS_PER_CALL = 100  # MLflow's limit for one log_batch


STORE_LOGGERS = ("mlflow.store", "alembic")  # their INFO lines (creating and migrating the SQLite tables) are the store's own


def tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` if set, else `sqlite:///<repo>/mlflow.db`, wherever the caller runs from. Every
    opening of the store asks for it, so it also keeps the store's own INFO lines out of the caller's stream
    (a scheduler's slot lines are on stderr); its warnings and errors still show."""
    for name in STORE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def artifact_location() -> str:
    """Artifacts beside the store: `<store folder>/mlartifacts`."""
    uri = tracking_uri()
    base = Path(uri.removeprefix("sqlite:///")).parent if uri.startswith("sqlite:///") else repo_root()
    return (base / "mlartifacts").as_uri()


def experiment_id(name: str = EXPERIMENT) -> str:
    """Point MLflow at the store and return the id of experiment `name`, created (as a model-training
    experiment, which the MLflow UI opens in its training-runs view) if needed."""
    mlflow.set_tracking_uri(tracking_uri())
    client = MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return client.create_experiment(name, artifact_location=artifact_location(), tags=EXPERIMENT_KIND)
    for key, value in EXPERIMENT_KIND.items():
        if experiment.tags.get(key) != value:
            client.set_experiment_tag(experiment.experiment_id, key, value)
    return experiment.experiment_id


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested parameters as MLflow params: `section.key` -> string value."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return flat


def _log_params(client: MlflowClient, run_id: str, params: Mapping[str, Any]) -> None:
    flat = [Param(key, value) for key, value in flatten(params).items()]
    for start in range(0, len(flat), PARAMS_PER_CALL):
        client.log_batch(run_id, params=flat[start:start + PARAMS_PER_CALL])


def create_stage_run(name: str, notebook: str, params: Mapping[str, Any]) -> str:
    """A new run for stage `name` (of dvc.yaml), named and tagged after it (`dl2.stage`, `dl2.group` for an
    ablation group) and the git commit, with the `params` it reads logged; returns its id."""
    client = MlflowClient(tracking_uri())
    tags = {"dl2.stage": name.split("@")[0], "mlflow.source.git.commit": git_commit(),
            "mlflow.source.name": f"notebooks/{notebook}.ipynb"}
    if "@" in name:
        tags["dl2.group"] = name.split("@")[1]
    run = client.create_run(experiment_id(), run_name=name.replace("@", "-"), tags=tags)
    _log_params(client, run.info.run_id, params)
    return run.info.run_id


def open_run(run_id: str) -> mlflow.ActiveRun:
    """Make run `run_id` the active MLflow run (ending any other first). Close it with `mlflow.end_run()`."""
    experiment_id()
    if mlflow.active_run() is not None:
        mlflow.end_run()
    return mlflow.start_run(run_id=run_id)


def log_metrics(metrics: Mapping[str, float], prefix: str = "") -> None:
    """Log numeric metrics to the active run (names sanitized for MLflow)."""
    clean = {f"{prefix}{k}".replace("/", "_").replace(" ", "_"): float(v) for k, v in metrics.items()}
    mlflow.log_metrics(clean)


def log_scheduler_run(namespace: str, params: Mapping[str, Any], jobs: list[dict], cluster_slots: int, slots_run: int) -> str:
    """One finished MLflow run for a `dl2 k8s-scheduler run` (tag `dl2.stage: k8s-scheduler`): its `params`,
    and from the DL2Jobs' status each succeeded job's JCT (`jct.<job>`, slots), their mean (`avg_jct`), the
    slots the cluster has run (`cluster_slots`, every scheduler process's, restarts included) and those this
    process ran (`slots_run`) and, where pods really trained, each job's acknowledged steps and last loss.
    Returns its id."""
    client = MlflowClient(tracking_uri())
    tags = {"dl2.stage": "k8s-scheduler", "dl2.namespace": namespace, "mlflow.source.git.commit": git_commit()}
    run_id = client.create_run(experiment_id(), run_name=f"k8s-scheduler-{namespace}", tags=tags).info.run_id
    _log_params(client, run_id, params)
    now = int(time.time() * 1000)
    metrics, jcts = [Metric("cluster_slots", float(cluster_slots), now, 0), Metric("slots_run", float(slots_run), now, 0)], []
    for job in jobs:
        name, status = job["metadata"]["name"], job.get("status", {})
        if status.get("phase") == "Succeeded":
            jcts.append(float(status["jct"]))
            metrics.append(Metric(f"jct.{name}", jcts[-1], now, 0))
        for key in ("steps", "loss"):
            if key in status.get("training", {}):
                metrics.append(Metric(f"{key}.{name}", float(status["training"][key]), now, 0))
    if jcts:
        metrics.append(Metric("avg_jct", sum(jcts) / len(jcts), now, 0))
    client.log_batch(run_id, metrics=metrics)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def log_ablation_cells(ablation: AblationPlan, table: pd.DataFrame, curve_frame: pd.DataFrame, parent_run_id: str | None) -> None:
    """One MLflow run per cell, tagged with the axis and the cell (nested under the stage's run): the
    cell's parameters, its summary row, and each seed's learning curve."""
    client = MlflowClient(tracking_uri())
    experiment = experiment_id()
    rows = table.set_index("cell")
    now = int(time.time() * 1000)
    for cell in ablation.cells:
        tags = {"dl2.stage": "ablate", "dl2.axis": ablation.axis, "dl2.cell": cell.label,
                "dl2.reference": str(cell.label == ablation.reference).lower()}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run_id = client.create_run(experiment, run_name=f"{ablation.axis}={cell.label}", tags=tags).info.run_id
        _log_params(client, run_id, {"run": cell.run, **cell.params})
        metrics = [Metric(key, float(rows.loc[cell.label, key]), now, 0)
                   for key in ("jct", "sd", "min", "max", "jct_sampled", "ratio_to_bound", "vs_reference", "vs_optimus", "vs_teacher")
                   if key in rows]
        mine = curve_frame[curve_frame.cell == cell.label]
        metrics += [Metric(f"val_jct_greedy.s{seed}", float(jct), now, int(update))
                    for seed, update, jct in zip(mine["seed"], mine["update"], mine["val_jct_greedy"])]
        client.log_batch(run_id, metrics=metrics)
        client.set_terminated(run_id, "FINISHED")
