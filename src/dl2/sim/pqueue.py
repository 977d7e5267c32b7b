"""A binary min-heap of (float key, int tie-break) pairs carrying a job index, for the policies."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit


class PQueue(NamedTuple):
    key: np.ndarray  # float64
    tie: np.ndarray  # int64
    item: np.ndarray  # int64
    size: np.ndarray  # int64 (1,)


@njit(cache=True)
def new_pqueue(capacity: int) -> PQueue:
    return PQueue(np.empty(capacity), np.empty(capacity, np.int64), np.empty(capacity, np.int64), np.zeros(1, np.int64))


@njit(cache=True, inline="always")
def _less(q: PQueue, a: int, b: int) -> bool:
    return q.key[a] < q.key[b] or (q.key[a] == q.key[b] and q.tie[a] < q.tie[b])


@njit(cache=True, inline="always")
def _swap(q: PQueue, a: int, b: int) -> None:
    q.key[a], q.key[b] = q.key[b], q.key[a]
    q.tie[a], q.tie[b] = q.tie[b], q.tie[a]
    q.item[a], q.item[b] = q.item[b], q.item[a]


@njit(cache=True, inline="always")
def push(q: PQueue, key: float, tie: int, item: int) -> None:
    pos = q.size[0]
    q.key[pos], q.tie[pos], q.item[pos] = key, tie, item
    q.size[0] = pos + 1
    while pos > 0:
        parent = (pos - 1) // 2
        if not _less(q, pos, parent):
            break
        _swap(q, pos, parent)
        pos = parent


@njit(cache=True, inline="always")
def pop(q: PQueue) -> tuple[float, int]:
    """Remove the smallest entry; return its (key, item)."""
    key, item = q.key[0], q.item[0]
    last = q.size[0] - 1
    q.size[0] = last
    if last > 0:
        _swap(q, 0, last)
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= last:
                break
            if child + 1 < last and _less(q, child + 1, child):
                child += 1
            if not _less(q, child, pos):
                break
            _swap(q, pos, child)
            pos = child
    return key, item
