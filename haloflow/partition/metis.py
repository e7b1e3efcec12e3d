"""METIS through pymetis, with the symmetric adjacency it needs built in two linear passes.

METIS partitions an undirected graph given as a symmetric adjacency without self-loops or repeated entries.
Our CSR lists in-neighbours (row v = sources of edges into v), so the adjacency of v is the union of its in- and
out-neighbours::

    edges 0->1, 2->1, 1->2, 2->2        in-CSR rows: 0: []   1: [0, 2]   2: [1, 2]
    out-neighbours (transpose):          0: [1]  1: [2]      2: [1, 2]
    adjacency = in U out, minus v:       0: [1]  1: [0, 2]   2: [1]
    xadj = [0, 1, 3, 4]    adjncy = [1, 0, 2, 1]

When the input already is such an adjacency (checked in O(nnz log d), no allocation), its arrays go to METIS
as they are. Otherwise the transpose (N+1 + nnz int64) is built, merged row by row into ``xadj``/``adjncy``
(N+1 + at most 2 nnz int64) and freed before METIS runs. int64 arrays are handed to pymetis without a copy
(its ``idx_t`` is 64-bit; see ``pymetis.zero_copy_dtype()``).
"""

from __future__ import annotations

import logging

import numba
import numpy as np

__all__ = ["symmetric_adjacency", "metis_partition"]

log = logging.getLogger(__name__)

_METIS_DEFAULT_SEED = 4321  # what METIS uses when options[SEED] = -1
_METIS_DEFAULT_IMBALANCE = 1.03  # k-way default ufactor 30; recursive bisection uses 1.001 per level


def symmetric_adjacency(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, *,
                        known_symmetric: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(xadj, adjncy)``: int64 (N+1,) and (nnz_sym,), rows sorted, no self-loops, no repeats.

    Returns the input arrays themselves (as int64) when they already form such an adjacency: without a check when
    the caller knows it (``known_symmetric``, from ``CSRGraph.simple_symmetric``), else after one parallel pass.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    if known_symmetric or _is_simple_symmetric(indptr, indices):  # the common case (a symmetrised CSRGraph): no copy at all
        return indptr, indices
    if not _rows_sorted(indptr, indices):
        indices = _sort_rows(indptr, indices.copy())
    t_indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(indices, minlength=num_nodes), out=t_indptr[1:])
    t_indices = _transpose(indptr, indices, t_indptr)  # (nnz,) out-neighbours, sorted in each row
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    _merge(indptr, indices, t_indptr, t_indices, xadj, np.empty(0, dtype=np.int64), False)
    np.cumsum(xadj, out=xadj)  # counts in xadj[1:] -> offsets
    adjncy = np.empty(int(xadj[-1]), dtype=np.int64)
    _merge(indptr, indices, t_indptr, t_indices, xadj, adjncy, True)
    del t_indptr, t_indices  # freed before METIS allocates its own copies
    return xadj, adjncy


