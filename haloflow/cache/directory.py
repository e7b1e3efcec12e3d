"""``SlotDirectory``: which row sits in which cache slot, and the per-batch decision of what moves.

::

    slot_id (S,)   slot -> row id, -1 = free           id_slot (N,)   row id -> slot, -1 = not cached
      slot:  0   1   2   3                              row:  0  1  2  3  4  5  6
      row:   5  -1   2   6                              slot: -1 -1  2 -1 -1  0  3

One batch with distinct ids U (ascending)::

    hits    = U with id_slot >= 0                      pinned: they stay where they are
    misses  = U \\ hits, ranked by the policy's score (hottest first)
    slots   = free slots, then victims: cached rows that are neither hits nor pinned, coldest first
              (ties: the smaller id leaves first)
    admit   = the hottest misses, one per slot (all of them if the policy admits all, else only those hotter
              than the victim they would replace)
    overflow= misses not admitted: served from (and updated in) the backing store, never an error

The directory only decides; the store moves the rows (victims written back when dirty, admitted rows read). The
same code drives the miss-ratio simulator, so a simulated hit rate is the hit rate the store will see.

Cost per batch: O(u log u) to rank the misses; when a miss needs a victim, one O(S) pass over the slots to find
the evictable ones plus an O(S) partial sort (``np.partition``) of their scores. A policy whose scores are a
per-row table (``score_table``: LRU, LFU, frequency) is planned by one compiled call instead (kernels.py:
the same decisions, O(u log u + S log k)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from haloflow.cache.kernels import plan_batch, serve_batch
from haloflow.cache.types import CachePolicy, CacheStats

__all__ = ["SlotDirectory", "BatchPlan"]

_EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class BatchPlan:
    """What one batch moves. Arrays are int64.

    Attributes:
        ids: (u,) the batch's distinct ids, ascending.
        slots: (u,) slot of each id once the plan is carried out; -1 = served from the backing store.
        load_ids, load_slots: (a,) admitted misses and the slots they go to (read from the backing store).
        evict_ids, evict_slots: (e,) rows that leave the cache and the slots they leave (e <= a): written back
            when dirty before the slot is reused.
    """

    ids: np.ndarray
    slots: np.ndarray
    load_ids: np.ndarray
    load_slots: np.ndarray
    evict_ids: np.ndarray
    evict_slots: np.ndarray

    @property
    def overflow_ids(self) -> np.ndarray:
        return self.ids[self.slots < 0]


def _order(scores: np.ndarray, ids: np.ndarray, k: int, *, lowest: bool) -> np.ndarray:
    """Positions of the k lowest (or highest) scores, in that order; ties: smaller id first. O(n + k log k)."""
    key = scores if lowest else -scores
    n = key.size
    if k <= 0:
        return _EMPTY
    if k < n:
        kth = np.partition(key, k - 1)[k - 1]
        below = np.flatnonzero(key < kth)
        tie = np.flatnonzero(key == kth)
        need = k - below.size
        if need < tie.size:
            tie = tie[np.argpartition(ids[tie], need - 1)[:need]]
        pos = np.concatenate([below, tie])
    else:
        pos = np.arange(n)
    return pos[np.lexsort((ids[pos], key[pos]))]


class SlotDirectory:
    """The row <-> slot maps of one cache and the policy that fills them.

    Args:
        num_rows: N, rows of the table.
        num_slots: S, slots of the cache (1 <= S <= N; the store checks and names the table).
        policy: the eviction/admission policy; reset here.
    """

    def __init__(self, num_rows: int, num_slots: int, policy: CachePolicy):
        self.num_rows, self.num_slots, self.policy = num_rows, num_slots, policy
        self.stats = CacheStats()
        self.reset()

    def reset(self) -> None:
        """Empty every slot and forget the policy's history (counters are kept)."""
        self.slot_id = np.full(self.num_slots, -1, dtype=np.int64)  # (S,)
        self.id_slot = np.full(self.num_rows, -1, dtype=np.int64)  # (N,)
        self._next_free = 0  # slots _next_free.. are free: taken in order, never given back (a victim's slot goes
        # straight to a load)
        self.clock = 0
        self.policy.reset(self.num_rows)
        self._slot_score: np.ndarray | None = None  # (S,) each slot's row's score, for the compiled plan

    def warm(self) -> tuple[np.ndarray, np.ndarray]:
        """Fill free slots with the policy's warm-start rows; returns (ids, slots) to read from the backing store."""
        ids = np.asarray(self.policy.warm_start(self.num_slots), dtype=np.int64)
        ids = ids[self.id_slot[ids] < 0][: self.num_slots - self._next_free]
        slots = np.arange(self._next_free, self._next_free + ids.size, dtype=np.int64)
        self._next_free += ids.size
        self.slot_id[slots], self.id_slot[ids] = ids, slots
        self._slot_score = None  # rebuilt at the next compiled plan
        return ids, slots

    @property
    def nbytes(self) -> int:
        """Host bytes of the maps and the policy: 8 (N + 2 S) + the policy's (8 N for every policy here), i.e.
        16 bytes per row and per slot (row -> slot and the policy's score; slot -> row and the score of the
        slot's row, kept for the compiled plan; the free slots are a counter); a ``cached`` plan counts them in
        the table's host memory."""
        return self.id_slot.nbytes + self.slot_id.nbytes + 8 * self.num_slots + self.policy.nbytes

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Slots of ``ids`` (-1 where not cached)."""
        return self.id_slot[ids]

    def plan(self, ids: np.ndarray, *, pinned: np.ndarray = _EMPTY, deferred: np.ndarray = _EMPTY,
             record: bool = True, final: bool = True) -> BatchPlan:
        """Decide the moves of a batch and update the maps (the caller must then carry the plan out).

        Args:
            ids: (u,) distinct row ids, ascending.
            pinned: slots that must not be evicted (the rows of a batch still being computed).
            deferred: misses that must not be loaded now (a row the current batch updates in the backing store);
                they are served from the backing store like overflow.
            record: first sight of this batch: tell the policy and count lookups, hits and misses.
            final: the plan that serves the batch: count its overflow.
        """
        table = self.policy.score_table()
        if table is not None:
            return self._plan_compiled(ids, table, pinned, deferred, record, final)
        slot = self.id_slot[ids]  # (u,)
        hit = slot >= 0
        if record:
            self.policy.record(ids, self.clock)
            self.clock += 1
            nh = int(hit.sum())
            self.stats.lookups += ids.size
            self.stats.hits += nh
            self.stats.misses += ids.size - nh
        miss = ids[~hit]
        if deferred.size:
            miss = miss[~np.isin(miss, deferred, assume_unique=True)]
        cand = miss[_order(self.policy.scores(miss), miss, miss.size, lowest=False)]  # hottest first
        n_free = min(self.num_slots - self._next_free, cand.size)
        load_ids = cand[:n_free]
        load_slots = np.arange(self._next_free, self._next_free + n_free, dtype=np.int64)
        self._next_free += n_free
        evict_ids = evict_slots = _EMPTY
        rest = cand[n_free:]
        if rest.size:
            evictable = self.slot_id >= 0  # (S,) one pass over the slots
            evictable[pinned] = False
            evictable[slot[hit]] = False
            ev_slots = np.flatnonzero(evictable)
            ev_ids = self.slot_id[ev_slots]
            k = min(rest.size, ev_slots.size)
            pick = _order(self.policy.scores(ev_ids), ev_ids, k, lowest=True)  # coldest first
            evict_ids, evict_slots = ev_ids[pick], ev_slots[pick]
            if not self.policy.admit_all:  # pair the hottest miss with the coldest victim, and so on
                k = int(np.sum(self.policy.scores(rest[:k]) > self.policy.scores(evict_ids)))
                evict_ids, evict_slots = evict_ids[:k], evict_slots[:k]
            load_ids = np.concatenate([load_ids, rest[:k]])
            load_slots = np.concatenate([load_slots, evict_slots])
            self.id_slot[evict_ids] = -1
        self.slot_id[load_slots] = load_ids
        self.id_slot[load_ids] = load_slots
        slots = self.id_slot[ids]
        self.stats.admitted += load_ids.size
        self.stats.evicted += evict_ids.size
        if final:
            self.stats.overflow += int(np.sum(slots < 0))
        return BatchPlan(ids, slots, load_ids, load_slots, evict_ids, evict_slots)

    def serve(self, ids: np.ndarray, dirty: np.ndarray, slot_arrays: tuple, table_arrays: tuple,
              out: np.ndarray) -> tuple[BatchPlan, int] | None:
        """``plan(ids)`` (first sight, final, nothing pinned or deferred) and its moves and the batch's weight rows,
        in one compiled call (``kernels.serve_batch``) for a store whose slots and rows are host arrays: victims
        written back from ``slot_arrays`` to ``table_arrays`` when ``dirty``, loads copied in, ``out`` (u, D) filled.
        Returns (the plan, victims written back), or None when the policy's scores are not a per-row table (then
        ``plan`` and move)."""
        table = self.policy.score_table()
        if table is None:
            return None
        self.policy.record(ids, self.clock)
        self.clock += 1
        if self._slot_score is None:
            self._slot_score = np.where(self.slot_id >= 0, table[np.maximum(self.slot_id, 0)], 0)
        slots, load_ids, load_slots, evict_ids, evict_slots, taken, nh, n_over, written = serve_batch(
            ids, self.id_slot, self.slot_id, self._slot_score, self._next_free, table, self.policy.admit_all, dirty,
            slot_arrays, table_arrays, out)
        self._next_free += taken
        st = self.stats
        st.lookups += ids.size
        st.hits += nh
        st.misses += ids.size - nh
        st.admitted += load_ids.size
        st.evicted += evict_ids.size
        st.overflow += n_over
        return BatchPlan(ids, slots, load_ids, load_slots, evict_ids, evict_slots), written

    def _plan_compiled(self, ids, table, pinned, deferred, record, final) -> BatchPlan:
        """``plan`` in one compiled pass (kernels.py), for policies whose scores are a per-row table."""
        if record:
            self.policy.record(ids, self.clock)  # before the scores are read: a batch scores as looked up
            self.clock += 1
        if self._slot_score is None:  # first compiled plan since a reset or warm start: each slot's row's score
            self._slot_score = np.where(self.slot_id >= 0, table[np.maximum(self.slot_id, 0)], 0)
        slots, load_ids, load_slots, evict_ids, evict_slots, taken, nh, n_over = plan_batch(
            ids, self.id_slot, self.slot_id, self._slot_score, self._next_free, table, pinned, deferred,
            self.policy.admit_all)
        self._next_free += taken
        st = self.stats
        if record:
            st.lookups += ids.size
            st.hits += nh
            st.misses += ids.size - nh
        st.admitted += load_ids.size
        st.evicted += evict_ids.size
        if final:
            st.overflow += n_over
        return BatchPlan(ids, slots, load_ids, load_slots, evict_ids, evict_slots)
