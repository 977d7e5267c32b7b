"""Speed models: how many epochs a job trains in one slot with a given number of PS and workers.

Two models, as in DL2:
- `MeasuredSpeedModel`: the authors' testbed measurements, interpolated by a linear radial-basis function
  exactly as their simulator does (DESIGN §3);
- `AnalyticalSpeedModel`: the authors' PS/worker communication model (compute time, model size,
  intra/inter-node bandwidth), placement-aware (DESIGN §3, "Analytical speed model").

The simulator never calls a model per slot: `epochs_table` precomputes every (model, #PS, #workers).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from dl2.errors import Dl2Error
from dl2.paths import REFERENCE_DIR, TESTBED_DIR
from dl2.workload.catalog import Catalog

SPEED_FILES = {
    "public_release": REFERENCE_DIR / "dl2_speed_public_release.txt",
    "dev_snapshot": REFERENCE_DIR / "dl2_speed_dev_snapshot.txt",
    "testbed": TESTBED_DIR / "speed.txt",  # profiled on the kind testbed (`dl2 testbed profile`)
}
# BLAS threads of the interpolant's fit, whatever the machine's cores. OpenBLAS splits the LU of a system
# of 100 points or more by its thread count, and each count rounds differently (1, 2, 3, 4, 8 and 16 all
# differ in the last bits). 2 is the count every published result was fitted with (the development
# machine's two cores); OpenBLAS runs that count on a machine with fewer cores too.
FIT_BLAS_THREADS = 2


class SpeedModel(Protocol):
    """Epochs one job of `model` trains in one slot with `num_ps` PS and `num_workers` workers."""

    def epochs_per_slot(self, model: int, num_ps: int, num_workers: int) -> float: ...


def measurement_row(model: str, mode: str, batch_size: int, num_ps: int, num_workers: int, worker_speeds: Sequence[float],
                    ps_cpu: Sequence[float], worker_cpu: Sequence[float]) -> str:
    """One line of a speed table, in the authors' format (`data/reference/README.md`)."""
    def floats(values: Sequence[float]) -> list[float]:
        return [round(float(v), 3) for v in values]

    return repr((model, mode, int(batch_size), int(num_ps), int(num_workers), floats(worker_speeds), floats(ps_cpu),
                 floats(worker_cpu)))


def read_measurements(path: str | Path) -> dict[str, np.ndarray]:
    """Per model name, an array of rows (num_ps, num_workers, total speed in samples/s)."""
    path = Path(path)
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    try:
        text = path.read_text()
    except FileNotFoundError:
        hint = ": profile the kind testbed first (`dl2 testbed profile --kind`)" if path == SPEED_FILES["testbed"] else ""
        raise Dl2Error(f"{path}: speed table not found{hint}") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            model, _mode, _batch, num_ps, num_workers, speeds, *_ = ast.literal_eval(line)
            rows[model].append((float(num_ps), float(num_workers), float(sum(speeds))))
        except (ValueError, SyntaxError, TypeError) as exc:
            raise Dl2Error(f"{path}:{lineno}: not a speed measurement row ({exc})") from None
    return {model: np.asarray(r, dtype=np.float64) for model, r in rows.items()}


class LinearRbf:
    """`f(x) = sum_i c_i * ||x - x_i||` through the given points (no polynomial term, no smoothing), fitted
    on `FIT_BLAS_THREADS` BLAS threads so that the same points give the same weights whatever the cores."""

    def __init__(self, points: np.ndarray, values: np.ndarray):
        self.points = np.asarray(points, dtype=np.float64)
        phi = np.linalg.norm(self.points[:, None, :] - self.points[None, :, :], axis=-1)
        with threadpool_limits(limits=FIT_BLAS_THREADS, user_api="blas"):
            self.weights = np.linalg.solve(phi, np.asarray(values, dtype=np.float64))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Evaluate at points `x` of shape (n, 2)."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        dist = np.linalg.norm(x[:, None, :] - self.points[None, :, :], axis=-1)
        return dist @ self.weights


