"""Balance a partition on several vertex weights at once: nodes, in-edges and training nodes.

A partitioner balances one weight (METIS: the vertex weight it is given; Fennel: the vertex count). After it,
:func:`rebalance` moves vertices out of overweight parts until every balanced weight meets its cap::

    weights (N, W) int64, one column per balanced weight     loads (K, W) = sum of the rows of each part
        nodes  -> 1 per vertex
        edges  -> in-degree (an edge belongs to its destination's part, so a part's edge count is the sum)
        train  -> 1 for a training vertex, else 0

    cap[w] = max(imbalance * mean[w], floor[w])          mean[w] = total[w] / K
        floor[w] = ceil(mean[w])                          for 0/1 weights (nodes, train)
        floor[w] = mean[w] + max_v weights[v, w] * (K-1)/K   otherwise (edges)

The floors are what :func:`dealt_assignment` reaches on any graph (proof in its docstring), so the caps can always
be met for 1 <= K <= N; they only exceed ``imbalance * mean`` when integer rounding or one heavy vertex (a hub
holding more than ``imbalance - 1`` of a part's edges) may leave no other choice. A hub that large does not
always force it, so the refinement first aims at the strict goal ``max(imbalance * mean, ceil(mean), max_v w)``
(:func:`balance_goals`) and falls back to the floored caps only when local moves cannot reach that (Enron, K = 16:
a 1,383-edge hub allows 1.056 x mean; the strict goal reaches 1.05).

Refinement, in rounds (each one pass over the vertices of overweight parts, O(nnz) time, O(N + K) memory)::

    excess = sum_k sum_w max(0, loads[k, w] - cap[w]) / cap[w]        (0 exactly when balanced)

    1. boundary moves: v in an overweight part p, target q = a part v has neighbours in, chosen to cut the fewest
       new edges (gain = edges to q - edges to p), among the moves that lower the excess. A move may push q
       a little over on one weight if it takes more off p on another (a hub out of an edge-heavy part into a
       part full of leaves); the leaves then move the other way. All candidates of a round go best gain first.
    2. any moves: as 1, but q may be any part (the one that lowers the excess most).
    3. if 2 gets stuck, dealt_assignment.
    Phases 1 and 2 first aim at caps halfway between the mean and the cap (slack for later moves), then at the caps.

Every applied move lowers the excess, which takes finitely many values, so each phase terminates.
"""

from __future__ import annotations

import logging
import math

import numba
import numpy as np

from haloflow.errors import ConfigError

__all__ = ["BALANCE_WEIGHTS", "balance_weights", "balance_caps", "balance_goals", "part_loads", "is_balanced",
           "rebalance", "dealt_assignment"]

log = logging.getLogger(__name__)

BALANCE_WEIGHTS = ("nodes", "edges", "train")
_MAX_ROUNDS = 256  # per phase; a round moves every candidate that still fits, so a few rounds are typical


def balance_weights(in_degree: np.ndarray, balance: tuple[str, ...], train_mask: np.ndarray | None = None) -> np.ndarray:
    """The (N, W) int64 weight matrix for the named weights, in the order given.

    Args:
        in_degree: int64 (N,) in-edges of each vertex (``CSRGraph.in_degree()``).
        balance: names from ``BALANCE_WEIGHTS``.
        train_mask: bool (N,), required for ``"train"``.
    """
    n = in_degree.shape[0]
    out = np.empty((n, len(balance)), dtype=np.int64)  # (N, W)
    for j, name in enumerate(balance):
        if name == "nodes":
            out[:, j] = 1
        elif name == "edges":
            out[:, j] = in_degree
        elif name == "train":
            if train_mask is None:
                raise ConfigError('balance "train" needs a train_mask, got None')
            out[:, j] = np.asarray(train_mask, dtype=bool)
        else:
            raise ConfigError(f"unknown balance weight {name!r}: expected one of {', '.join(BALANCE_WEIGHTS)}")
    return out


def balance_caps(weights: np.ndarray, num_parts: int, imbalance: float) -> np.ndarray:
    """int64 (W,) largest allowed load per weight: ``floor(max(imbalance * mean, floor_w))`` (module docstring)."""
    k = num_parts
    caps = np.empty(weights.shape[1], dtype=np.int64)
    for j in range(weights.shape[1]):
        col = weights[:, j]
        total = int(col.sum())
        wmax = int(col.max(initial=0))
        mean = total / k
        floor_w = math.ceil(mean) if wmax <= 1 else mean + wmax * (k - 1) / k
        caps[j] = math.floor(max(imbalance * mean, floor_w) + 1e-9)
    return caps


def balance_goals(weights: np.ndarray, num_parts: int, imbalance: float) -> np.ndarray:
    """int64 (W,) the strict goal per weight: ``floor(max(imbalance * mean, ceil(mean), max_v w))``.

    Never above :func:`balance_caps`: ``max_v w <= mean + max_v w * (K-1)/K`` because ``max_v w <= total``.
    """
    goals = np.empty(weights.shape[1], dtype=np.int64)
    for j in range(weights.shape[1]):
        col = weights[:, j]
        mean = int(col.sum()) / num_parts
        goals[j] = math.floor(max(imbalance * mean, math.ceil(mean), int(col.max(initial=0))) + 1e-9)
    return goals


