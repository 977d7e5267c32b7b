"""New Pollux-world workloads drawn from the Philly job log (`data/reference/pollux/traces/philly.csv`), as
the artifact's generator (`simulator/workload.py`) draws them; its 32 shipped workloads are
`generate_workload(round(160 * load), seed=k)` for k = 1..8.

A workload is drawn in four steps:

- the table: jobs that ran at least 60 s and used under 1000 GPU-hours, submitted within `duration_hours`
  hours of the day from `start_hour` (any day); a job's submission second is its time of day after the
  start of that window;
- the sample: `num_jobs` of them, in the order of a numpy `RandomState` permutation (what pandas'
  `DataFrame.sample` does) whose seed is the first draw of the job stream;
- the application, by GPU time: under 1 GPU-hour cifar10 or ncf (a draw), under 10 deepspeech2, under 100
  yolov3, else imagenet; then the GPUs and batch size: a draw among the application's `configurations`;
- half the deepspeech2 jobs (a second stream) become bert jobs with a configuration of bert's (drawn
  from that stream too). The first stream's deepspeech2 draw is still made.

The artifact also draws a GPU count for yolov3 and imagenet jobs from a third stream, which nothing uses
(the lines that would are commented out); no output depends on it, so it is not drawn here. Draws are
made with the artifact's Python `random` arithmetic (`_below`), so they do not depend on how a later
Python implements `choice` or `randint`.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pandas as pd

from dl2.errors import Dl2Error
from dl2.paths import REFERENCE_DIR
from dl2.pollux.apps import APP_NAMES, Application, application_index, load_applications
from dl2.pollux.kernels import throughput
from dl2.pollux.workload import Workload, write_workload
from dl2.workload.traces import csv_rows

PHILLY_CSV = REFERENCE_DIR / "pollux" / "traces" / "philly.csv"
COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time")  # others (the artifact's `cluster`) are not read
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"
# The artifact's assumptions: a cluster of nodes of 4 GPUs, the GPU counts a user asks for, and a job that
# a user would not run longer than 12 hours on them.
GPUS_PER_NODE = 4
REPLICA_CHOICES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
MAX_JCT = 12 * 3600
MIN_DURATION = 60  # seconds a job must have run to be drawn
MAX_GPU_TIME = 1000 * 3600  # GPU-seconds a job must stay under
HOUR = 3600


# --- the job table -----------------------------------------------------------------------------------


def _rows(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """(`file:line` of each job, the text of each column read) of the table."""
    wheres: list[str] = []
    texts: dict[str, list[str]] = {c: [] for c in COLUMNS}
    for where, row in csv_rows(path, COLUMNS, "Philly job table"):
        wheres.append(where)
        for column in COLUMNS:
            texts[column].append(row[column].strip())
    if not wheres:
        raise Dl2Error(f"{path}: no jobs (only a header)")
    return wheres, texts


def _first_bad(wheres: list[str], texts: list[str], bad: np.ndarray, field: str, expected: str) -> None:
    """Raise for the first row where `bad` holds, naming its file:line and `field`."""
    if bad.any():
        k = int(np.argmax(bad))
        raise Dl2Error(f"{wheres[k]}: {field}: expected {expected}, got {texts[k]!r}")


def load_philly(path: Path = PHILLY_CSV) -> pd.DataFrame:
    """The Philly job table: `timestamp` (datetime64), `duration` and `gpu_time` (seconds, float), `num_gpus`
    (int64), one row per job in file order; other columns are not read. A missing file or column, or a
    field that does not parse, is a `Dl2Error` naming the file, the line and the field."""
    wheres, texts = _rows(Path(path))
    stamps = pd.to_datetime(pd.Series(texts["timestamp"]), format=TIMESTAMP_FORMAT, errors="coerce")
    _first_bad(wheres, texts["timestamp"], stamps.isna().to_numpy(), "timestamp", "a time YYYY-MM-DD HH:MM:SS")
    table = {"timestamp": stamps}
    for column in ("duration", "gpu_time"):
        values = pd.to_numeric(pd.Series(texts[column]), errors="coerce").to_numpy(dtype=np.float64)
        _first_bad(wheres, texts[column], ~(np.isfinite(values) & (values >= 0)), column, "a number of seconds >= 0")
        table[column] = values
    gpus = pd.to_numeric(pd.Series(texts["num_gpus"]), errors="coerce").to_numpy(dtype=np.float64)
    _first_bad(wheres, texts["num_gpus"], ~(np.isfinite(gpus) & (gpus >= 1) & (gpus == np.floor(gpus))), "num_gpus",
               "an integer >= 1")
    table["num_gpus"] = gpus.astype(np.int64)
    return pd.DataFrame(table)[list(COLUMNS)]


# --- the configurations a user asks for --------------------------------------------------------------


def _placement(num_replicas: int) -> np.ndarray:
    """GPUs per node when `num_replicas` fill whole nodes first."""
    full, rest = divmod(num_replicas, GPUS_PER_NODE)
    return np.array([GPUS_PER_NODE] * full + ([rest] if rest else []), dtype=np.int64)


def _ceil(x: float) -> int:
    """The artifact's ceiling, which forgives a rounding error just above an integer."""
    return math.ceil(x - 1e-8)


