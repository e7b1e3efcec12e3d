"""Multilevel Fennel: coarsen by size-constrained label propagation, start on the coarsest graph, refine on the way
back (the scheme of KaHIP's ParHIP and of HeiStream's buffers, with Fennel's own pieces at the ends).

Streaming Fennel places one vertex at a time and cannot find the few long-range bottlenecks of a mesh-like graph:
on a road network its cut is about 9x METIS's even from a recursive BFS bisection (``fennel.py``). Multilevel
methods find them on a coarse graph where each vertex stands for a region::

    level 0 = the symmetric graph (N, unit vertex and edge weights)
    coarsen:  label propagation, each vertex joining the neighbouring cluster it has the most edge weight to, no
              cluster heavier than U = ceil(W / C*) (W the total vertex weight, C* = max(COARSE_PER_PART * K,
              COARSE_MIN) the coarsest size aimed at); clusters become vertices (weights summed), parallel edges
              one edge (weights summed); repeat until <= C* vertices or a level shrinks by less than MIN_SHRINK
    start:    recursive BFS bisection of the coarsest graph by vertex weight (``bisect._bisect``), START_TRIES
              times with the vertices renumbered at random, each refined; the smallest cut wins
    refine:   on every level, coarsest first, the assignment projected from the level above, then sweeps that move
              a vertex to the part it has the most edge weight to when that lowers the cut (or keeps it and evens
              out the loads) and the part stays under the cap; a part over the cap sheds vertices at the least
              loss. The restreaming pass of Fennel with the cut as the score and a hard cap.
    V-cycles: V_CYCLES times in all; a later cycle coarsens again with clusters kept inside one part, so its
              coarsest graph carries the assignment, which the refinement then improves level by level

Level 0 is swept in id order, row block by row block (``multilevel_blocks``), so that a CSR on disk streams; the
coarser levels, in memory, in a random order drawn from the seed.

Measured on USA-road-NE (edges cut against pymetis's on the same symmetric graph, seeds 0 / 1): K = 4: 165 / 158
against 185; K = 16: 865 / 996 against 812 — 0.85-1.23x METIS, where streaming Fennel cuts 9-47x. On the social
graphs streaming Fennel's own start wins (Enron K = 4: multilevel 1.3x METIS, the stream 0.98x), so ``auto`` runs
both.

Memory: the levels' graphs, each a few times smaller than the one before (the first, N vertices and nnz entries
with int64 weights, is the largest): about 3x the symmetric CSR in all. Time: O(nnz) per sweep and level.
"""

from __future__ import annotations

import logging
import math

import numba
import numpy as np

from haloflow.errors import ConfigError
from haloflow.partition.bisect import _bisect

__all__ = ["multilevel_partition", "multilevel_blocks", "COARSE_PER_PART", "COARSE_MIN", "MIN_SHRINK", "CLUSTER_SWEEPS"]

log = logging.getLogger(__name__)

COARSE_PER_PART = 32  # the coarsest graph has about this many vertices per part
COARSE_MIN = 256
MIN_SHRINK = 0.9  # a level that keeps more than this share of its vertices ends the coarsening
CLUSTER_SWEEPS = 5  # label-propagation sweeps per coarsening level
MAX_LEVELS = 64
START_TRIES = 8  # bisections of the coarsest graph tried
V_CYCLES = 2  # the second coarsens within the first's parts and refines again


def multilevel_partition(indptr: np.ndarray, indices: np.ndarray, num_parts: int, *, imbalance: float = 1.05,
                         seed: int = 0, sweeps: int = 8, vweight: np.ndarray | None = None) -> np.ndarray:
    """int64 (N,) part of each vertex; each part's vertex weight at most ``max(floor(imbalance * W / K),
    ceil(W / K))`` where a heavy vertex allows (the caller's rebalancer holds the caps in the end).

    Args:
        indptr, indices: a symmetric adjacency (``metis.symmetric_adjacency``; self-loops are skipped).
        num_parts: K >= 1.
        imbalance: the cap on a part's weight, relative to W / K.
        seed: the order of the sweeps on the coarse levels.
        sweeps: refinement sweeps per level (each stops early when nothing moves).
        vweight: int64 (N,) vertex weights (default 1 each).
    """
    n = int(indptr.shape[0]) - 1
    return multilevel_blocks(lambda: iter([(0, indptr, indices)]), n, num_parts, imbalance=imbalance, seed=seed,
                             sweeps=sweeps, vweight=vweight)


