"""The catalog of the 8 DL2 job types and the authors' workload constants (data/reference)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np

from dl2.errors import Dl2Error
from dl2.paths import REFERENCE_DIR

CONSTANTS_FILE = REFERENCE_DIR / "dl2_workload_constants.json"


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
    epoch_size: np.ndarray  # batches per epoch, as the authors' speed conversion uses it
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


@cache
def load_catalog(variant: str = "public_release") -> Catalog:
    """The catalog with the demands of `variant`."""
    c = workload_constants()
    if variant not in c["worker_demand_cpu_gpu_slots"]:
        raise Dl2Error(f"unknown catalog variant {variant!r} (known: {', '.join(c['worker_demand_cpu_gpu_slots'])})")

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
