"""`dl2 testbed independence`: does a job's speed on the kind testbed depend on its neighbours?

Each (job type, configuration) is measured as `dl2 testbed profile` measures it (`profile.measure`), first
alone on the cluster, then with the rest of the cluster busy: one neighbour pod for every task the
configuration leaves room for (the workers' CPU slots less the configuration's, two CPU slots a task, the
paper's demand), each spinning on one core. On a cluster started with `--isolate` a neighbour is limited
like a task of two CPU slots; on one without, it takes what it can, as a training pod there does. The
neighbours hold no dl2 slots, so the measured job is placed exactly as it was alone.

The answer (written atomically as JSON) gives, per (job type, configuration), the speeds of every repeat
alone and busy, and the ratio of their means: 1 means independent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from lightkube.resources.core_v1 import Namespace, Pod

from dl2.errors import Dl2Error
from dl2.kube.client import Kube
from dl2.kube.resources import RESTRICTED_CONTAINER, PodRuntime, ensure_namespace
from dl2.paths import write_json_atomic
from dl2.sim_to_real.profile import ProfileGrid, measure

NEIGHBOURS = "dl2-neighbours"  # the neighbours' namespace
TASK_CPU_SLOTS = 2  # every task of the paper's demands (`public_release`) holds 2 CPU slots
SPIN = "while True:\n    pass\n"


def neighbour_manifest(name: str, node: str, runtime: PodRuntime) -> dict:
    """A pod that spins on one core on `node`, limited like a task of TASK_CPU_SLOTS slots where pods are limited."""
    container = {"name": "spin", "image": runtime.image, "command": [runtime.python], "args": ["-c", SPIN],
                 "volumeMounts": runtime.volume_mounts, "securityContext": RESTRICTED_CONTAINER,
                 "env": [{"name": "HOME", "value": "/tmp"}]}
    millis = TASK_CPU_SLOTS * runtime.cpu_millis_per_slot
    if millis > 0:
        container["resources"] = {"requests": {"cpu": f"{millis}m"}, "limits": {"cpu": f"{millis}m"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NEIGHBOURS},
            "spec": {"nodeName": node, "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 0, "containers": [container], "volumes": runtime.volumes}}


def neighbour_count(configuration: tuple[int, int], workers: int, cpu_slots_per_node: int) -> int:
    """The tasks' worth of CPU slots a configuration leaves free on the workers."""
    return max(0, workers * cpu_slots_per_node - TASK_CPU_SLOTS * sum(configuration)) // TASK_CPU_SLOTS


def start_neighbours(kube: Kube, runtime: PodRuntime, nodes: Sequence[str], count: int, timeout: float = 300.0) -> None:
    """`count` spinning pods, spread over `nodes` in turn; returns once every one runs."""
    ensure_namespace(kube, NEIGHBOURS)
    names = [f"spin-{k}" for k in range(count)]
    for k, name in enumerate(names):
        kube.create(neighbour_manifest(name, nodes[k % len(nodes)], runtime))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phases = [p.get("status", {}).get("phase") for p in kube.list(Pod, NEIGHBOURS)]
        if any(phase in ("Failed", "Succeeded") for phase in phases):
            raise Dl2Error(f"independence: a neighbour pod in namespace {NEIGHBOURS} stopped: kubectl -n {NEIGHBOURS} describe pods")
        if phases.count("Running") == count:
            return
        time.sleep(0.5)
    raise Dl2Error(f"independence: {count} neighbour pods did not all run within {timeout:g} s")


def stop_neighbours(kube: Kube, timeout: float = 120.0) -> None:
    """Delete the neighbours and wait until none is left."""
    for pod in kube.list(Pod, NEIGHBOURS):
        kube.delete(Pod, pod["metadata"]["name"], NEIGHBOURS)
    deadline = time.monotonic() + timeout
    while kube.list(Pod, NEIGHBOURS):
        if time.monotonic() > deadline:
            raise Dl2Error(f"independence: the neighbour pods in {NEIGHBOURS} did not go within {timeout:g} s")
        time.sleep(0.5)


def independence(kube: Kube, runtime: PodRuntime, workers: Sequence[str], cpu_slots_per_node: int, grid: ProfileGrid,
                 out: Path, log: Callable[[str], None] = print) -> dict:
    """Measure every (job type, configuration) of `grid` alone and beside busy neighbours; write and return the JSON."""
    results = []
    try:
        for configuration in grid.configurations:
            one = ProfileGrid(grid.models, (configuration,), grid.repeats, grid.seconds)
            alone = measure(kube, runtime, one, len(workers), log=log)
            count = neighbour_count(configuration, len(workers), cpu_slots_per_node)
            log(f"independence: {count} spinning neighbours beside {configuration[0]} PS and {configuration[1]} workers")
            start_neighbours(kube, runtime, workers, count)
            try:
                busy = measure(kube, runtime, one, len(workers), log=log)
            finally:
                stop_neighbours(kube)
            for model in grid.models:
                a = alone[alone.model == model].steps_per_second.to_list()
                b = busy[busy.model == model].steps_per_second.to_list()
                results.append({"model": model, "num_ps": configuration[0], "num_workers": configuration[1],
                                "neighbours": count, "alone": a, "busy": b, "ratio": float(np.mean(b) / np.mean(a))})
                log(f"independence: {model} {configuration}: {np.mean(a):.2f} steps/s alone, {np.mean(b):.2f} busy, "
                    f"ratio {results[-1]['ratio']:.3f}")
    finally:
        kube.delete(Namespace, NEIGHBOURS)
    answer = {"cpu_millis_per_slot": runtime.cpu_millis_per_slot, "workers": list(workers), "repeats": grid.repeats,
              "seconds": grid.seconds, "results": results,
              "worst_ratio": min((r["ratio"] for r in results), default=None)}
    write_json_atomic(out, answer)
    return answer