def multilevel_blocks(blocks, num_nodes: int, num_parts: int, *, imbalance: float = 1.05, seed: int = 0,
                      sweeps: int = 8, vweight: np.ndarray | None = None, max_coarse_entries: int | None = None,
                      on_sweep=None) -> np.ndarray | None:
    """`multilevel_partition` of the graph that ``blocks()`` streams, reading it only through ``blocks``.

    Level 0 is read row block by row block, in row order (``blocks()`` yields ``(first_row, indptr_block,
    indices_block)``, offsets global, as ``DiskCSR.blocks`` does): the clustering and refinement sweeps over it go
    through the rows in id order and its coarse graph is built from the cut entries sorted, so a CSR in memory
    (one block) and on disk (many) give the same parts. The coarser levels are in memory.

    Args:
        max_coarse_entries: the most entries level 1 may hold (its memory: about 32 bytes per entry while it is
            built); None: no limit. Over it, returns None. Level 1 is level 0 itself where clustering does not
            shrink it by MIN_SHRINK (or level 0 is already small).
        on_sweep: called with a name after each sweep over level 0 (the out-of-core pipeline times them).
    """
    if sweeps < 1:
        raise ConfigError(f"multilevel sweeps must be >= 1, got {sweeps}")
    n, k = int(num_nodes), int(num_parts)
    if k == 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    vw = np.ones(n, dtype=np.int64) if vweight is None else np.ascontiguousarray(vweight, dtype=np.int64)
    total = int(vw.sum())
    cap = max(math.floor(imbalance * total / k + 1e-9), -(-total // k))
    target = max(COARSE_PER_PART * k, COARSE_MIN)
    max_cluster = max(int(vw.max()), -(-total // target))
    parts = None
    for cycle in range(V_CYCLES):
        def tick(name: str, cycle=cycle) -> None:
            if on_sweep is not None:
                on_sweep(name if cycle == 0 else f"cycle {cycle + 1} {name}")

        # level 0 -> 1, streamed
        if n > target:
            label, clusters = _cluster_blocks(blocks, n, vw, max_cluster, parts, tick)
        if n <= target or clusters > MIN_SHRINK * n:  # level 1 is level 0 itself, in memory
            label, clusters = np.arange(n, dtype=np.int64), n
        level1 = _contract_blocks(blocks, label, clusters, vw, max_coarse_entries)
        tick("contract")
        if level1 is None:
            return None
        coarse_parts = None
        if parts is not None:
            coarse_parts = np.empty(clusters, dtype=np.int64)
            coarse_parts[label] = parts  # clusters never straddle two parts
        levels, maps = _coarsen(level1, max_cluster, target, rng, coarse_parts)
        log.debug("multilevel cycle %d: %d levels, vertices %s", cycle, len(levels) + 1,
                  [n] + [lv[0].shape[0] - 1 for lv in levels])
        if coarse_parts is None:
            coarse = _start(*levels[-1], k, cap, sweeps, rng)
        else:
            coarse = coarse_parts
            for m in maps:
                nxt = np.empty(int(m.max()) + 1, dtype=np.int64)
                nxt[m] = coarse
                coarse = nxt
            _refined(*levels[-1], coarse, k, cap, sweeps, rng)
        for level in range(len(levels) - 2, -1, -1):
            coarse = coarse[maps[level]]  # the coarse vertex's part for each of its members
            _refined(*levels[level], coarse, k, cap, sweeps, rng)
        parts = coarse[label]
        del level1, levels, maps, coarse, label
        _refine_blocks(blocks, vw, parts, cap, k, sweeps, tick)
    return parts


def _cluster_blocks(blocks, n: int, vw: np.ndarray, max_cluster: int, parts: np.ndarray | None,
                    tick) -> tuple[np.ndarray, int]:
    """Level 0's clusters in id order, CLUSTER_SWEEPS sweeps over the blocks: int64 (N,) labels 0..C-1, and C."""
    label = np.arange(n, dtype=np.int64)
    cw = vw.copy()
    conn = np.zeros(n, dtype=np.int64)
    for sweep in range(CLUSTER_SWEEPS):
        moved = 0
        for first, ip, ix in blocks():
            moved += _cluster(ip, ix, first, None, vw, max_cluster, None, label, cw, conn, _touched(ip), parts)
        tick(f"cluster sweep {sweep + 1}")
        if moved == 0:
            break
    del conn, cw
    used, label = np.unique(label, return_inverse=True)
    return label.astype(np.int64), int(used.shape[0])


def _touched(ip: np.ndarray) -> np.ndarray:
    return np.empty(max(int(np.diff(ip).max()) if ip.shape[0] > 1 else 0, 1), dtype=np.int64)


def _contract_blocks(blocks, label: np.ndarray, clusters: int, vw: np.ndarray, max_entries: int | None):
    """Level 1 from level 0's blocks: its entries are level 0's cut entries as (cluster, cluster) keys, sorted and
    counted (the count is the edge weight). None when there are more than ``max_entries``."""
    count = 0
    for first, ip, ix in blocks():
        count += _cut_pairs(ip, ix, first, label, None)
    if max_entries is not None and count > max_entries:
        log.info("multilevel: level 1 would hold %d entries, over the %d the budget allows", count, max_entries)
        return None
    keys = np.empty(count, dtype=np.int64)
    at = 0
    for first, ip, ix in blocks():
        at += _cut_pairs(ip, ix, first, label, keys[at:])
    keys.sort()
    keys, weights = np.unique(keys, return_counts=True)
    rows, cols = np.divmod(keys, clusters)
    del keys
    cip = np.zeros(clusters + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=clusters), out=cip[1:])
    return cip, cols, weights.astype(np.int64), np.bincount(label, weights=vw, minlength=clusters).astype(np.int64)


def _refine_blocks(blocks, vw: np.ndarray, parts: np.ndarray, cap: int, k: int, sweeps: int, tick) -> None:
    loads = np.bincount(parts, weights=vw, minlength=k).astype(np.int64)
    conn = np.zeros(k, dtype=np.int64)
    for sweep in range(sweeps):
        moved = 0
        for first, ip, ix in blocks():
            moved += _refine(ip, ix, first, None, vw, parts, loads, cap, k, None, conn)
        tick(f"refine sweep {sweep + 1}")
        if moved == 0:
            break


def _coarsen(graph, max_cluster: int, target: int, rng: np.random.Generator, parts: np.ndarray | None):
    """The levels from ``graph`` on (``levels[i]`` = (indptr, indices, edge weights, vertex weights)) and the maps
    from each level to the next; with ``parts``, clusters stay inside one part."""
    levels, maps = [graph], []
    while levels[-1][0].shape[0] - 1 > target and len(levels) < MAX_LEVELS:
        ip, ix, ew, w = levels[-1]
        m = ip.shape[0] - 1
        label, clusters = _cluster_level(ip, ix, ew, w, max_cluster, rng.permutation(m), parts)
        if clusters > MIN_SHRINK * m:
            break
        cip, cix, cew = _contract(ip, ix, ew, label, clusters)
        levels.append((cip, cix, cew, np.bincount(label, weights=w, minlength=clusters).astype(np.int64)))
        maps.append(label)
        if parts is not None:
            coarse = np.empty(clusters, dtype=np.int64)
            coarse[label] = parts
            parts = coarse
    return levels, maps


def _start(ip, ix, ew, w, k: int, cap: int, sweeps: int, rng: np.random.Generator) -> np.ndarray:
    """The coarsest graph's assignment: the best of START_TRIES refined BFS bisections, each of the graph with
    its vertices renumbered at random (the bisection starts its BFS from vertex 0)."""
    best, best_cut = None, None
    n = ip.shape[0] - 1
    rows = np.repeat(np.arange(n), np.diff(ip))  # (nnz,) row of every entry; the coarsest graph is small
    for _ in range(START_TRIES):
        perm = rng.permutation(n)  # new id -> old id
        inv = np.empty(n, dtype=np.int64)
        inv[perm] = np.arange(n)
        pip = np.concatenate([[0], np.cumsum(np.diff(ip)[perm])])
        pix = inv[np.concatenate([ix[ip[v]:ip[v + 1]] for v in perm])] if n else ix
        new_parts = np.empty(n, dtype=np.int64)
        _bisect(pip, pix, k, new_parts, w[perm].astype(np.float64))
        parts = np.empty(n, dtype=np.int64)
        parts[perm] = new_parts
        _refined(ip, ix, ew, w, parts, k, cap, sweeps, rng)
        cut = int(ew[parts[rows] != parts[ix]].sum())
        if best is None or cut < best_cut:
            best, best_cut = parts, cut
    return best


def _refined(ip, ix, ew, w, parts, k: int, cap: int, sweeps: int, rng: np.random.Generator) -> None:
    loads = np.bincount(parts, weights=w, minlength=k).astype(np.int64)
    order, conn = rng.permutation(ip.shape[0] - 1), np.zeros(k, np.int64)
    for _ in range(sweeps):
        if _refine(ip, ix, 0, ew, w, parts, loads, cap, k, order, conn) == 0:
            break


def _cluster_level(indptr, indices, ew, vw, max_cluster: int, order: np.ndarray,
                   parts: np.ndarray | None) -> tuple[np.ndarray, int]:
    """int64 (N,) cluster of each vertex in 0..C-1, and C; with ``parts``, a cluster inside one part."""
    n = indptr.shape[0] - 1
    label = np.arange(n, dtype=np.int64)
    cw, conn, touched = vw.copy(), np.zeros(n, dtype=np.int64), _touched(indptr)
    for _ in range(CLUSTER_SWEEPS):
        if _cluster(indptr, indices, 0, ew, vw, max_cluster, order, label, cw, conn, touched, parts) == 0:
            break
    used, label = np.unique(label, return_inverse=True)
    return label.astype(np.int64), int(used.shape[0])


@numba.njit(cache=True)
def _cluster(indptr, indices, first, ew, vw, max_cluster, order, label, cw, conn, touched,  # pragma: no cover
             parts):
    # One sweep of size-constrained label propagation over rows first .. first + len(indptr) - 2 (global
    # offsets in indptr): v joins the neighbouring cluster it has the most edge weight to (ties: the lighter
    # cluster), if that cluster stays <= max_cluster. ew None: unit weights; order None: the rows in id order
    # (else the vertices of order, first = 0). conn is zero between vertices. Returns the moves.
    base = indptr[0]
    rows = indptr.shape[0] - 1
    moved = 0
    for i in range(rows):
        v = first + i if order is None else order[i]
        r = v - first
        own = label[v]
        nt = 0
        for e in range(indptr[r] - base, indptr[r + 1] - base):
            u = indices[e]
            if u == v or (parts is not None and parts[u] != parts[v]):
                continue
            c = label[u]
            if conn[c] == 0:
                touched[nt] = c
                nt += 1
            conn[c] += 1 if ew is None else ew[e]
        best = own
        best_w = conn[own]
        for t in range(nt):
            c = touched[t]
            wc = conn[c]
            if c != own and cw[c] + vw[v] <= max_cluster and (
                    wc > best_w or (wc == best_w and best != own and cw[c] < cw[best])):
                best = c
                best_w = wc
        for t in range(nt):
            conn[touched[t]] = 0
        if best != own:
            cw[own] -= vw[v]
            cw[best] += vw[v]
            label[v] = best
            moved += 1
    return moved


@numba.njit(cache=True)
def _cut_pairs(indptr, indices, first, label, keys):  # pragma: no cover - compiled
    # The entries of rows first.. whose ends lie in different clusters: counted (keys None) or written as
    # label[v] * C + label[u] keys. C = number of clusters = label.max() + 1.
    base = indptr[0]
    c = label.max() + 1
    count = 0
    for r in range(indptr.shape[0] - 1):
        a = label[first + r]
        for e in range(indptr[r] - base, indptr[r + 1] - base):
            b = label[indices[e]]
            if a != b:
                if keys is not None:
                    keys[count] = a * c + b
                count += 1
    return count


@numba.njit(cache=True)
def _contract(indptr, indices, ew, label, clusters):  # pragma: no cover - compiled
    # The quotient graph: one vertex per cluster, one entry per pair of adjacent clusters (weights summed).
    n = indptr.shape[0] - 1
    start = np.zeros(clusters + 1, dtype=np.int64)
    for v in range(n):
        start[label[v] + 1] += 1
    for c in range(clusters):
        start[c + 1] += start[c]
    members = np.empty(n, dtype=np.int64)
    pos = start[:-1].copy()
    for v in range(n):
        members[pos[label[v]]] = v
        pos[label[v]] += 1
    mark = np.full(clusters, -1, dtype=np.int64)
    cindptr = np.zeros(clusters + 1, dtype=np.int64)
    for c in range(clusters):
        count = 0
        for j in range(start[c], start[c + 1]):
            v = members[j]
            for e in range(indptr[v], indptr[v + 1]):
                d = label[indices[e]]
                if d != c and mark[d] != c:
                    mark[d] = c
                    count += 1
        cindptr[c + 1] = cindptr[c] + count
    cindices = np.empty(cindptr[clusters], dtype=np.int64)
    cweights = np.zeros(cindptr[clusters], dtype=np.int64)
    slot = np.empty(clusters, dtype=np.int64)
    mark[:] = -1
    for c in range(clusters):
        p = cindptr[c]
        for j in range(start[c], start[c + 1]):
            v = members[j]
            for e in range(indptr[v], indptr[v + 1]):
                d = label[indices[e]]
                if d == c:
                    continue
                if mark[d] != c:
                    mark[d] = c
                    slot[d] = p
                    cindices[p] = d
                    p += 1
                cweights[slot[d]] += ew[e]
    return cindptr, cindices, cweights


@numba.njit(cache=True)
def _refine(indptr, indices, first, ew, vw, parts, loads, cap, k, order, conn):  # pragma: no cover - compiled
    # One sweep (rows and order as in _cluster): move v to the part q it has the most edge weight to when the cut
    # drops (gain > 0), or stays and the two loads even out, and q stays <= cap; a v whose part is over the cap
    # goes to the best part with room. Returns the moves.
    base = indptr[0]
    rows = indptr.shape[0] - 1
    moved = 0
    for i in range(rows):
        v = first + i if order is None else order[i]
        r = v - first
        p = parts[v]
        over = loads[p] > cap
        interior = True
        for e in range(indptr[r] - base, indptr[r + 1] - base):
            if parts[indices[e]] != p:
                interior = False
                break
        if interior and not over:
            continue
        for q in range(k):
            conn[q] = 0
        for e in range(indptr[r] - base, indptr[r + 1] - base):
            u = indices[e]
            if u != v:
                conn[parts[u]] += 1 if ew is None else ew[e]
        best = p
        best_gain = 0
        for q in range(k):
            if q == p or loads[q] + vw[v] > cap:
                continue
            gain = conn[q] - conn[p]
            if best == p:
                if gain > 0 or over or (gain == 0 and loads[q] + vw[v] < loads[p]):
                    best = q
                    best_gain = gain
            elif gain > best_gain or (gain == best_gain and loads[q] < loads[best]):
                best = q
                best_gain = gain
        if best != p:
            loads[p] -= vw[v]
            loads[best] += vw[v]
            parts[v] = best
            moved += 1
    return moved
