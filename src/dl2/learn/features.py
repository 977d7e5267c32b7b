"""Network inputs from raw window states: job type one-hot (paper) or integer (authors' code), scaled counts."""

from __future__ import annotations

import numpy as np

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
