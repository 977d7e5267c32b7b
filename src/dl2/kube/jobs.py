"""DL2Job objects: checking a spec against the catalog and the cluster, and submitting a trace as DL2Jobs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dl2.kube.client import Kube
from dl2.kube.resources import GROUP, VERSION
from dl2.workload.catalog import Catalog
from dl2.workload.traces import Trace

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class JobSpec:
    """A checked DL2Job spec: model id, epochs, demands [cpu, gpu] slots per worker and per PS, limits, mode."""

    model: int
    epochs: float
    worker_demand: tuple[int, int]
    ps_demand: tuple[int, int]
    max_workers: int
    max_ps: int
    arrival_slot: int | None
    job_id: int | None
    mode: str = "sync"  # how its workers update the parameters: sync or async


def check_spec(job: dict, catalog: Catalog, node_capacity: tuple[int, int], max_tasks: int) -> JobSpec | str:
    """The checked spec, or a message saying which field is wrong and how (the object stays in the API)."""
    spec = job.get("spec") or {}
    model = spec.get("model")
    if model not in catalog.names:
        return f"spec.model: unknown model {model!r} (known: {', '.join(catalog.names)})"
    epochs = spec.get("epochs")
    if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or not math.isfinite(epochs) or epochs <= 0:
        return f"spec.epochs: expected a positive number, got {epochs!r}"
    demands = []
    for key in ("workerDemand", "psDemand"):
        d = spec.get(key) or {}
        cpu, gpu = d.get("cpu"), d.get("gpu")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (cpu, gpu)):
            return f"spec.{key}: expected cpu and gpu as integers >= 0, got {d!r}"
        demands.append((cpu, gpu))
    bundle = (demands[0][0] + demands[1][0], demands[0][1] + demands[1][1])
    if bundle[0] > node_capacity[0] or bundle[1] > node_capacity[1]:
        return (f"spec: a worker plus a PS need {bundle[0]} CPU and {bundle[1]} GPU slots, "
                f"more than one node holds ({node_capacity[0]} CPU, {node_capacity[1]} GPU slots)")
    limits = spec.get("limits") or {}
    max_workers, max_ps = limits.get("maxWorkers", max_tasks), limits.get("maxPS", max_tasks)
    if max_workers > max_tasks or max_ps > max_tasks:
        return f"spec.limits: at most {max_tasks} workers and {max_tasks} PS per job on this scheduler, got {limits!r}"
    mode = spec.get("mode", "sync")
    if mode not in ("sync", "async"):
        return f"spec.mode: expected sync or async, got {mode!r}"
    return JobSpec(catalog.index(model), float(epochs), demands[0], demands[1], max_workers, max_ps,
                   spec.get("arrivalSlot"), spec.get("jobId"), mode)


def job_name(job_id: int) -> str:
    return f"job-{job_id:05d}"


def trace_manifests(trace: Trace, catalog: Catalog, namespace: str) -> list[dict]:
    """One DL2Job per trace row, with the catalog's per-task demands, its arrival slot and its id."""
    out = []
    for i in range(len(trace)):
        m = int(trace.model[i])
        out.append({
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DL2Job",
            "metadata": {"name": job_name(int(trace.job_id[i])), "namespace": namespace},
            "spec": {
                "model": catalog.names[m],
                "epochs": float(trace.num_epochs[i]),
                "workerDemand": {"cpu": int(catalog.worker_demand[m, 0]), "gpu": int(catalog.worker_demand[m, 1])},
                "psDemand": {"cpu": int(catalog.ps_demand[m, 0]), "gpu": int(catalog.ps_demand[m, 1])},
                "arrivalSlot": int(trace.arrival[i]),
                "jobId": int(trace.job_id[i]),
            },
        })
    return out


def submit_trace(kube: Kube, trace: Trace, catalog: Catalog, namespace: str) -> list[str]:
    """Create the trace's DL2Jobs; returns their names in trace order."""
    names = []
    for manifest in trace_manifests(trace, catalog, namespace):
        kube.create(manifest)
        names.append(manifest["metadata"]["name"])
    return names
