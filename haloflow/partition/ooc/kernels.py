"""The numba loops of the out-of-core passes: each one pass over its input, O(1) memory besides its outputs."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["count_into", "group_by", "compact_bucket", "number_by_part", "cut_ranges", "scatter_into",
           "warm_kernels"]


@numba.njit(cache=True)
def count_into(ids, counts):
    """``counts[ids[i]] += 1`` for every i (np.bincount would allocate an (N,) array per chunk)."""
    for i in range(ids.shape[0]):
        counts[ids[i]] += 1


@numba.njit(cache=True)
def group_by(keys, num_keys):
    """A stable counting sort: ``order`` (n,) lists the positions with key 0, then key 1, ... (each group in its
    original order), and ``offsets`` (num_keys+1,) where each group starts. One pass to count, one to place."""
    offsets = np.zeros(num_keys + 1, dtype=np.int64)
    for i in range(keys.shape[0]):
        offsets[keys[i] + 1] += 1
    for j in range(num_keys):
        offsets[j + 1] += offsets[j]
    cursor = offsets[:-1].copy()
    order = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        k = keys[i]
        order[cursor[k]] = i
        cursor[k] += 1
    return order, offsets


@numba.njit(cache=True)
def compact_bucket(keys, num_nodes, first_row, row_counts, out_degree, dedup):
    """Turn one bucket's sorted keys ``dst * N + src`` into CSR columns, in place.

    Writes the source of each kept entry to ``keys[:w]`` (dropping repeats when ``dedup``), counts the entries of
    each row into ``row_counts`` (rows ``first_row ..``), adds 1 to ``out_degree[src]`` per kept entry; returns w.
    """
    w = 0
    prev = -1
    for i in range(keys.shape[0]):
        key = keys[i]
        if dedup and key == prev:
            continue
        prev = key
        row = key // num_nodes
        col = key - row * num_nodes
        row_counts[row - first_row] += 1
        out_degree[col] += 1
        keys[w] = col
        w += 1
    return w


@numba.njit(cache=True)
def number_by_part(parts, bounds, out):
    """``out[v]`` = the new id of v: part p's nodes get bounds[p], bounds[p] + 1, ... in original order, which is
    what ``relabel`` computes with a stable argsort, in one pass and without the (N,) sort."""
    cursor = bounds[:-1].copy()
    for v in range(parts.shape[0]):
        p = parts[v]
        out[v] = cursor[p]
        cursor[p] += 1


@numba.njit(cache=True)
def _range_ends(counts, max_entries, max_rows, out):
    # One sweep; writes each range's end into out when out has room (the first call sizes it).
    n = counts.shape[0]
    b = 0
    lo = 0
    while lo < n:
        total = counts[lo]
        hi = lo + 1
        while hi < n and hi - lo < max_rows and total + counts[hi] <= max_entries:
            total += counts[hi]
            hi += 1
        if b < out.shape[0]:
            out[b] = hi
        b += 1
        lo = hi
    return b


def cut_ranges(counts: np.ndarray, max_entries: int, max_rows: int) -> np.ndarray:
    """Row bounds (B+1,) cutting rows 0..N-1 into consecutive ranges of <= max_entries entries (``counts`` per
    row) and <= max_rows rows; a row with more entries than max_entries is a range alone. Two sweeps, O(B)
    memory."""
    b = _range_ends(counts, max_entries, max_rows, np.zeros(0, dtype=np.int64))
    bounds = np.zeros(b + 1, dtype=np.int64)
    _range_ends(counts, max_entries, max_rows, bounds[1:])
    return bounds


@numba.njit(cache=True)
def scatter_into(out, idx, values):
    """``out[idx[i]] = values[i]`` (numpy's fancy assignment would first widen an int32 ``idx`` to an (n,) intp
    copy)."""
    for i in range(idx.shape[0]):
        out[idx[i]] = values[i]


def warm_kernels() -> None:
    """Load (or compile) every kernel of the passes on tiny inputs, for the dtypes the passes use, so that the
    memory plan's baseline already holds their machine code."""
    from haloflow.partition.fennel import FennelStream

    for ids in (np.zeros(2, np.int32), np.zeros(2, np.int64)):
        count_into(ids, np.zeros(2, np.int64))
        group_by(ids, 2)
        scatter_into(np.zeros(2, np.int64), ids, np.zeros(2, np.int64))
        number_by_part(ids, np.array([0, 2, 2], np.int64), np.zeros(2, ids.dtype))
        for weights in (None, np.ones((2, 2), np.int64)):  # the vertex count alone, or several weights
            caps = None if weights is None else np.full(2, 2, np.int64)
            stream = FennelStream(2, 2, 2, parts_dtype=np.int32, weights=weights, caps=caps)
            stream.place_rows(np.array([0, 1, 2], np.int64), ids[::-1].copy(), 0, restream=False)
            stream.place_rows(np.array([0, 1, 2], np.int64), ids, 0, restream=True)
    compact_bucket(np.zeros(2, np.int64), 2, 0, np.zeros(2, np.int64), np.zeros(2, np.int64), True)
    cut_ranges(np.ones(4, np.int64), 2, 2)