def part_loads(parts: np.ndarray, weights: np.ndarray, num_parts: int) -> np.ndarray:
    """int64 (K, W): the sum of each weight over each part."""
    loads = np.empty((num_parts, weights.shape[1]), dtype=np.int64)
    for j in range(weights.shape[1]):
        loads[:, j] = np.bincount(parts, weights=weights[:, j], minlength=num_parts)[:num_parts]
    return loads


def is_balanced(parts: np.ndarray, weights: np.ndarray, caps: np.ndarray, num_parts: int) -> bool:
    return bool(np.all(part_loads(parts, weights, num_parts) <= caps[None, :]))


def rebalance(
    indptr: np.ndarray,
    indices: np.ndarray,
    parts: np.ndarray,
    weights: np.ndarray,
    caps: np.ndarray,
    num_parts: int,
    goals: np.ndarray | None = None,
) -> np.ndarray:
    """Move vertices until every part is within ``caps`` on every weight; returns a new int64 (N,) array.

    Args:
        indptr, indices: the adjacency used to price moves (row v = neighbours of v). Pass a symmetric adjacency
            for exact cut changes; an in-neighbour CSR (possibly memory-mapped) prices moves by in-edges only.
        parts: int64 (N,) the starting assignment (left untouched).
        weights: int64 (N, W) from :func:`balance_weights`;  caps: int64 (W,) from :func:`balance_caps`.
        goals: int64 (W,) from :func:`balance_goals`, tried first by local moves; the caps stay the guarantee.

    Always returns an assignment within the caps (falls back to :func:`dealt_assignment` if the moves get stuck).
    """
    parts = np.array(parts, dtype=np.int64, copy=True)
    weights = np.ascontiguousarray(weights, dtype=np.int64)
    caps = np.ascontiguousarray(caps, dtype=np.int64)
    if goals is not None and np.any(goals < caps):
        goals = np.ascontiguousarray(np.minimum(goals, caps), dtype=np.int64)
        met = _local_moves(indptr, indices, parts, weights, goals, num_parts)
        log.debug("rebalance: strict goals %s %s", goals.tolist(), "met" if met else "not met, aiming at the caps")
        if met:
            return parts
    if _local_moves(indptr, indices, parts, weights, caps, num_parts):
        return parts
    log.warning("rebalance: local moves cannot meet the caps %s; using the dealt assignment", caps.tolist())
    return dealt_assignment(weights, num_parts)


def _local_moves(indptr, indices, parts, weights, caps, num_parts) -> bool:
    """Phases 1 and 2 of the module docstring on ``parts`` (in place); True when every load is within ``caps``."""
    if is_balanced(parts, weights, caps, num_parts):
        return True
    # Aim halfway between the mean and the cap first: moves that fill a part exactly to its cap on one weight
    # can leave no room for the move that would fix another weight; the slack avoids most of those dead ends.
    mean = weights.sum(axis=0) / num_parts
    inner = np.maximum(np.floor((mean + caps) / 2), np.ceil(mean)).astype(np.int64)
    for allow_any in (False, True):
        for target in (inner, caps):
            done, moved = _refine(indptr, indices, parts, weights, target, num_parts, allow_any, _MAX_ROUNDS)
            log.debug("rebalance phase %s (caps %s): %d moves", "any" if allow_any else "boundary", target.tolist(), moved)
            if is_balanced(parts, weights, caps, num_parts):
                return True
    return False


def dealt_assignment(weights: np.ndarray, num_parts: int) -> np.ndarray:
    """A balanced assignment that ignores the edges: vertices dealt to the K parts in rounds of K.

    Order: vertices with a nonzero last 0/1 column ("train") first, then the rest (a stable order). Each round
    gives one vertex to every part; the heaviest vertex of the round (by the first non-0/1 column, "edges") goes
    to the part that is lightest on that column so far. So counts differ by at most one per part, a prefix of the
    order (the training vertices) is also spread within one, and the heavy column satisfies, by induction over
    rounds (D = max load - min load; part i lighter than part j gets the larger item)::

        D_new <= max(D_old, heaviest item of the round)  =>  max load <= mean + w_max * (K - 1) / K
    """
    n, w = weights.shape
    binary = [j for j in range(w) if int(weights[:, j].max(initial=0)) <= 1 and int(weights[:, j].min(initial=0)) >= 0]
    heavy = [j for j in range(w) if j not in binary]
    if len(heavy) > 1:  # never the case for nodes/edges/train: only "edges" is non-binary
        raise ConfigError(f"dealt_assignment supports one non-0/1 weight column, got {len(heavy)}")
    key = weights[:, heavy[0]] if heavy else np.zeros(n, dtype=np.int64)
    flags = [j for j in binary if not np.all(weights[:, j] == 1)]
    first = weights[:, flags[0]].astype(bool) if flags else np.zeros(n, dtype=bool)
    order = np.concatenate([np.flatnonzero(first), np.flatnonzero(~first)]).astype(np.int64)
    return _deal(order, np.ascontiguousarray(key, dtype=np.int64), num_parts)


