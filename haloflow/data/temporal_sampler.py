"""Samplers for event streams: the temporal CSR with its most-recent-k neighbour sampler, and keyed negatives.

Temporal CSR (TGL's T-CSR): row v lists every event that touches v, from v's side, oldest first. Each event
``(src, dst, t)`` appears twice, once in the row of src (neighbour dst) and once in the row of dst (neighbour
src); a self-loop appears twice in one row::

    events   0: (0, 1, t=5)   1: (1, 2, t=7)   2: (0, 2, t=7)   3: (2, 1, t=9)

    indptr   [0,      2,            5,            8]
    row      |-- 0 --|----- 1 -----|----- 2 -----|
    nbr       1  2    0  2  2       1  0  1          the other endpoint
    eid       0  2    0  1  3       1  2  3          global event id (position in the stream)
    t         5  7    5  7  9       7  7  9          non-decreasing inside a row (stream order on ties)

Query ``(v, t_q, k)``: binary search in row v for the first entry with ``t >= t_q``; the k entries before it,
newest first, are the answer, so an event at exactly ``t_q`` (the batch's own events) is never returned::

    sample_recent(nodes=[1], times=[9], k=2)  ->  nbr [[2, 0]]  eid [[1, 0]]  t [[7, 5]]  mask [[True, True]]
    sample_recent(nodes=[1], times=[5], k=2)  ->  nbr [[-1, -1]] eid [[-1, -1]] t [[0, 0]] mask [[False, False]]

Negatives are drawn by a counter-based hash of ``(seed, stream, event id)``, so the negative of an event is the
same whatever batch, process or order it is drawn in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from haloflow.data.temporal import TemporalEvents
from haloflow.errors import ConfigError
from haloflow.utils.splitmix import GOLDEN as _GOLDEN, mix as _mix, py_mix

__all__ = ["TemporalCSR", "RecentNeighbors", "NegativeSampler"]


# --------------------------------------------------------------------------------------------- kernels
@njit(cache=True)
def _fill_rows(owner, other, eid, t, indptr, out_nbr, out_eid, out_t):  # pragma: no cover - compiled
    # Stable counting sort by owner: one serial pass over the 2E entries; stream order survives inside a row.
    cursor = indptr[:-1].copy()
    for j in range(owner.shape[0]):
        p = cursor[owner[j]]
        out_nbr[p] = other[j]
        out_eid[p] = eid[j]
        out_t[p] = t[j]
        cursor[owner[j]] = p + 1


@njit(parallel=True, cache=True)
def _recent_kernel(indptr, nbr, eid, ts, nodes, times, k, out_nbr, out_eid, out_t, out_mask):  # pragma: no cover
    # One binary search per query (O(log deg)) and k copies; outputs arrive pre-filled with the padding.
    for q in prange(nodes.shape[0]):
        v = nodes[q]
        lo, a, b = indptr[v], indptr[v], indptr[v + 1]
        tq = times[q]
        while a < b:  # first position with ts >= tq
            m = (a + b) // 2
            if ts[m] < tq:
                a = m + 1
            else:
                b = m
        for j in range(min(k, a - lo)):
            p = a - 1 - j
            out_nbr[q, j] = nbr[p]
            out_eid[q, j] = eid[p]
            out_t[q, j] = ts[p]
            out_mask[q, j] = True


@njit(inline="always", cache=True)
def _below(bits, n):  # pragma: no cover - compiled
    # A uniform integer in [0, n) from the high 32 bits (n < 2^32; bias below n / 2^32).
    return np.int64(((bits >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))


@njit(parallel=True, cache=True)
def _one_negative(event_ids, base, num_candidates, out):  # pragma: no cover - compiled
    for i in prange(event_ids.shape[0]):
        out[i] = _below(_mix(base ^ np.uint64(event_ids[i])), num_candidates)


@njit(parallel=True, cache=True)
def _fixed_negatives(event_ids, skip, base, pool, out):  # pragma: no cover - compiled
    # Floyd's algorithm: `num` distinct indices of range(pool) per event, then indices >= skip[i] move up by one
    # so that candidate skip[i] (the true destination; -1 for none) is never drawn.
    num = out.shape[1]
    bitmap = num * num > pool  # a scratch bitmap beats the O(num^2) scan when num is large against the pool
    for i in prange(event_ids.shape[0]):
        key = _mix(base ^ np.uint64(event_ids[i]))
        taken = np.zeros(pool if bitmap else 0, dtype=np.bool_)
        filled = 0
        for j in range(pool - num, pool):
            r = _below(_mix(key + _GOLDEN * np.uint64(j + 1)), j + 1)
            if bitmap:
                dup = taken[r]
            else:
                dup = False
                for c in range(filled):
                    if out[i, c] == r:
                        dup = True
                        break
            if dup:
                r = j
            if bitmap:
                taken[r] = True
            out[i, filled] = r
            filled += 1
        if skip[i] >= 0:
            for c in range(num):
                if out[i, c] >= skip[i]:
                    out[i, c] += 1


# --------------------------------------------------------------------------------------------- neighbours
@dataclass(frozen=True, eq=False)
class RecentNeighbors:
    """The answer of `TemporalCSR.sample_recent`: k slots per query, newest first, padding at the end.

    Shapes:
        ids, eids int64 (n, k) (-1 on padding);  times float64 (n, k) (0 on padding);  mask bool (n, k).
    """

    ids: np.ndarray
    eids: np.ndarray
    times: np.ndarray
    mask: np.ndarray


@dataclass(frozen=True, eq=False)
class TemporalCSR:
    """Per node, the events that touch it, oldest first (layout in the module docstring).

    Shapes:
        indptr int64 (N+1,);  nbr, eid int64 (2E',);  t float64 (2E',)  with E' the events kept.
    """

    indptr: np.ndarray
    nbr: np.ndarray
    eid: np.ndarray
    t: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @classmethod
    def from_events(cls, events: TemporalEvents, keep: np.ndarray | None = None) -> TemporalCSR:
        """Build from a stream, optionally only from the events where ``keep`` (bool (E,)) is True.

        Event ids stay global (positions in ``events``), so a CSR of the kept training events of an inductive
        split answers with the same ids as one of the whole stream. Times are stored as float64 (exact for
        integers below 2^53, e.g. Unix times in microseconds).

        Cost: O(E + N): a bincount, a cumsum and one counting-sort pass (numba), no comparison sort, because the
        stream is already in time order.
        """
        if keep is None:
            ids = np.arange(events.num_events, dtype=np.int64)
        else:
            keep = np.asarray(keep)
            if keep.dtype != np.bool_ or keep.shape != (events.num_events,):
                raise ConfigError(f"keep must be a bool mask of shape ({events.num_events},), "
                                  f"got {keep.dtype} {keep.shape}")
            ids = np.flatnonzero(keep)
        m = ids.shape[0]
        owner = np.empty(2 * m, dtype=np.int64)  # (2E',) interleaved: event j from src's side, then dst's
        other = np.empty(2 * m, dtype=np.int64)
        owner[0::2], owner[1::2] = events.src[ids], events.dst[ids]
        other[0::2], other[1::2] = events.dst[ids], events.src[ids]
        eid = np.repeat(ids, 2)  # (2E',)
        t = np.repeat(events.t[ids].astype(np.float64), 2)  # (2E',)
        indptr = np.zeros(events.num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(owner, minlength=events.num_nodes), out=indptr[1:])
        nbr_out, eid_out, t_out = np.empty_like(other), np.empty_like(eid), np.empty_like(t)
        _fill_rows(owner, other, eid, t, indptr, nbr_out, eid_out, t_out)
        return cls(indptr, nbr_out, eid_out, t_out)

    def degree(self, nodes: np.ndarray | None = None) -> np.ndarray:
        """int64: the number of event entries in each row (all rows when ``nodes`` is None)."""
        deg = np.diff(self.indptr)
        return deg if nodes is None else deg[np.asarray(nodes, dtype=np.int64)]

    def sample_recent(self, nodes: np.ndarray, times: np.ndarray, k: int) -> RecentNeighbors:
        """The ``k`` most recent neighbours of each ``nodes[q]`` strictly before ``times[q]``, newest first.

        Ties in time are broken by stream order (the later event counts as more recent).

        Shapes:
            nodes int (n,), times (n,), k >= 0  ->  RecentNeighbors of (n, k) arrays.

        Cost: O(n (log deg + k)), parallel over the queries (numba prange).
        """
        nodes = np.ascontiguousarray(nodes, dtype=np.int64)
        times = np.ascontiguousarray(times, dtype=np.float64)
        if nodes.ndim != 1 or times.shape != nodes.shape:
            raise ConfigError(f"sample_recent needs nodes (n,) and times (n,), got {nodes.shape} and {times.shape}")
        if k < 0:
            raise ConfigError(f"sample_recent: k must be >= 0, got {k}")
        if nodes.size and (int(nodes.min()) < 0 or int(nodes.max()) >= self.num_nodes):
            bad = int(nodes.min()) if int(nodes.min()) < 0 else int(nodes.max())
            raise ConfigError(f"sample_recent: node {bad} is outside [0, {self.num_nodes})")
        n = nodes.shape[0]
        out = RecentNeighbors(
            ids=np.full((n, k), -1, dtype=np.int64),
            eids=np.full((n, k), -1, dtype=np.int64),
            times=np.zeros((n, k), dtype=np.float64),
            mask=np.zeros((n, k), dtype=bool),
        )
        if n and k:
            _recent_kernel(self.indptr, self.nbr, self.eid, self.t, nodes, times, k,
                           out.ids, out.eids, out.times, out.mask)
        return out


# --------------------------------------------------------------------------------------------- negatives
def _base_key(seed: int, stream: int) -> np.uint64:
    m = 0xFFFFFFFFFFFFFFFF
    return np.uint64(py_mix((py_mix((seed + int(_GOLDEN)) & m) + int(_GOLDEN) * (stream + 1)) & m))


@dataclass(frozen=True, kw_only=True)
class NegativeSampler:
    """Negative destinations for link prediction, a pure function of ``(seed, stream, global event id)``.

    Any split of a batch across processes, and any batch size, draws the same negative for an event. Use one
    ``stream`` per training epoch (fresh negatives each epoch, as TGN draws them) and a fixed sampler (its own
    seed) for evaluation.

    Args:
        candidates: int64 (C,) node ids to draw from, ascending and distinct (TGN: the destinations seen).
        seed: key of the draws (>= 0).
    """

    candidates: np.ndarray
    seed: int = 0

    def __post_init__(self) -> None:
        c = np.ascontiguousarray(self.candidates, dtype=np.int64)
        if c.ndim != 1 or c.size == 0:
            raise ConfigError(f"NegativeSampler.candidates must be a non-empty 1-D array, got shape {c.shape}")
        if c.size >= 2**32:
            raise ConfigError(f"NegativeSampler: at most 2^32 - 1 candidates, got {c.size:,}")
        if (c[1:] <= c[:-1]).any():
            raise ConfigError("NegativeSampler.candidates must be ascending and distinct")
        if self.seed < 0:
            raise ConfigError(f"NegativeSampler.seed must be >= 0, got {self.seed}")
        object.__setattr__(self, "candidates", c)

    @classmethod
    def from_destinations(cls, events: TemporalEvents, event_ids: np.ndarray | None = None, *, seed: int = 0
                          ) -> NegativeSampler:
        """Candidates = the distinct destinations of ``event_ids`` (all events by default)."""
        dst = events.dst if event_ids is None else events.dst[np.asarray(event_ids, dtype=np.int64)]
        present = np.zeros(events.num_nodes, dtype=bool)
        present[dst] = True
        return cls(candidates=np.flatnonzero(present).astype(np.int64), seed=seed)

    def sample(self, event_ids: np.ndarray, stream: int = 0) -> np.ndarray:
        """int64 (n,): one negative destination per event (may equal the true one, as in TGN)."""
        eids = _event_ids(event_ids, stream)
        idx = np.empty(eids.shape[0], dtype=np.int64)
        _one_negative(eids, _base_key(self.seed, stream), np.int64(self.candidates.size), idx)
        return self.candidates[idx]

    def sample_fixed(self, event_ids: np.ndarray, true_dst: np.ndarray, num: int, stream: int = 0) -> np.ndarray:
        """int64 (n, num): ``num`` distinct negatives per event, never the event's true destination.

        The set of an event depends only on ``(seed, stream, event id, true destination)``: a fixed evaluation
        set as TGB's, drawn on the fly (Floyd's algorithm, O(num) per event for small num).
        """
        eids = _event_ids(event_ids, stream)
        true_dst = np.ascontiguousarray(true_dst, dtype=np.int64)
        if true_dst.shape != eids.shape:
            raise ConfigError(f"sample_fixed: true_dst must have shape {eids.shape}, got {true_dst.shape}")
        c = self.candidates
        pos = np.minimum(np.searchsorted(c, true_dst), c.size - 1)
        skip = np.where(c[pos] == true_dst, pos, -1)  # (n,) candidate index to leave out
        if not 0 <= num <= c.size - 1:
            raise ConfigError(f"sample_fixed: num must be in [0, {c.size - 1}] (candidates minus the true "
                              f"destination), got {num}")
        idx = np.empty((eids.shape[0], num), dtype=np.int64)
        # Events whose destination is not a candidate draw from all C candidates, the others from C - 1.
        for has, size in ((skip >= 0, c.size - 1), (skip < 0, c.size)):
            sel = np.flatnonzero(has)
            if sel.size:
                part = np.empty((sel.size, num), dtype=np.int64)
                _fixed_negatives(eids[sel], skip[sel], _base_key(self.seed, stream), size, part)
                idx[sel] = part
        return c[idx]


def _event_ids(event_ids: np.ndarray, stream: int) -> np.ndarray:
    eids = np.ascontiguousarray(event_ids, dtype=np.int64)
    if eids.ndim != 1:
        raise ConfigError(f"event_ids must be 1-D, got shape {eids.shape}")
    if eids.size and int(eids.min()) < 0:
        raise ConfigError(f"event ids must be >= 0, got {int(eids.min())}")
    if stream < 0:
        raise ConfigError(f"stream must be >= 0, got {stream}")
    return eids