def _jct(app: Application, counts: np.ndarray, k: int) -> float | None:
    """Seconds to train `app` to completion at its k-th measured total batch size on `counts`, accumulating
    gradients when a GPU's share exceeds its largest batch; None when the share is under its smallest."""
    local_bsz = _ceil(app.tables.val_bsz[k] / counts.sum())
    if local_bsz < app.min_local_bsz:
        return None
    accum_steps = _ceil(local_bsz / app.max_local_bsz) - 1
    atomic_bsz = _ceil(local_bsz / (accum_steps + 1))
    step_time, sync_time = throughput(app.tables, counts, float(atomic_bsz))
    if math.isnan(step_time) or math.isnan(sync_time):
        raise Dl2Error(f"{app.name}: no throughput measured near {atomic_bsz} per GPU on placement {counts.tolist()}")
    step_time += accum_steps * (step_time - sync_time)
    return float(app.tables.val_iteration[k, app.max_epochs - 1]) * step_time


def _best(app: Application, num_replicas: int) -> tuple[int, float]:
    """(measured batch size, JCT) of the quickest measured batch size on `num_replicas` GPUs (the first of
    equals)."""
    counts = _placement(num_replicas)
    best_bsz, best_jct = 0, math.inf
    for k, batch_size in enumerate(app.tables.val_bsz):
        jct = _jct(app, counts, k)
        if jct is not None and jct < best_jct:
            best_bsz, best_jct = int(batch_size), jct
    return best_bsz, best_jct


def configurations(app: Application, low_util: float = 0.5, high_util: float = 0.8) -> list[tuple[int, int, float]]:
    """The (num_replicas, batch_size, JCT seconds) a user would reasonably ask for (the artifact's
    `Application.get_configurations`): for each GPU count of `REPLICA_CHOICES` whose smallest batches fit the
    largest measured batch size, the measured batch size that finishes soonest; kept when it finishes within
    12 hours and its speed-up over one GPU, per GPU, lies strictly between `low_util` and `high_util`.
    When none is kept, the one-GPU choice."""
    base_bsz, base_jct = _best(app, 1)
    chosen = []
    for num_replicas in REPLICA_CHOICES[1:]:
        if num_replicas * app.min_local_bsz > app.max_batch_size:
            break
        batch_size, jct = _best(app, num_replicas)
        if jct < MAX_JCT and low_util < base_jct / jct / num_replicas < high_util:
            chosen.append((num_replicas, batch_size, jct))
    return chosen or [(1, base_bsz, base_jct)]


# --- the generator -----------------------------------------------------------------------------------


def _below(rng: random.Random, n: int) -> int:
    """A draw in [0, n) as the artifact's Python made it for `choice` and `randint`: the bits of n, redrawn
    until below n."""
    bits = n.bit_length()
    value = rng.getrandbits(bits)
    while value >= n:
        value = rng.getrandbits(bits)
    return value


def _window(philly: pd.DataFrame, start_hour: int, duration_hours: int) -> tuple[np.ndarray, np.ndarray]:
    """(second in the window, GPU-seconds) of the jobs that may be drawn, in table order."""
    kept = philly[(philly.duration >= MIN_DURATION) & (philly.gpu_time < MAX_GPU_TIME)]
    shifted = kept.timestamp - pd.Timedelta(hours=start_hour)
    inside = (shifted.dt.hour < duration_hours).to_numpy()
    seconds = (shifted.dt.hour * HOUR + shifted.dt.minute * 60 + shifted.dt.second).to_numpy(dtype=np.int64)
    return seconds[inside], kept.gpu_time.to_numpy(dtype=np.float64)[inside]


