"""A binary min-heap of (float key, int tie-break) pairs carrying a job index, for the policies.

The heap is three parallel plain arrays (key, tie, item) and a size the caller keeps; entries compare
by (key, tie), so with unique ties the order of removal is fully determined. The entry to look at
next is at index 0.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def new_pqueue(capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty (key, tie, item) arrays for up to `capacity` entries."""
    return np.empty(capacity), np.empty(capacity, np.int64), np.empty(capacity, np.int64)


@njit(cache=True, inline="always")
def _sift_down(key: np.ndarray, tie: np.ndarray, item: np.ndarray, size: int, pos: int, k: float, t: int, it: int) -> None:
    """Put entry (k, t, it) into the hole at `pos`, moving smaller children up."""
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (key[right] < key[child] or (key[right] == key[child] and tie[right] < tie[child])):
            child = right
        if not (key[child] < k or (key[child] == k and tie[child] < t)):
            break
        key[pos], tie[pos], item[pos] = key[child], tie[child], item[child]
        pos = child
    key[pos], tie[pos], item[pos] = k, t, it


@njit(cache=True, inline="always")
def push(key: np.ndarray, tie: np.ndarray, item: np.ndarray, size: int, k: float, t: int, it: int) -> int:
    """Add entry (k, t, it); returns the new size."""
    pos = size
    while pos > 0:
        parent = (pos - 1) // 2
        if not (k < key[parent] or (k == key[parent] and t < tie[parent])):
            break
        key[pos], tie[pos], item[pos] = key[parent], tie[parent], item[parent]
        pos = parent
    key[pos], tie[pos], item[pos] = k, t, it
    return size + 1


@njit(cache=True, inline="always")
def pop(key: np.ndarray, tie: np.ndarray, item: np.ndarray, size: int) -> int:
    """Remove the smallest entry; returns the new size."""
    last = size - 1
    if last > 0:
        _sift_down(key, tie, item, last, 0, key[last], tie[last], item[last])
    return last


@njit(cache=True, inline="always")
def replace_top(key: np.ndarray, tie: np.ndarray, item: np.ndarray, size: int, k: float, t: int, it: int) -> None:
    """Remove the smallest entry and add (k, t, it): a pop and a push in one pass."""
    _sift_down(key, tie, item, size, 0, k, t, it)
