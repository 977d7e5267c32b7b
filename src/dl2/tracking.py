"""MLflow helpers: one SQLite store at the repository root, one run per pipeline stage execution."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Mapping

import mlflow
from mlflow.tracking import MlflowClient

from dl2.paths import repo_root

EXPERIMENT = "dl2"


def tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` if set, else `sqlite:///<repo>/mlflow.db`, wherever the caller runs from."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def artifact_location() -> str:
    """Artifacts beside the store: `<store folder>/mlartifacts`."""
    uri = tracking_uri()
    base = Path(uri.removeprefix("sqlite:///")).parent if uri.startswith("sqlite:///") else repo_root()
    return (base / "mlartifacts").as_uri()


def experiment_id(name: str = EXPERIMENT) -> str:
    """Point MLflow at the store and return the id of experiment `name`, creating it if needed."""
    mlflow.set_tracking_uri(tracking_uri())
    client = MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    return client.create_experiment(name, artifact_location=artifact_location())


def git_commit() -> str:
    """The checkout's commit (with `-dirty` if it has uncommitted changes), or `unknown`."""
    try:
        root = repo_root()
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout
        return sha + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


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


def create_stage_run(stage: str, params: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> str:
    """A new run for `stage`, tagged with the stage, the git commit and `tags`, its parameters logged; returns its id."""
    client = MlflowClient(tracking_uri())
    run = client.create_run(
        experiment_id(),
        run_name=stage if not tags or "dl2.group" not in tags else f"{stage}-{tags['dl2.group']}",
        tags={"dl2.stage": stage, "mlflow.source.git.commit": git_commit(), "mlflow.source.name": f"notebooks/{stage}.ipynb",
              **(tags or {})},
    )
    for key, value in flatten(params).items():
        client.log_param(run.info.run_id, key, value)
    return run.info.run_id


def open_stage_run(stage: str, run_id: str | None = None, params: Mapping[str, Any] | None = None) -> mlflow.ActiveRun:
    """Make the stage's MLflow run active: the pipeline's (`run_id`) or, run by hand in JupyterLab, a new one.

    Close it with `mlflow.end_run()` at the end of the notebook.
    """
    experiment_id()
    if mlflow.active_run() is not None:
        mlflow.end_run()
    if run_id is None:
        run_id = create_stage_run(stage, params or {})
    return mlflow.start_run(run_id=run_id)


def log_metrics(metrics: Mapping[str, float], prefix: str = "") -> None:
    """Log numeric metrics to the active run (names sanitized for MLflow)."""
    clean = {f"{prefix}{k}".replace("/", "_").replace(" ", "_"): float(v) for k, v in metrics.items()}
    mlflow.log_metrics(clean)
