"""The six applications of the Pollux world and what was measured of them (`data/reference/pollux/traces`):
step and sync time per placement and local batch size, and per-epoch progress and gradient statistics per
total batch size. Everything a simulated job needs is resolved here into arrays the compiled kernels read
(`AppTables`), with the artifact's conventions:

- throughput of a placement measured in `placements.csv` (every placement over at most four nodes, named
  by its lexicographically smallest rotation): linear interpolation in the local batch size;
- any other placement: linear interpolation over (nodes, replicas, local batch size) on the Delaunay
  triangulation of the per-configuration means of `placements.csv` followed by the `scalability.csv` rows;
- gradient statistics, iterations and metrics at a batch size between two measured ones: linear in the
  batch size; the progress that ends epoch e: the least over the measured batch sizes.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from dl2.errors import Dl2Error
from dl2.paths import REFERENCE_DIR

TRACES_DIR = REFERENCE_DIR / "pollux" / "traces"
APP_NAMES = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
# The artifact's training lengths (epochs) and the one batch-size limit it sets by hand (applications.py).
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "deepspeech2": 80, "imagenet": 90, "ncf": 10, "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}
MAX_NODES_MEASURED = 16  # the scalability measurements go up to 16 nodes; more are read as 16


class AppTables(NamedTuple):
    """One application's measurements as arrays (every field has the same type for every application, so
    a tuple of them indexes by application id inside compiled code)."""

    init_bsz: float  # the smallest measured total batch size
    max_bsz: float  # the largest
    min_local_bsz: float
    max_local_bsz: float
    max_epochs: int
    known_ids: np.ndarray  # (P,) int64 measured placement ids, sorted
    known_start: np.ndarray  # (P + 1,) rows of each id in known_rows
    known_rows: np.ndarray  # (R, 3) local_bsz, step_time, sync_time, each id's rows by local_bsz
    nd_values: np.ndarray  # (V, 2) step_time, sync_time at the triangulation's points
    nd_simplices: np.ndarray  # (S, 4) int64 point indices of each tetrahedron
    nd_transform: np.ndarray  # (S, 4, 3) the barycentric transform of each (scipy's Delaunay.transform)
    nd_neighbors: np.ndarray  # (S, 4) int64 the tetrahedron across from each vertex (-1: the hull's outside)
    nd_equations: np.ndarray  # (S, 5) each tetrahedron's facet of the lifted hull (scipy's Delaunay.equations)
    nd_lift: np.ndarray  # (2,) the paraboloid's scale and shift
    nd_bounds: np.ndarray  # (2, 3) the points' least and greatest coordinates
    val_bsz: np.ndarray  # (K,) measured total batch sizes, ascending
    val_iteration: np.ndarray  # (K, E) iterations done at the end of each epoch
    val_grad_sqr: np.ndarray  # (K, E)
    val_grad_var: np.ndarray  # (K, E)
    progress_at: np.ndarray  # (max_epochs + 1,) the progress that completes epochs 0..max_epochs


@dataclass(frozen=True)
class Application:
    """An application's name, id and tables."""

    name: str
    index: int
    tables: AppTables

    @property
    def init_batch_size(self) -> int:
        return int(self.tables.init_bsz)

    @property
    def max_batch_size(self) -> int:
        return int(self.tables.max_bsz)

    @property
    def min_local_bsz(self) -> int:
        return int(self.tables.min_local_bsz)

    @property
    def max_local_bsz(self) -> int:
        return int(self.tables.max_local_bsz)

    @property
    def max_epochs(self) -> int:
        return self.tables.max_epochs


_POWERS_OF_TEN = [float(f"1e{k}") for k in range(309)]
_NUMBER = re.compile(r"([-+]?)(\d*)(?:\.(\d*))?(?:[eE]([-+]?\d+))?")


