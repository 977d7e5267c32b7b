"""The catalog of the 8 DL2 job types: the authors' workload constants (data/reference), and the kind
testbed's variant (data/testbed), whose epochs are its stand-in models' (`dl2 testbed profile`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any

import numpy as np

from dl2.errors import Dl2Error
from dl2.paths import REFERENCE_DIR, TESTBED_DIR

CONSTANTS_FILE = REFERENCE_DIR / "dl2_workload_constants.json"
TESTBED_FILE = TESTBED_DIR / "testbed.json"  # what `dl2 testbed profile` measured on, and the stand-ins' epochs
TESTBED = "testbed"  # the catalog variant (and speed table) of the kind testbed


@lru_cache(maxsize=1)
def workload_constants() -> dict[str, Any]:
    """The authors' constants as shipped in `data/reference/dl2_workload_constants.json`."""
    return json.loads(CONSTANTS_FILE.read_text())


@dataclass(frozen=True)
class Catalog:
    """Per-model constants of one variant (`public_release` or `dev_snapshot`), indexed by model id."""

    variant: str
    names: tuple[str, ...]
    local_comp_time_s: np.ndarray
    model_size_mb: np.ndarray
    epoch_size: np.ndarray  # batches per epoch, as the authors' speed conversion uses it (testbed: the stand-in's)
    inter_node_bw: np.ndarray  # MB/s
    intra_node_bw: np.ndarray  # MB/s
    worker_demand: np.ndarray  # (models, 2) [cpu, gpu] slots
    ps_demand: np.ndarray  # (models, 2) [cpu, gpu] slots

    @property
    def num_models(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        """The model id of `name`; an unknown name is an error listing the known ones."""
        try:
            return self.names.index(name)
        except ValueError:
            raise Dl2Error(f"unknown model {name!r} (known: {', '.join(self.names)})") from None


def testbed_facts() -> dict[str, Any]:
    """`data/testbed/testbed.json`: how the testbed's speeds were profiled, and its job types' epochs."""
    try:
        return json.loads(TESTBED_FILE.read_text())
    except FileNotFoundError:
        raise Dl2Error(f"{TESTBED_FILE}: not found: profile the kind testbed first (`dl2 testbed profile --kind`)") from None
    except json.JSONDecodeError as exc:
        raise Dl2Error(f"{TESTBED_FILE}: not valid JSON ({exc})") from None


@cache
def load_catalog(variant: str = "public_release") -> Catalog:
    """The catalog with the demands of `variant`. The `testbed` variant has the demands of the variant it
    was profiled with and the epochs of the testbed's stand-in models (batches per epoch)."""
    c = workload_constants()
    if variant == TESTBED:
        facts = testbed_facts()
        base = load_catalog(facts["demands"])
        try:
            epochs = np.asarray([facts["steps_per_epoch"][name] for name in base.names], dtype=np.float64)
        except KeyError as exc:
            raise Dl2Error(f"{TESTBED_FILE}: steps_per_epoch has no entry for model {exc}") from None
        epochs.setflags(write=False)
        return replace(base, variant=TESTBED, epoch_size=epochs)
    if variant not in c["worker_demand_cpu_gpu_slots"]:
        known = [*c["worker_demand_cpu_gpu_slots"], TESTBED]
        raise Dl2Error(f"unknown catalog variant {variant!r} (known: {', '.join(known)})")

    def arr(key: str) -> np.ndarray:
        a = np.asarray(c[key], dtype=np.float64)
        a.setflags(write=False)
        return a

    def demand(key: str) -> np.ndarray:
        a = np.asarray(c[key][variant], dtype=np.int64)
        a.setflags(write=False)
        return a

    return Catalog(
        variant=variant,
        names=tuple(c["models"]),
        local_comp_time_s=arr("local_comp_time_s"),
        model_size_mb=arr("model_size_mb"),
        epoch_size=arr("epoch_size_batches"),
        inter_node_bw=arr("inter_node_bw_mbps"),
        intra_node_bw=arr("intra_node_bw_mbps"),
        worker_demand=demand("worker_demand_cpu_gpu_slots"),
        ps_demand=demand("ps_demand_cpu_gpu_slots"),
    )
