"""Network inputs from raw window states: job type one-hot (paper) or integer (authors' code), scaled counts."""

from __future__ import annotations

import numpy as np
from numba import njit

NUM_MODELS = 8
STAY_SCALE = 20.0  # slots since arrival
SHARE_SCALE = 10.0  # dominant shares are small fractions of the cluster


def feature_size(window: int, one_hot: bool) -> int:
    return window * ((NUM_MODELS if one_hot else 1) + 5)


def encode(states: np.ndarray, max_tasks: int, one_hot: bool = True) -> np.ndarray:
    """(..., window, 6) raw states -> (..., features) float32 network inputs."""
    states = np.asarray(states, dtype=np.float32)
    model = states[..., 0]
    rest = np.stack(
        [states[..., 1] / STAY_SCALE, states[..., 2], states[..., 3] * SHARE_SCALE,
         states[..., 4] / max_tasks, states[..., 5] / max_tasks], axis=-1)
    if one_hot:
        kind = (model[..., None] == np.arange(1, NUM_MODELS + 1, dtype=np.float32)).astype(np.float32)
    else:
        kind = (model / NUM_MODELS)[..., None]
    out = np.concatenate([kind, rest], axis=-1)
    return out.reshape(*out.shape[:-2], -1)


@njit(cache=True)
def encode_one(state: np.ndarray, max_tasks: int, one_hot: bool, out: np.ndarray) -> None:
    """`encode` for one (window, 6) state into `out`, the same values without numpy's per-call overhead."""
    kinds = NUM_MODELS if one_hot else 1
    width = kinds + 5
    out[:] = 0.0
    for j in range(state.shape[0]):
        base = j * width
        if one_hot:
            model = int(state[j, 0])
            if 1 <= model <= NUM_MODELS:
                out[base + model - 1] = 1.0
        else:
            out[base] = state[j, 0] / np.float32(NUM_MODELS)
        out[base + kinds] = state[j, 1] / np.float32(STAY_SCALE)
        out[base + kinds + 1] = state[j, 2]
        out[base + kinds + 2] = state[j, 3] * np.float32(SHARE_SCALE)
        out[base + kinds + 3] = state[j, 4] / np.float32(max_tasks)
        out[base + kinds + 4] = state[j, 5] / np.float32(max_tasks)
