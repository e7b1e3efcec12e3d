"""Breadth-first orders and recursive BFS bisection, shared by Fennel's streaming and bisection starts
(``fennel.py``) and the multilevel start's coarsest graph (``multilevel.py``)."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["_bfs", "_bisect"]


def _bisect(indptr: np.ndarray, indices: np.ndarray, num_parts: int, parts: np.ndarray,
            vweight: np.ndarray | None = None) -> None:
    """Recursive BFS bisection into ``parts`` (int64 (N,), overwritten with [0, K)); see ``fennel.py``'s module
    docstring.

    Each cut of a BFS order falls where the first side holds k1 / k of the piece: of its vertices, or of
    ``vweight`` (float64 (N,)) when given.

    A piece is the set of vertices with one label; its label is its first part id plus ``num_parts`` until it
    is final, so a BFS over one piece skips every vertex of the others. The pieces on the stack are disjoint,
    so the stack holds at most N vertex ids in all.
    """
    n = parts.shape[0]
    k = num_parts
    parts[:] = k  # one piece, label k: parts 0..K-1 start at id 0
    seen = np.zeros(n, dtype=np.int8)
    stack = [(np.arange(n, dtype=np.int64), 0, k)]  # (vertices, first part id, number of parts)
    while stack:
        verts, first, kk = stack.pop()
        if verts.shape[0] == 0:  # more parts than vertices: those parts stay empty
            continue
        if kk == 1:
            parts[verts] = first
            continue
        order = np.empty(verts.shape[0], dtype=np.int64)
        _bfs(indptr, indices, verts[0], order, verts, parts, first + k, seen)
        _bfs(indptr, indices, order[-1], order, verts, parts, first + k, seen)  # again from the far end
        k1 = kk // 2
        if vweight is None:
            n1 = int(round(verts.shape[0] * k1 / kk))
        else:
            prefix = np.cumsum(vweight[order])  # (piece,)
            n1 = int(np.searchsorted(prefix, prefix[-1] * k1 / kk))
        left, right = order[:n1], order[n1:]
        parts[left] = first + k
        parts[right] = first + k1 + k
        stack.append((right, first + k1, kk - k1))
        stack.append((left, first, k1))


@numba.njit(cache=True)
def _bfs(indptr, indices, start_vertex, order, verts, label, lab, seen):
    """Breadth-first order from ``start_vertex`` into ``order``, restarting at the next unvisited vertex when a
    component ends. O(vertices + their rows) time; ``order`` is the queue.

    Whole graph: ``verts``, ``label`` and ``seen`` None (restarts at the lowest unvisited id; a fresh int8 flag
    array). One piece: ``verts`` its vertices (restarts follow their order), only neighbours with
    ``label[u] == lab`` are followed, and ``seen`` (N,) int8 is scratch, reset here for the piece. (numba compiles
    the two cases separately and drops the branches on None.)
    """
    if verts is None:
        m = indptr.shape[0] - 1
        flags = np.zeros(m, dtype=np.int8)
    else:
        m = verts.shape[0]
        flags = seen
        for i in range(m):
            flags[verts[i]] = 0
    head = tail = 0
    nxt = 0
    root = start_vertex
    while tail < m:
        if head == tail:  # a new component: the start vertex first, then the next unvisited one
            while flags[root]:
                if verts is None:
                    root = nxt
                else:
                    root = verts[nxt]
                nxt += 1
            flags[root] = 1
            order[tail] = root
            tail += 1
        v = order[head]
        head += 1
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if flags[u]:
                continue
            if label is not None and label[u] != lab:
                continue
            flags[u] = 1
            order[tail] = u
            tail += 1
    return order
