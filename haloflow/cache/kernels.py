"""Compiled host loops of the cache: a batch's plan, and the row copies between slots and the backing store.

``plan_batch`` is ``SlotDirectory.plan`` in one pass when the policy's scores are a per-row table (LRU, LFU,
frequency). It makes the same decisions as the NumPy code in ``directory.py`` (the tests run both on the same traces),
in one call instead of ~30 NumPy calls of a few microseconds each, which on a CPU were most of a cached DLRM
step's overhead (26 tables, one plan each per batch)::

    ids (u,) ascending --> slot = id_slot[ids]; misses (not deferred) ranked hottest first, ties smaller id
                      --> free slots first; then the k coldest evictable rows, (score, id) ascending, found in
                          one pass over the S slots with a max-heap of k entries (O(S log k), k <= u), reading
                          each slot's score from slot_score (S,), kept beside slot_id
                      --> admit-only: keep the pairs (hottest miss, coldest victim) where the miss scores higher
                      --> maps updated in place; returns what moved

Cost: O(u log u + S log k) per batch, with the O(S) pass only when a miss needs a victim. (A min-heap of the
slots' scores kept across batches, O(u log S) a batch, measured no faster at 10,000 slots and needed ~100 host
bytes per slot.)

``exchange_rows`` carries out a plan's moves on host arrays (slots and backing store both in host memory): the
dirty victims' rows written back, then the admitted rows read into their slots, one row copy each, no
arithmetic (so the rows are bit for bit what the torch copies would give); ~10 small torch ops per table and
batch otherwise. It releases the GIL, so a prefetch thread running it overlaps the training thread. ``read_through`` and
``write_through`` copy a batch's rows out of (and back into) wherever each is, its slot or the backing store,
so a batch with overflow rows is one gather, one optimizer update and one scatter, as for a table in memory.

``serve_batch`` is a whole ``CachedStore.gather`` on host slots in one call: the plan, the dirty victims written
back, the admitted rows loaded (every array) and the batch's weight rows copied out; ``read_rows`` and
``write_rows`` are the update's locate-and-read and write-back of every array, dirty flags included. One call each
instead of a plan, an exchange and a read per array (8 compiled calls and ~40 NumPy/torch calls per table and
step): on a CPU the calls' fixed costs, not the copies, were the cache's overhead over a table in memory (183
against 62 us per table and step at batch 128, 5 % cached, Adagrad). The arrays of a table go in as one tuple,
the weight first, each (rows, w).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from haloflow.cache.belady import _pop, _push

__all__ = ["plan_batch", "serve_batch", "exchange_rows", "read_through", "write_through", "read_rows", "write_rows",
           "ascending"]


@njit(cache=True)
def _coldest(slot_id, slot_score, blocked, k, num_rows):
    """The k evictable slots whose rows have the lowest (score, id), in that order: (ids, slots). One pass over
    the slots in order, keeping the k coldest in a max-heap (``belady._push`` / ``_pop``) keyed by (score, id)
    packed into one int64, ``(score - lo) << bits | id``: one comparison a heap step (4-6x faster than a heap of
    (score, id) pairs at k = 80 for 626 or 10,000 slots, the same at k = 1). Scores are read from ``slot_score``
    (S,) beside ``slot_id``, not looked up per row (random reads into an (N,) table took 70 us a pass for 10,000
    slots, these 45). Keys that do not fit 62 bits (no policy here: scores are batch counts or clocks) are sorted
    instead, O(S log S)."""
    bits = 1
    while (np.int64(1) << bits) < num_rows:
        bits += 1
    lo = slot_score.min() if slot_score.size else 0
    if slot_score.size and (bits >= 62 or slot_score.max() - lo >= (np.int64(1) << (62 - bits))):
        return _coldest_sorted(slot_id, slot_score, blocked, k)
    hk = np.empty(k + 1, dtype=np.int64)  # one spare entry: a replacement goes there, then is popped to the root
    hslot = np.empty(k + 1, dtype=np.int64)
    size = 0
    for s in range(slot_id.size):
        r = slot_id[s]
        if r < 0 or blocked[s]:
            continue
        key = ((slot_score[s] - lo) << bits) | r
        if size < k:
            size = _push(hk, hslot, size, key, s)
        elif key < hk[0]:  # colder than the warmest kept: it replaces the root, sifted down in one pass
            hk[size], hslot[size] = key, s
            size = _pop(hk, hslot, size + 1)
    ids = np.empty(size, dtype=np.int64)
    slots = np.empty(size, dtype=np.int64)
    mask = (np.int64(1) << bits) - 1
    for j in range(size - 1, -1, -1):  # pop the warmest to the back
        ids[j], slots[j] = hk[0] & mask, hslot[0]
        size = _pop(hk, hslot, size)
    return ids, slots


@njit(cache=True)
def _coldest_sorted(slot_id, slot_score, blocked, k):
    """``_coldest`` by sorting every evictable slot: by id, then stably by score."""
    ok = np.flatnonzero((slot_id >= 0) & ~blocked)
    ok = ok[np.argsort(slot_id[ok])]
    ok = ok[np.argsort(slot_score[ok], kind="mergesort")][:k]
    return slot_id[ok], ok


@njit(cache=True)
def plan_batch(ids, id_slot, slot_id, slot_score, next_free, scores, pinned, deferred, admit_all):
    """Plan one batch in place on ``id_slot`` (N,), ``slot_id`` (S,) and ``slot_score`` (S,) (the score of each
    slot's row, kept up to date here: the batch's rows are the only ones whose scores ``record`` changed);
    slots ``next_free``.. are free, taken in order. Returns (slots (u,),
    load_ids, load_slots, evict_ids, evict_slots, free slots taken, hits before the plan, ids left in the
    backing store)."""
    u = ids.size
    miss = np.empty(u, dtype=np.int64)
    m = 0
    hits = 0
    for j in range(u):
        x = ids[j]
        s = id_slot[x]
        if s >= 0:
            hits += 1
            slot_score[s] = scores[x]
            continue
        if deferred.size:
            p = np.searchsorted(deferred, x)
            if p < deferred.size and deferred[p] == x:
                continue
        miss[m] = x
        m += 1
    miss = miss[:m]
    key = np.empty(m, dtype=np.int64)
    for j in range(m):
        key[j] = -scores[miss[j]]
    cand = miss[np.argsort(key, kind="mergesort")]  # hottest first; stable: the smaller id first among equals
    n_free = min(slot_id.size - next_free, m)
    rest = cand[n_free:]
    evict_ids = np.empty(0, dtype=np.int64)
    evict_slots = np.empty(0, dtype=np.int64)
    if rest.size:
        blocked = np.zeros(slot_id.size, dtype=np.bool_)  # (S,) unevictable: pinned, or a hit
        for s in pinned:
            blocked[s] = True
        for j in range(u):
            s = id_slot[ids[j]]
            if s >= 0:
                blocked[s] = True  # a hit stays
        evict_ids, evict_slots = _coldest(slot_id, slot_score, blocked, rest.size, id_slot.size)
        k = evict_ids.size
        if not admit_all:  # pair the hottest miss with the coldest victim, and so on
            n = 0
            for j in range(k):
                if scores[rest[j]] > scores[evict_ids[j]]:
                    n += 1
            evict_ids, evict_slots = evict_ids[:n], evict_slots[:n]
        for r in evict_ids:
            id_slot[r] = -1
    k = evict_ids.size
    load_ids = np.empty(n_free + k, dtype=np.int64)
    load_slots = np.empty(n_free + k, dtype=np.int64)
    load_ids[:n_free] = cand[:n_free]
    for j in range(n_free):
        load_slots[j] = next_free + j
    load_ids[n_free:] = rest[:k]
    load_slots[n_free:] = evict_slots
    for j in range(n_free + k):
        x, s = load_ids[j], load_slots[j]
        slot_id[s] = x
        id_slot[x] = s
        slot_score[s] = scores[x]
    slots = np.empty(u, dtype=np.int64)
    n_over = 0
    for j in range(u):
        slots[j] = id_slot[ids[j]]
        if slots[j] < 0:
            n_over += 1
    return slots, load_ids, load_slots, evict_ids, evict_slots, n_free, hits, n_over


@njit(cache=True, nogil=True)
def exchange_rows(slots, table, write_slots, write_ids, read_ids, read_slots):
    """``table[write_ids] = slots[write_slots]``, then ``slots[read_slots] = table[read_ids]``: 2-D arrays (S, w)
    and (N, w) of one dtype (in this order: a read may reuse a written slot)."""
    for j in range(write_ids.size):
        table[write_ids[j], :] = slots[write_slots[j], :]
    for j in range(read_ids.size):
        slots[read_slots[j], :] = table[read_ids[j], :]


@njit(cache=True, nogil=True)
def read_through(slots, table, slot, ids, out):
    """``out[j] = slots[slot[j]]`` where ``slot[j] >= 0``, else ``table[ids[j]]``: 2-D arrays, (u, w) out."""
    for j in range(ids.size):
        if slot[j] >= 0:
            out[j, :] = slots[slot[j], :]
        else:
            out[j, :] = table[ids[j], :]


@njit(cache=True, nogil=True)
def write_through(slots, table, slot, ids, rows):
    """The inverse of ``read_through``: ``rows[j]`` back to slot ``slot[j]``, or to row ``ids[j]`` of ``table``."""
    for j in range(ids.size):
        if slot[j] >= 0:
            slots[slot[j], :] = rows[j, :]
        else:
            table[ids[j], :] = rows[j, :]


@njit(cache=True, nogil=True)
def serve_batch(ids, id_slot, slot_id, slot_score, next_free, scores, admit_all, dirty, slot_arrays, table_arrays,
                out):
    """``plan_batch`` (nothing pinned or deferred), then its moves, then ``out[j]`` = the weight row of ``ids[j]``
    from its slot or the table (the overflow). A dirty victim's rows go back to the table before its slot is
    reused; a loaded slot is clean. ``dirty`` (S,) bool; ``slot_arrays`` / ``table_arrays``: tuples of (S, w) /
    (N, w) arrays, the weight first; ``out`` (u, D). Returns (slots, load_ids, load_slots, evict_ids,
    evict_slots, free slots taken, hits, overflow, victims written back)."""
    none = np.empty(0, dtype=np.int64)
    slots, load_ids, load_slots, evict_ids, evict_slots, taken, hits, n_over = plan_batch(
        ids, id_slot, slot_id, slot_score, next_free, scores, none, none, admit_all)
    written = 0
    for j in range(evict_ids.size):
        s = evict_slots[j]
        if dirty[s]:
            written += 1
            for a in range(len(slot_arrays)):
                table_arrays[a][evict_ids[j], :] = slot_arrays[a][s, :]
    for j in range(load_ids.size):
        s = load_slots[j]
        dirty[s] = False
        for a in range(len(slot_arrays)):
            slot_arrays[a][s, :] = table_arrays[a][load_ids[j], :]
    read_through(slot_arrays[0], table_arrays[0], slots, ids, out)
    return slots, load_ids, load_slots, evict_ids, evict_slots, taken, hits, n_over, written


@njit(cache=True, nogil=True)
def read_rows(ids, id_slot, slot_arrays, table_arrays, outs):
    """Each array's row of ``ids[j]`` into ``outs[a][j]``, from its slot (``id_slot``) or the table; returns the
    slots (u,), -1 = in the table."""
    slot = np.empty(ids.size, dtype=np.int64)
    for j in range(ids.size):
        slot[j] = id_slot[ids[j]]
    for a in range(len(slot_arrays)):
        read_through(slot_arrays[a], table_arrays[a], slot, ids, outs[a])
    return slot


@njit(cache=True, nogil=True)
def write_rows(ids, slot, slot_arrays, table_arrays, rows, dirty):
    """The inverse of ``read_rows``: ``rows[a][j]`` back where it came from; a slot written is dirty. Returns the
    rows written to the table."""
    n = 0
    for j in range(ids.size):
        if slot[j] >= 0:
            dirty[slot[j]] = True
        else:
            n += 1
    for a in range(len(slot_arrays)):
        write_through(slot_arrays[a], table_arrays[a], slot, ids, rows[a])
    return n


@njit(cache=True, nogil=True)
def ascending(ids):
    """Whether ``ids`` strictly ascend (a bag's distinct ids, as ``torch.unique`` returns them)."""
    for j in range(1, ids.size):
        if ids[j] <= ids[j - 1]:
            return False
    return True