def artifact_float(text: str) -> float:
    """A decimal number as the artifact's CSV reader (pandas 1.x) read it: at most 17 significant digits
    (a leading zero counts) summed in double precision, then scaled by a power of ten. It can differ from
    the correctly rounded value in the last bit, and the artifact's results follow these bits."""
    match = _NUMBER.fullmatch(text.strip())
    if not match or not (match.group(2) or match.group(3)):
        raise ValueError(f"not a number: {text!r}")
    sign, whole, decimals, exp = match.groups()
    number, digits, exponent = 0.0, 0, 0
    for ch in whole:
        if digits < 17:
            number = number * 10.0 + int(ch)
            digits += 1
        else:
            exponent += 1
    for ch in (decimals or "")[: max(17 - digits, 0)]:
        number = number * 10.0 + int(ch)
        digits += 1
        exponent -= 1
    if sign == "-":
        number = -number
    exponent += int(exp or 0)
    if exponent > 0:
        return number * _POWERS_OF_TEN[exponent]
    if exponent < -308:
        return number / _POWERS_OF_TEN[-308 - exponent] / _POWERS_OF_TEN[308]
    return number / _POWERS_OF_TEN[-exponent]


def _read_csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A measurement file with the artifact's columns, integers as integers and every other number as the
    artifact read it (`artifact_float`); errors name the file and line."""
    if not path.is_file():
        raise Dl2Error(f"{path}: measurement file not found (data/reference/pollux/README.md lists the files)")
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows or tuple(rows[0]) != columns:
        raise Dl2Error(f"{path}: expected the columns {','.join(columns)}, got {','.join(rows[0]) if rows else 'an empty file'}")
    values: dict[str, list] = {c: [] for c in columns}
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(columns):
            raise Dl2Error(f"{path}:{line}: expected {len(columns)} fields, got {len(row)}")
        for column, text in zip(columns, row):
            try:
                values[column].append(int(text) if text.isdigit() else artifact_float(text))
            except ValueError:
                raise Dl2Error(f"{path}:{line}: {column}: expected a number, got {text!r}") from None
    return pd.DataFrame(values)


def _validation(folder: Path) -> dict[int, pd.DataFrame]:
    curves = {}
    for path in folder.glob("validation-*.csv"):
        match = re.fullmatch(r"validation-(\d+)\.csv", path.name)
        if match:
            curves[int(match.group(1))] = _read_csv(path, ("progress", "iteration", "metric", "grad_sqr", "grad_var"))
    if not curves:
        raise Dl2Error(f"{folder}: no validation-<batch size>.csv files")
    return dict(sorted(curves.items()))


def _padded(curves: dict[int, pd.DataFrame], column: str, length: int) -> np.ndarray:
    out = np.full((len(curves), length), np.nan)
    for k, frame in enumerate(curves.values()):
        out[k, : len(frame)] = frame[column].to_numpy(dtype=np.float64)
    return out


def _triangulation(placements: pd.DataFrame, scalability: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """The Delaunay triangulation over (nodes, replicas, local batch size) as scipy's LinearNDInterpolator
    builds it, and the values at its points, as `AppTables`' nd_* fields."""
    from scipy.spatial import Delaunay

    xs, ys = ["num_nodes", "num_replicas", "local_bsz"], ["step_time", "sync_time"]
    means = placements.groupby(xs)[ys].mean().reset_index()
    points = pd.concat([means[xs + ys], scalability[xs + ys]], ignore_index=True)
    triangulation = Delaunay(points[xs].to_numpy(dtype=np.float64))
    return (points[ys].to_numpy(dtype=np.float64), triangulation.simplices.astype(np.int64),
            barycentric_transforms(triangulation), triangulation.neighbors.astype(np.int64),
            np.ascontiguousarray(triangulation.equations),
            np.array([triangulation.paraboloid_scale, triangulation.paraboloid_shift]),
            np.array([triangulation.min_bound, triangulation.max_bound]))


def barycentric_transforms(triangulation) -> np.ndarray:
    """scipy's `Delaunay.transform` (S, 4, 3), computed without LAPACK so that it is the same on every machine.

    scipy inverts each tetrahedron's edge matrix with the machine's LAPACK, whose kernels (chosen per CPU)
    round differently in the last bits. Here each inverse is Gaussian elimination with partial pivoting in a
    fixed order of float64 operations; a tetrahedron scipy found flat (NaN) stays NaN."""
    points, simplices = triangulation.points, triangulation.simplices
    flat = np.isnan(triangulation.transform[:, 0, 0])
    out = np.full((len(simplices), 4, 3), np.nan)
    for s, vertices in enumerate(simplices):
        if flat[s]:
            continue
        last = points[vertices[3]]
        edges = [[float(points[vertices[j], i] - last[i]) for j in range(3)] for i in range(3)]
        out[s, :3, :] = _inverse3(edges)
        out[s, 3, :] = last
    return out