def metis_partition(
    xadj: np.ndarray,
    adjncy: np.ndarray,
    num_parts: int,
    *,
    vweights: np.ndarray | None = None,
    imbalance: float = 1.05,
    seed: int = 0,
) -> np.ndarray:
    """int64 (N,) METIS part of each vertex (recursive bisection for K <= 8, k-way above, as pymetis chooses).

    Args:
        xadj, adjncy: a symmetric adjacency from :func:`symmetric_adjacency`.
        vweights: int64 (N,) the one vertex weight METIS balances (None: vertex count).
        imbalance: passed to METIS (``ufactor``) only when tighter than METIS's default; the rebalancing in
            ``partition_graph`` enforces it either way.
        seed: offset from METIS's default seed; the same seed gives the same partition, and seed 0 gives
            exactly what ``pymetis.part_graph`` gives with default options.
    """
    import pymetis

    n = xadj.shape[0] - 1
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64)
    if adjncy.shape[0] == 0:  # METIS rejects an edgeless graph; any balanced split cuts nothing
        return np.arange(n, dtype=np.int64) * num_parts // max(n, 1)
    options = pymetis.Options()
    # seed 0 is METIS's own default seed (4321), so the default config reproduces a plain pymetis call exactly
    options.seed = _METIS_DEFAULT_SEED + int(seed)
    if imbalance < _METIS_DEFAULT_IMBALANCE:  # METIS's default (1.001 bisection, 1.03 k-way) is already tighter
        options.ufactor = max(1, int(round((imbalance - 1.0) * 1000)))  # METIS allows (1000 + ufactor) / 1000
    if vweights is not None:
        vweights = np.ascontiguousarray(vweights, dtype=np.int64)
    result = pymetis.part_graph(
        num_parts, pymetis.CSRAdjacency(xadj, adjncy), vweights=vweights, options=options
    )
    parts = np.frombuffer(result.vertex_part, dtype=np.int64).copy()  # (N,) pymetis returns array('q')
    log.debug("metis: K=%d, edge cut %d (each undirected edge once)", num_parts, result.edge_cuts)
    return parts


# --------------------------------------------------------------------------------------------- kernels
@numba.njit(cache=True)
def _rows_sorted(indptr, indices):
    for v in range(indptr.shape[0] - 1):
        for e in range(indptr[v] + 1, indptr[v + 1]):
            if indices[e - 1] > indices[e]:
                return False
    return True


@numba.njit(cache=True)
def _sort_rows(indptr, indices):
    for v in range(indptr.shape[0] - 1):
        indices[indptr[v]:indptr[v + 1]] = np.sort(indices[indptr[v]:indptr[v + 1]])
    return indices


@numba.njit(parallel=True, cache=True)
def _is_simple_symmetric(indptr, indices):
    """Every row strictly increasing (so sorted, no repeats), no self-loop, and every u in row v has v in row u.

    One parallel pass over nnz with a binary search in row u per entry; this check is all the overhead the metis
    path adds to a direct pymetis call on an already symmetric graph, so it runs on every core.
    """
    bad = 0
    for v in numba.prange(indptr.shape[0] - 1):
        lo, hi = indptr[v], indptr[v + 1]
        for e in range(lo, hi):
            u = indices[e]
            if u == v or (e > lo and indices[e - 1] >= u):
                bad += 1
                break
            a, b = indptr[u], indptr[u + 1]
            while a < b:  # first position in row u holding a value >= v (valid once every row passes)
                mid = (a + b) // 2
                if indices[mid] < v:
                    a = mid + 1
                else:
                    b = mid
            if a == indptr[u + 1] or indices[a] != v:
                bad += 1
                break
    return bad == 0


@numba.njit(cache=True)
def _transpose(indptr, indices, t_indptr):
    """Out-neighbour lists; rows come out sorted because destinations are visited in increasing order."""
    cursor = t_indptr[:-1].copy()
    t_indices = np.empty(indices.shape[0], dtype=np.int64)
    for v in range(indptr.shape[0] - 1):
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            t_indices[cursor[u]] = v
            cursor[u] += 1
    return t_indices


@numba.njit(cache=True)
def _merge(indptr, indices, t_indptr, t_indices, xadj, adjncy, fill):
    """Union of two sorted rows without v and without repeats. Count pass (fill=False) writes xadj[v+1]."""
    for v in range(indptr.shape[0] - 1):
        a, a_end = indptr[v], indptr[v + 1]
        b, b_end = t_indptr[v], t_indptr[v + 1]
        out = xadj[v] if fill else 0
        last = -1
        while a < a_end or b < b_end:
            if b == b_end or (a < a_end and indices[a] <= t_indices[b]):
                u = indices[a]
                a += 1
            else:
                u = t_indices[b]
                b += 1
            if u == v or u == last:
                continue
            last = u
            if fill:
                adjncy[out] = u
            out += 1
        if not fill:
            xadj[v + 1] = out