class MeasuredSpeedModel:
    """The authors' measured speeds, interpolated per model by `LinearRbf` over (num_ps, num_workers)."""

    def __init__(self, catalog: Catalog, table: str = "public_release", slot_seconds: float = 1200.0):
        if table not in SPEED_FILES:
            raise Dl2Error(f"unknown speed table {table!r} (known: {', '.join(SPEED_FILES)})")
        self.catalog = catalog
        self.slot_seconds = slot_seconds
        measured = _measurements(table)
        missing = [name for name in catalog.names if name not in measured]
        if missing:
            raise Dl2Error(f"{SPEED_FILES[table]}: no measurements for model {missing[0]!r}")
        self.rbfs = [LinearRbf(measured[n][:, :2], measured[n][:, 2]) for n in catalog.names]

    def speed(self, model: int, num_ps: np.ndarray | float, num_workers: np.ndarray | float) -> np.ndarray:
        """Total training speed (samples/s) at the given counts; broadcasts."""
        ps, w = np.broadcast_arrays(np.asarray(num_ps, np.float64), np.asarray(num_workers, np.float64))
        return self.rbfs[model](np.stack([ps.ravel(), w.ravel()], axis=1)).reshape(ps.shape)

    def epochs_per_slot(self, model: int, num_ps: int, num_workers: int) -> float:
        if num_ps <= 0 or num_workers <= 0:
            return 0.0
        return float(self.speed(model, num_ps, num_workers)) * self.slot_seconds / self.catalog.epoch_size[model]


@cache
def _measurements(table: str) -> dict[str, np.ndarray]:
    return read_measurements(SPEED_FILES[table])


class AnalyticalSpeedModel:
    """DL2's analytical PS/worker model. Placement-aware through `epochs_per_slot_placed`.

    `epochs_per_slot` (no placement given) assumes every task of the job on a node of its own, the
    placement with the most cross-node traffic.
    """

    def __init__(self, catalog: Catalog, slot_seconds: float = 1200.0):
        self.catalog = catalog
        self.slot_seconds = slot_seconds

    def epochs_per_slot(self, model: int, num_ps: int, num_workers: int) -> float:
        if num_ps <= 0 or num_workers <= 0:
            return 0.0
        ps_nodes = np.arange(num_ps)
        worker_nodes = np.arange(num_ps, num_ps + num_workers)
        return self.epochs_per_slot_placed(model, ps_nodes, worker_nodes)

    def epochs_per_slot_placed(self, model: int, ps_nodes: Sequence[int], worker_nodes: Sequence[int]) -> float:
        """Epochs per slot with PS on `ps_nodes` and workers on `worker_nodes` (one node id per task)."""
        ps_nodes = np.asarray(ps_nodes, dtype=np.int64)
        worker_nodes = np.asarray(worker_nodes, dtype=np.int64)
        num_ps, num_workers = len(ps_nodes), len(worker_nodes)
        if num_ps == 0 or num_workers == 0:
            return 0.0
        c = self.catalog
        nodes, node_index = np.unique(np.concatenate([ps_nodes, worker_nodes]), return_inverse=True)
        ps_on = np.bincount(node_index[:num_ps], minlength=len(nodes))
        workers_on = np.bincount(node_index[num_ps:], minlength=len(nodes))
        fewest_workers_on_a_ps_node = workers_on[ps_on > 0].min()
        shard = 2.0 * c.model_size_mb[model] / num_ps
        slowest_step = 0.0
        for n in node_index[num_ps:]:
            intra = c.intra_node_bw[model] / max(ps_on[n], workers_on[n])
            if ps_on[n] == num_ps:
                inter = c.inter_node_bw[model]
            else:
                inter = min(
                    c.inter_node_bw[model] / (num_ps - ps_on[n]),
                    c.inter_node_bw[model] / (num_workers - fewest_workers_on_a_ps_node),
                )
            step = c.local_comp_time_s[model] + max(shard / inter, shard / intra)
            slowest_step = max(slowest_step, step)
        return num_workers * self.slot_seconds / slowest_step / c.epoch_size[model]


def epochs_table(model: SpeedModel, num_models: int, max_tasks: int) -> np.ndarray:
    """`table[m, p, w]` = epochs per slot for p, w in 0..max_tasks+1 (0 where p or w is 0).

    One beyond `max_tasks` so that a policy may look one task ahead (Optimus does). Values are kept as
    the model gives them: the measured tables hold a few failed runs (speed 0), so the interpolant is 0
    (up to rounding) at those points, exactly as in the authors' simulator.
    """
    size = max_tasks + 2
    table = np.zeros((num_models, size, size), dtype=np.float64)
    for m in range(num_models):
        for p in range(1, size):
            for w in range(1, size):
                table[m, p, w] = model.epochs_per_slot(m, p, w)
    if not np.isfinite(table).all():
        raise Dl2Error("speed model gave a non-finite speed")
    table.setflags(write=False)
    return table
