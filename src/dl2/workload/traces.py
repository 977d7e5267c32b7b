"""Job traces: generation (DESIGN §4), CSV reading with validation, writing, and statistics.

A trace file is a CSV with a header and one job per row: `job_id,arrival_slot,model,num_epochs`
(extra columns are ignored). Anything else is an error naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dl2.errors import Dl2Error
from dl2.paths import atomic_path
from dl2.workload.catalog import Catalog, workload_constants
from dl2.workload.presets import Preset

COLUMNS = ("job_id", "arrival_slot", "model", "num_epochs")
ARRIVAL_PATTERNS = ("ali", "google", "poisson", "uniform")
LENGTH_PATTERNS = ("ali", "fixed", "normal")


@dataclass(frozen=True)
class Trace:
    """Jobs of one trace, one array entry per job, in file order."""

    job_id: np.ndarray  # int64, unique, positive
    arrival: np.ndarray  # int64 slot >= 0
    model: np.ndarray  # int64 index into `model_names`
    num_epochs: np.ndarray  # float64 > 0
    model_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.job_id)

    def stats(self) -> dict[str, Any]:
        """Counts and spreads a person would check first."""
        counts = np.bincount(self.model, minlength=len(self.model_names))
        return {
            "num_jobs": len(self),
            "first_arrival": int(self.arrival.min()),
            "last_arrival": int(self.arrival.max()),
            "max_arrivals_per_slot": int(np.bincount(self.arrival).max()),
            "mean_epochs": float(self.num_epochs.mean()),
            "jobs_per_model": {n: int(k) for n, k in zip(self.model_names, counts) if k},
        }


def _arrival_pattern(kind: str, max_arrivals: int, rng: np.random.Generator) -> list[int]:
    constants = workload_constants()
    if kind == "ali":
        pattern = constants["ali_trace"]["arrivals_per_slot"]
        ratio = max(pattern) / max_arrivals
        return [int(math.ceil(a / ratio)) for a in pattern]
    if kind == "google":
        patterns = constants["google_trace_arrivals_per_slot_by_max"]
        if str(max_arrivals) not in patterns:
            raise Dl2Error(f"google arrivals exist for max_arrivals in {{{', '.join(patterns)}}}, not {max_arrivals}")
        return list(patterns[str(max_arrivals)])
    if kind == "poisson":
        return [int(a) for a in rng.poisson(max_arrivals, 100)]
    if kind == "uniform":
        return [max_arrivals] * 100
    raise Dl2Error(f"unknown arrival pattern {kind!r} (known: {', '.join(ARRIVAL_PATTERNS)})")


def _draw_job(kind: str, preset: Preset, rng: np.random.Generator) -> tuple[int, float]:
    """(model id, num_epochs) of one job."""
    constants = workload_constants()
    if kind == "ali":
        ali = constants["ali_trace"]
        probs = np.asarray(ali["length_bin_probabilities"])
        cumsum = np.cumsum(probs)
        bucket = int(np.argmax(cumsum > probs.sum() * rng.random()))
        epochs = int(ali["length_bin_minutes"][bucket] / ali["length_bin_minutes"][-1] * preset.max_epochs)
        model = ali["bin_to_model_index_dev_snapshot_unused"][bucket] if preset.bucket_to_model else bucket
        return int(model), float(max(epochs, 1))
    fractions = constants["normal_pattern_epoch_fraction_of_max"]
    model = int(rng.integers(0, len(fractions)))
    epochs = int(fractions[model] * preset.max_epochs)
    if kind == "normal":
        return model, epochs * int(rng.integers(90, 110)) / 100.0
    if kind == "fixed":
        return model, float(epochs)
    raise Dl2Error(f"unknown length pattern {kind!r} (known: {', '.join(LENGTH_PATTERNS)})")


def generate_trace(
    preset: Preset,
    catalog: Catalog,
    seed: int | np.random.SeedSequence,
    arrivals: str = "ali",
    lengths: str = "ali",
) -> Trace:
    """A trace of `preset.num_jobs` jobs, arrivals per slot from `arrivals`, lengths from `lengths`.

    Per slot: the pattern entry read from a random offset 0..4 (cycling), capped at `max_arrivals`.
    """
    if arrivals not in ARRIVAL_PATTERNS:
        raise Dl2Error(f"unknown arrival pattern {arrivals!r} (known: {', '.join(ARRIVAL_PATTERNS)})")
    if lengths not in LENGTH_PATTERNS:
        raise Dl2Error(f"unknown length pattern {lengths!r} (known: {', '.join(LENGTH_PATTERNS)})")
    rng = np.random.default_rng(seed)
    pattern = _arrival_pattern(arrivals, preset.max_arrivals, rng)
    if sum(pattern) == 0:
        raise Dl2Error(f"arrival pattern {arrivals!r} brings no jobs")
    offset = int(rng.integers(0, 5))
    rows: list[tuple[int, int, int, float]] = []
    slot = 0
    while len(rows) < preset.num_jobs:
        for _ in range(min(preset.max_arrivals, pattern[(slot + offset) % len(pattern)])):
            model, epochs = _draw_job(lengths, preset, rng)
            rows.append((len(rows) + 1, slot, model, epochs))
            if len(rows) == preset.num_jobs:
                break
        slot += 1
    ids, arrival, model, epochs = (np.asarray(col) for col in zip(*rows))
    return Trace(
        job_id=ids.astype(np.int64),
        arrival=arrival.astype(np.int64),
        model=model.astype(np.int64),
        num_epochs=epochs.astype(np.float64),
        model_names=catalog.names,
    )


def write_trace(trace: Trace, path: str | Path) -> None:
    """Write `trace` as CSV, atomically."""
    with atomic_path(path) as tmp:
        with tmp.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            for i in range(len(trace)):
                writer.writerow(
                    (int(trace.job_id[i]), int(trace.arrival[i]), trace.model_names[trace.model[i]], repr(float(trace.num_epochs[i])))
                )


def parse_int(text: str, where: str, field: str, minimum: int) -> int:
    """`text` as an integer >= `minimum`, or an error naming `where` (file:line) and the field."""
    try:
        value = int(text.strip())
    except ValueError:
        raise Dl2Error(f"{where}: {field}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise Dl2Error(f"{where}: {field}: expected an integer >= {minimum}, got {value}")
    return value


def csv_rows(path: str | Path, columns: tuple[str, ...], what: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(`file:line`, {column: text}) for every non-blank row of a CSV file whose header names `columns`
    (others may stand beside them); a missing file, an empty one, a missing column or a malformed row is an
    error naming the file and line. `what` names the kind of file in those errors ("trace")."""
    path = Path(path)
    if not path.is_file():
        raise Dl2Error(f"{path}: {what} file not found")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise Dl2Error(f"{path}: not a CSV text file") from None
    if not text.strip():
        raise Dl2Error(f"{path}: empty file (expected a header {','.join(columns)} and one row per job)")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except csv.Error as exc:
        raise Dl2Error(f"{path}:1: not a CSV header ({exc})") from None
    missing = [c for c in columns if c not in header]
    if missing:
        raise Dl2Error(f"{path}:1: missing column {missing[0]!r} (header must name {','.join(columns)})")
    col = {c: header.index(c) for c in columns}
    while True:
        lineno = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise Dl2Error(f"{path}:{lineno}: not a CSV row ({exc})") from None
        if not row or not any(cell.strip() for cell in row):
            continue
        where = f"{path}:{lineno}"
        if len(row) != len(header):
            raise Dl2Error(f"{where}: expected {len(header)} fields, got {len(row)}")
        yield where, {c: row[k] for c, k in col.items()}


