"""What a DL2 agent sees of each job of its window in the Pollux world: raw columns (the world's learning
shape, `dl2.worlds.WORLDS["pollux"].learning.job_features`, takes them from here) and their encoding as
network inputs."""

from __future__ import annotations

import numpy as np
from numba import njit

from dl2.pollux.apps import APP_NAMES

JOB_FEATURES = ("application", "seconds since submission", "progress", "GPUs given", "GPUs held", "restarts",
                "attained GPU-seconds")
NUM_JOB_FEATURES = len(JOB_FEATURES)
APP, AGE, PROGRESS, GIVEN, HELD, RESTARTS, ATTAINED = range(NUM_JOB_FEATURES)
# raw column -> scale of its encoding (application is one-hot; progress is already a fraction)
_GPU_SCALE = 8.0  # GPUs: two nodes' worth is 1
_RESTART_SCALE = 10.0
_HOUR = 3600.0


def encoded_size(window: int) -> int:
    """Network inputs of a window of `window` jobs."""
    return window * (len(APP_NAMES) + NUM_JOB_FEATURES - 1)


def encode(states: np.ndarray) -> np.ndarray:
    """(..., window, NUM_JOB_FEATURES) raw states -> (..., window * per-job inputs) float32: the application
    one-hot (all zero in an empty slot), hours since submission and attained GPU-hours as log(1 + x),
    progress as is, GPUs / 8, restarts / 10."""
    states = np.asarray(states, dtype=np.float64)
    app = states[..., APP].astype(np.int64)
    one_hot = (app[..., None] == np.arange(1, len(APP_NAMES) + 1)).astype(np.float32)
    rest = np.stack([np.log1p(states[..., AGE] / _HOUR), states[..., PROGRESS], states[..., GIVEN] / _GPU_SCALE,
                     states[..., HELD] / _GPU_SCALE, states[..., RESTARTS] / _RESTART_SCALE,
                     np.log1p(states[..., ATTAINED] / _HOUR)], axis=-1).astype(np.float32)
    per_job = np.concatenate([one_hot, rest], axis=-1)
    return per_job.reshape(*per_job.shape[:-2], -1)


@njit(cache=True)
def encode_row(raw: np.ndarray, kinds: int, out: np.ndarray) -> None:
    """`encode` of one raw job row (NUM_JOB_FEATURES,) into `out` (its per-job inputs), compiled for the
    greedy pass (`dl2.learn.pollux.fast_greedy`); the same float32 values as `encode`'s row (tested)."""
    app = int(raw[APP])
    for k in range(kinds):
        out[k] = 1.0 if app == k + 1 else 0.0
    rest = (np.log1p(raw[AGE] / _HOUR), raw[PROGRESS], raw[GIVEN] / _GPU_SCALE, raw[HELD] / _GPU_SCALE,
            raw[RESTARTS] / _RESTART_SCALE, np.log1p(raw[ATTAINED] / _HOUR))
    for k in range(len(rest)):
        out[kinds + k] = np.float32(rest[k])