# --------------------------------------------------------------------------------------------- kernels
@numba.njit(cache=True)
def _deal(order, key, k):
    n = order.shape[0]
    parts = np.empty(n, dtype=np.int64)
    load = np.zeros(k, dtype=np.int64)
    for start in range(0, n, k):
        stop = min(start + k, n)
        batch = order[start:stop]
        items = batch[np.argsort(-key[batch], kind="mergesort")]  # heaviest first
        lightest = np.argsort(load, kind="mergesort")  # lightest part first
        for i in range(stop - start):
            v, p = items[i], lightest[i]
            parts[v] = p
            load[p] += key[v]
    return parts


@numba.njit(cache=True)
def _excess_change(loads, p, q, weights, v, caps):
    """Change of the excess sum_k sum_j max(0, loads[k, j] - caps[j]) / caps[j] if v moves from p to q.

    Weights are divided by their caps so that one vertex over on "nodes" and a few in-edges over on "edges"
    compare on one scale; a move is allowed when this is negative.
    """
    delta = 0.0
    for j in range(caps.shape[0]):
        w = weights[v, j]
        if w == 0:
            continue
        c = caps[j]
        before = max(0, loads[p, j] - c) + max(0, loads[q, j] - c)
        after = max(0, loads[p, j] - w - c) + max(0, loads[q, j] + w - c)
        delta += (after - before) / max(c, 1)
    return delta


@numba.njit(cache=True)
def _relieves(loads, p, weights, v, caps):
    """Moving v out of p shrinks a weight on which p is over its cap."""
    for j in range(caps.shape[0]):
        if loads[p, j] > caps[j] and weights[v, j] > 0:
            return True
    return False


@numba.njit(cache=True)
def _best_any(loads, weights, v, caps, p):
    """Part (not p) whose move lowers the excess most, or -1 if none lowers it."""
    best, best_delta = -1, -1e-12
    for q in range(loads.shape[0]):
        if q == p:
            continue
        d = _excess_change(loads, p, q, weights, v, caps)
        if d < best_delta:
            best, best_delta = q, d
    return best


@numba.njit(cache=True)
def _refine(indptr, indices, parts, weights, caps, k, allow_any, max_rounds):
    n, w = weights.shape
    loads = np.zeros((k, w), dtype=np.int64)
    for v in range(n):
        for j in range(w):
            loads[parts[v], j] += weights[v, j]
    conn = np.zeros(k, dtype=np.int64)
    touched = np.empty(k, dtype=np.int64)
    cand_v = np.empty(n, dtype=np.int64)
    cand_q = np.empty(n, dtype=np.int64)
    cand_gain = np.empty(n, dtype=np.int64)
    total_moves = 0
    for _ in range(max_rounds):
        over = np.zeros(k, dtype=np.bool_)
        for p in range(k):
            for j in range(w):
                if loads[p, j] > caps[j]:
                    over[p] = True
        if not over.any():
            return True, total_moves
        # ---- propose: best target for each vertex of an overweight part (one pass over their rows)
        nc = 0
        for v in range(n):
            p = parts[v]
            if not over[p] or not _relieves(loads, p, weights, v, caps):
                continue
            nt = 0
            for e in range(indptr[v], indptr[v + 1]):
                u = indices[e]
                if u == v:
                    continue
                q = parts[u]
                if conn[q] == 0:
                    touched[nt] = q
                    nt += 1
                conn[q] += 1
            cp = conn[p]
            best_q, best_gain = -1, np.int64(0)
            for i in range(nt):
                q = touched[i]
                if q != p and (best_q < 0 or conn[q] - cp > best_gain):
                    if _excess_change(loads, p, q, weights, v, caps) < -1e-12:
                        best_q, best_gain = q, conn[q] - cp
            for i in range(nt):
                conn[touched[i]] = 0
            if best_q < 0 and allow_any:
                best_q, best_gain = _best_any(loads, weights, v, caps, p), -cp
            if best_q >= 0:
                cand_v[nc], cand_q[nc], cand_gain[nc] = v, best_q, best_gain
                nc += 1
        if nc == 0:
            return False, total_moves
        # ---- apply, best gain first; re-check against the loads as they change
        order = np.argsort(-cand_gain[:nc], kind="mergesort")
        moved = 0
        for i in order:
            v, q = cand_v[i], cand_q[i]
            p = parts[v]
            if not _relieves(loads, p, weights, v, caps):
                continue
            if _excess_change(loads, p, q, weights, v, caps) >= -1e-12:
                if not allow_any:
                    continue
                q = _best_any(loads, weights, v, caps, p)
                if q < 0:
                    continue
            for j in range(w):
                loads[p, j] -= weights[v, j]
                loads[q, j] += weights[v, j]
            parts[v] = q
            moved += 1
        total_moves += moved
        if moved == 0:
            return False, total_moves
    for p in range(k):
        for j in range(w):
            if loads[p, j] > caps[j]:
                return False, total_moves
    return True, total_moves
