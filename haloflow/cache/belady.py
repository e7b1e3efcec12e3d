"""Belady's optimal cache (MIN, 1966) on a trace of batches: the hit count no online policy can beat.

A trace is a sequence of batches, each a set of distinct row ids; a lookup is one id of one batch::

    batch 0: [3, 7, 9]     flattened: 3 7 9 | 7 2 | 3 7 ...     next use of each position: the position of the
    batch 1: [2, 7]                                            same id's next lookup (or never)
    batch 2: [3, 7]

On every miss with a full cache, MIN evicts the cached row used furthest in the future, or bypasses the miss
when the miss itself is used furthest (our caches may also serve a miss from the backing store without caching
it, so the bound must allow that too). With ``preload=True`` the cache starts holding the S distinct ids that
are looked up first (the best free warm start), so it also bounds policies that warm up from a histogram.

Why a batch cache cannot beat it: any batch schedule (hits pinned, misses admitted into evicted slots) is also
a schedule on the flattened trace with the same hits, and MIN with bypass is optimal among those.

Cost: O(n log n) for n lookups (a heap keyed by next use, stale entries skipped lazily), in numba.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

__all__ = ["belady_hits", "flatten_trace"]

_NEVER = np.iinfo(np.int64).max


def flatten_trace(trace: Sequence[np.ndarray]) -> np.ndarray:
    """One int64 array of every batch's distinct ids in order (each batch deduplicated and sorted)."""
    parts = [np.unique(np.asarray(b, dtype=np.int64)) for b in trace]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _next_use(flat: np.ndarray) -> np.ndarray:
    order = np.argsort(flat, kind="stable")  # (n,) positions grouped by id, ascending within an id
    nxt = np.full(flat.size, _NEVER, dtype=np.int64)
    same = flat[order[1:]] == flat[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


@njit(cache=True)
def _push(hk, hv, size, key, val):  # max-heap on key
    i = size
    hk[i], hv[i] = key, val
    while i > 0:
        p = (i - 1) // 2
        if hk[p] >= hk[i]:
            break
        hk[p], hk[i] = hk[i], hk[p]
        hv[p], hv[i] = hv[i], hv[p]
        i = p
    return size + 1


@njit(cache=True)
def _pop(hk, hv, size):
    size -= 1
    hk[0], hv[0] = hk[size], hv[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and hk[c + 1] > hk[c]:
            c += 1
        if hk[i] >= hk[c]:
            break
        hk[c], hk[i] = hk[i], hk[c]
        hv[c], hv[i] = hv[i], hv[c]
        i = c
    return size


@njit(cache=True)
def _min_hits(flat, nxt, num_rows, num_slots, preload):
    cur = np.full(num_rows, -1, dtype=np.int64)  # next use of a cached row, -1 = not cached
    hk = np.empty(flat.size + preload.size + 1, dtype=np.int64)
    hv = np.empty(flat.size + preload.size + 1, dtype=np.int64)
    size = 0
    used = 0
    first = np.full(num_rows, np.iinfo(np.int64).max, dtype=np.int64)
    for p in range(flat.size - 1, -1, -1):
        first[flat[p]] = p
    for x in preload:
        cur[x] = first[x]
        size = _push(hk, hv, size, first[x], x)
        used += 1
    hits = 0
    for p in range(flat.size):
        x, nu = flat[p], nxt[p]
        if cur[x] >= 0:
            hits += 1
            cur[x] = nu
            size = _push(hk, hv, size, nu, x)
            continue
        if used < num_slots:
            cur[x] = nu
            size = _push(hk, hv, size, nu, x)
            used += 1
            continue
        while cur[hv[0]] != hk[0]:  # skip stale entries (the row moved on or left)
            size = _pop(hk, hv, size)
        if hk[0] > nu:  # the furthest cached row is used later than x: swap them
            cur[hv[0]] = -1
            size = _pop(hk, hv, size)
            cur[x] = nu
            size = _push(hk, hv, size, nu, x)
    return hits


def belady_hits(trace: Sequence[np.ndarray], num_slots: int, *, num_rows: int | None = None,
                preload: bool = True) -> int:
    """Hits of the optimal cache of ``num_slots`` rows on ``trace`` (batches of ids; repeats inside a batch count
    once). ``preload`` starts it holding the first-used distinct ids (see the module docstring).
    """
    flat = flatten_trace(trace)
    if flat.size == 0 or num_slots < 1:
        return 0
    n = int(flat.max()) + 1 if num_rows is None else num_rows
    nxt = _next_use(flat)
    if preload:
        _, first = np.unique(flat, return_index=True)
        warm = flat[np.sort(first)[:num_slots]]
    else:
        warm = np.empty(0, dtype=np.int64)
    return int(_min_hits(flat, nxt, n, num_slots, warm))