def _check_arguments(num_jobs: int, start_hour: int, duration_hours: int) -> None:
    if num_jobs < 1:
        raise Dl2Error(f"num_jobs: expected at least 1 job, got {num_jobs}")
    if start_hour < 0:
        raise Dl2Error(f"start_hour: expected an hour >= 0, got {start_hour}")
    if not 1 <= duration_hours <= 24:
        raise Dl2Error(f"duration_hours: expected 1..24 hours, got {duration_hours}")


def _application(gpu_time: float, rng: random.Random) -> str:
    """The application a job of this many GPU-seconds runs (a draw of `rng` for the shortest)."""
    if gpu_time < 1 * HOUR:
        return ("cifar10", "ncf")[_below(rng, 2)]
    if gpu_time < 10 * HOUR:
        return "deepspeech2"
    if gpu_time < 100 * HOUR:
        return "yolov3"
    return "imagenet"


def generate_workload(num_jobs: int, seed: int, start_hour: int = 2, duration_hours: int = 8,
                      philly: pd.DataFrame | None = None) -> Workload:
    """`num_jobs` jobs drawn from the Philly table (`load_philly()` unless given) submitted within
    `duration_hours` hours of the day from `start_hour`, as the artifact's `workload.generate(num_jobs,
    start_hour, duration_hours, seed)` draws them; jobs sorted by submission second, named
    "{application}-{position}"."""
    _check_arguments(num_jobs, start_hour, duration_hours)
    if philly is None:
        philly = load_philly()
    missing = [c for c in COLUMNS if c not in philly.columns]
    if missing:
        raise Dl2Error(f"philly: missing column {missing[0]!r} (load_philly() reads the table)")
    seconds, gpu_time = _window(philly, start_hour, duration_hours)
    if num_jobs > len(seconds):
        raise Dl2Error(f"num_jobs: {num_jobs} jobs asked for, but only {len(seconds)} of the table ran >= {MIN_DURATION} s, "
                       f"used < {MAX_GPU_TIME // HOUR} GPU-hours and were submitted within {duration_hours} hours "
                       f"from {start_hour}:00")
    apps = load_applications()
    choices = {a.name: configurations(a) for a in apps}
    jobs, bert = random.Random(seed), random.Random(seed + 3)
    sample_seed = _below(jobs, (1 << 32) + 1)  # randint(0, 2**32)
    if sample_seed == 1 << 32:
        raise Dl2Error(f"seed: {seed} draws a sampling seed of 2**32, which numpy (and the artifact) cannot use")
    rows = np.random.RandomState(sample_seed).permutation(len(seconds))[:num_jobs]
    records = []
    for row in rows:
        name = _application(gpu_time[row], jobs)
        replicas, batch_size, _ = choices[name][_below(jobs, len(choices[name]))]
        if name == "deepspeech2" and _below(bert, 2):
            name = "bert"
            replicas, batch_size, _ = choices[name][_below(bert, len(choices[name]))]
        records.append((int(seconds[row]), application_index(name), replicas, batch_size))
    records.sort(key=lambda r: r[0])
    time, app, replicas, batch = (np.array(column, dtype=np.int64) for column in zip(*records))
    names = tuple(f"{APP_NAMES[a]}-{k}" for k, a in enumerate(app))
    return Workload(names, time, app, replicas, batch)


def write_workloads(out_dir: str | Path, count: int, first_seed: int, num_jobs: int = 160, start_hour: int = 2,
                    duration_hours: int = 8) -> pd.DataFrame:
    """Write `count` workloads, `workload-<seed>.csv` for seeds `first_seed`.., into `out_dir`; returns their
    statistics, one row each. (`count=8, first_seed=1` rewrites the artifact's shipped ones at that size.)"""
    if count < 1:
        raise Dl2Error(f"count: expected at least one workload, got {count}")
    philly = load_philly()
    rows = []
    for seed in range(first_seed, first_seed + count):
        workload = generate_workload(num_jobs, seed, start_hour, duration_hours, philly)
        write_workload(workload, Path(out_dir) / f"workload-{seed}.csv")
        stats = workload.stats()
        rows.append({"workload": f"workload-{seed}", **{k: v for k, v in stats.items() if k != "jobs_per_application"},
                     **{f"jobs_{a}": n for a, n in stats["jobs_per_application"].items()}})
    return pd.DataFrame(rows).fillna(0)