def read_trace(path: str | Path, catalog: Catalog) -> Trace:
    """Read and validate a trace CSV; the first problem found is raised as a `Dl2Error`."""
    ids, arrivals, models, epochs = [], [], [], []
    seen: dict[int, str] = {}
    for where, row in csv_rows(path, COLUMNS, "trace"):
        job_id = parse_int(row["job_id"], where, "job_id", 1)
        if job_id in seen:
            raise Dl2Error(f"{where}: job_id: duplicate id {job_id} (first on line {seen[job_id]})")
        seen[job_id] = where.rpartition(":")[2]
        arrival = parse_int(row["arrival_slot"], where, "arrival_slot", 0)
        name = row["model"].strip()
        if name not in catalog.names:
            raise Dl2Error(f"{where}: model: unknown model {name!r} (known: {', '.join(catalog.names)})")
        try:
            num_epochs = float(row["num_epochs"])
        except ValueError:
            raise Dl2Error(f"{where}: num_epochs: expected a number, got {row['num_epochs']!r}") from None
        if not math.isfinite(num_epochs) or num_epochs <= 0:
            raise Dl2Error(f"{where}: num_epochs: expected a positive number, got {row['num_epochs'].strip()}")
        ids.append(job_id)
        arrivals.append(arrival)
        models.append(catalog.index(name))
        epochs.append(num_epochs)
    if not ids:
        raise Dl2Error(f"{path}: no jobs (only a header)")
    return Trace(
        job_id=np.asarray(ids, dtype=np.int64),
        arrival=np.asarray(arrivals, dtype=np.int64),
        model=np.asarray(models, dtype=np.int64),
        num_epochs=np.asarray(epochs, dtype=np.float64),
        model_names=catalog.names,
    )
