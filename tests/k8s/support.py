"""Helpers for the Kubernetes tests: a preset that finishes in about twenty slots, its traces, and a
fresh namespace with its own pool of KWOK nodes per test."""

from __future__ import annotations

import itertools
import os

import numpy as np
import yaml

from dl2.backends.sim import simulate
from dl2.kube.client import Kube
from dl2.kube.jobs import submit_trace
from dl2.kube.resources import create_nodes, ensure_namespace
from dl2.sim.scenario import Scenario, SimOptions
from dl2.workload.presets import Preset
from dl2.workload.traces import generate_trace

PRESET = Preset("k8s-test", num_nodes=2, num_jobs=10, max_arrivals=3, max_epochs=8000, max_tasks=4,
                speed_table="public_release", bucket_to_model=False)
_spaces = itertools.count()


def scenario(assign_bundle: bool = False) -> Scenario:
    return Scenario(PRESET, SimOptions(assign_bundle=assign_bundle, max_slots=500))


def trace(seed: int = 0):
    sc = scenario()
    return generate_trace(sc.preset, sc.catalog, np.random.SeedSequence(seed))


def space(kube: Kube, num_nodes: int = PRESET.num_nodes) -> str:
    """A new namespace with its own pool of Ready KWOK nodes, both named the same."""
    name = f"t{os.getpid()}-{next(_spaces)}"
    ensure_namespace(kube, name)
    create_nodes(kube, name, num_nodes, PRESET.node_cpu, PRESET.node_gpu)
    return name


def params_file(folder) -> str:
    """A params file holding PRESET, for the CLI."""
    path = folder / "params.yaml"
    fields = {k: getattr(PRESET, k) for k in ("num_nodes", "num_jobs", "max_arrivals", "max_epochs", "max_tasks",
                                              "speed_table", "bucket_to_model")}
    path.write_text(yaml.safe_dump({"presets": {PRESET.name: fields}}))
    return path


def submitted(kube: Kube, seed: int, num_nodes: int = PRESET.num_nodes):
    """(scenario, trace, namespace): trace `seed` submitted as DL2Jobs to a fresh namespace and pool."""
    sc, tr = scenario(), trace(seed)
    ns = space(kube, num_nodes)
    submit_trace(kube, tr, sc.catalog, ns)
    return sc, tr, ns


def assert_simulator_jcts(jct: dict[int, float], tr, sc: Scenario, policy: str = "drf") -> None:
    """Per-job JCTs (by job id) equal the simulator's on the same trace."""
    got = [jct[int(i)] for i in tr.job_id]
    np.testing.assert_allclose(got, simulate(tr, policy, sc).jct, rtol=1e-9)