def _inverse3(a: list[list[float]]) -> list[list[float]]:
    """The inverse of a 3x3 matrix by Gauss-Jordan elimination with partial pivoting, in plain float64."""
    rows = [[*a[i], *(1.0 if i == j else 0.0 for j in range(3))] for i in range(3)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        head = rows[col][col]
        rows[col] = [v / head for v in rows[col]]
        for r in range(3):
            if r != col:
                factor = rows[r][col]
                rows[r] = [v - factor * w for v, w in zip(rows[r], rows[col])]
    return [row[3:] for row in rows]


def _tables(name: str, folder: Path) -> AppTables:
    curves = _validation(folder)
    placements = _read_csv(folder / "placements.csv", ("placement", "local_bsz", "step_time", "sync_time"))
    scalability = _read_csv(folder / "scalability.csv", ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"))
    digits = placements.placement.astype(str)
    placements = placements.assign(num_nodes=digits.str.len(), num_replicas=digits.map(lambda p: sum(map(int, p))))
    ordered = placements.sort_values(["placement", "local_bsz"], kind="mergesort")
    ids, start = np.unique(ordered.placement.to_numpy(dtype=np.int64), return_index=True)
    max_epochs = MAX_EPOCHS[name]
    length = max(len(c) for c in curves.values())
    progress = _padded(curves, "progress", length)[:, :max_epochs]
    if progress.shape[1] < max_epochs or np.isnan(progress).any():
        raise Dl2Error(f"{folder}: every validation-*.csv needs at least {max_epochs} epochs (rows)")
    progress_at = np.concatenate([[0.0], progress.min(axis=0)])
    values, simplices, transform, neighbors, equations, lift, bounds = _triangulation(placements, scalability)
    bsz = np.array(list(curves), dtype=np.float64)
    return AppTables(
        init_bsz=float(bsz[0]), max_bsz=float(bsz[-1]),
        min_local_bsz=float(placements.local_bsz.min()),
        max_local_bsz=float(MAX_LOCAL_BSZ.get(name, placements.local_bsz.max())),
        max_epochs=max_epochs,
        known_ids=ids, known_start=np.append(start, len(ordered)).astype(np.int64),
        known_rows=ordered[["local_bsz", "step_time", "sync_time"]].to_numpy(dtype=np.float64),
        nd_values=values, nd_simplices=simplices, nd_transform=transform,
        nd_neighbors=neighbors, nd_equations=equations, nd_lift=lift, nd_bounds=bounds,
        val_bsz=bsz, val_iteration=_padded(curves, "iteration", length),
        val_grad_sqr=_padded(curves, "grad_sqr", length), val_grad_var=_padded(curves, "grad_var", length),
        progress_at=progress_at,
    )


@lru_cache(maxsize=2)
def load_applications(traces_dir: Path = TRACES_DIR) -> tuple[Application, ...]:
    """The six applications, in `APP_NAMES` order, from the artifact's measurements."""
    missing = [n for n in APP_NAMES if not (traces_dir / n).is_dir()]
    if missing:
        raise Dl2Error(f"{traces_dir}: no measurements for {', '.join(missing)}")
    return tuple(Application(name, k, _tables(name, traces_dir / name)) for k, name in enumerate(APP_NAMES))


def app_tables(apps: tuple[Application, ...]) -> tuple[AppTables, ...]:
    """The tables of every application, indexable by application id in compiled code."""
    return tuple(a.tables for a in apps)


def application_index(name: str) -> int:
    """The id of an application by name, or an error listing the six."""
    if name not in APP_NAMES:
        raise Dl2Error(f"unknown application {name!r} (known: {', '.join(APP_NAMES)})")
    return APP_NAMES.index(name)
