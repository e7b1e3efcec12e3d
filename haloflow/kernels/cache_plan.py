"""A cache directory's plan for one batch, all tables at once: ``haloflow::cache_plan`` (``cache/batched_cache.py``).

The directory is device tensors (S slots, R rows, slot S and row R the pads); ``uniq`` (u,) is the batch's
distinct rows padded with R (``padded_unique``)::

    hit      = id_slot[uniq] >= 0                     last_use[hit slots] = clock
    (lfu, or lookahead without a histogram: score[uniq] += 1;  lookahead: next_use[uniq] = ring, the rows'
     next announced batch after this one)
    window   = C slots from ``hand`` round the cache (CLOCK's hand; the caller moves it)
    key      of each slot in the window (lowest evicted first): NEVER if last_use >= pinned_from (a batch
             not yet updated uses it), else LRU: last_use;  LFU / frequency: its row's score;  lookahead: the
             score below of its row;  a free slot -2 (-1 under LRU). The slots keep copies of their rows' score
             and next use (slot_score, slot_next), so that the window's keys are read in slot order: read over
             the rows they were two random reads a slot and most of a plan's time (numba, u = 3.3 k, C = 13 k:
             lookahead 0.84 -> 0.36 ms, LFU 0.45 -> 0.29 ms)
    victims  = the k = min(u, C) slots of lowest (key, position in the window)
    miss rank: LRU in row order; the others hottest first (score, then position)
    admit    = the r-th miss takes victim r if its key < NEVER (and, without admit_all, if the miss scores above
               it: Belady's bypass); a dirty victim's row is written back from the slots to the backing rows

    lookahead score of row i at batch ``now``: next use nu in the window: 2^56 - (nu - now) 2^36 + freq(i), else
    freq(i) (``cache/lookahead.py``, the host policy it follows); freq = score[i], capped below 2^36

Returns (slot (u,): the row's slot, S when served from the backing rows; hit (u,): cached before this plan;
cached (u,): its update goes to its slot). Every index is padded (to slot S, row R), so each shape is fixed by
u and C: nothing reads a device value on the host.

A lookahead directory is told each batch to come before it is planned: ``haloflow::cache_announce`` (batch
number a, its rows ``uniq``; a ring of the last L batches' rows, ``cap`` entries each, plus a sink entry)::

    ring[a % L] = NEVER                                      (the row of batch a - L, planned long ago)
    for each real row r of uniq at position i:
        b = last_batch[r];  if b >= 0 and b > a - L:  ring[(b % L) cap + last_pos[r]] = a   (r's use after b)
        last_batch[r] = a;  last_pos[r] = i
        if next_use[r] is NEVER or < trained (no use ahead of the plans):  next_use[r] = a  (and its slot's copy)

so that the plan of batch a reads its rows' next use after it as ``ring[a % L, :u]``.

Bodies (the same decisions and state, bit for bit: ties broken by position in both):

- stock: ~45 torch ops (a stable ``sort`` of the window's keys, not ``topk``, whose ties are unordered), any
  device;
- CPU: two numba passes, the batch's rows and the window's keys (selects, not branches: a branch on a slot's
  data mispredicts), then the decisions for the m coldest slots (m: the misses) found with NumPy's partition
  between them (numba's own took ~80 us at C = 13 k, NumPy's ~11 us; a max-heap of the m coldest in the keys'
  pass, tried 2026-12-07, was no faster: ~100 us warm at the bench's batch 128); the write-back as row copies of
  the dirty victims only.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from torch import Tensor

from haloflow.kernels._registry import call, declare, rows2d

__all__ = ["cache_plan", "cache_announce", "POLICY_CODES", "NEVER", "lookahead_score"]

POLICY_CODES = {"lru": 0, "lfu": 1, "frequency": 2, "lookahead": 3, "lookahead-counts": 4}  # 4: no histogram
NEVER = int(torch.iinfo(torch.int64).max)  # the key of a slot that must not be evicted; a row's "no next use"
FREQ_CAP = (1 << 36) - 1  # a score's frequency fills its low 36 bits (here and in cache.lookahead's host policy)
MAX_AHEAD = 1 << 16  # batches ahead a score tells apart: 2^56 - MAX_AHEAD * 2^36 stays above every frequency


def lookahead_score(next_use: Tensor, freq: Tensor, now: int) -> Tensor:
    """The lookahead policy's score of rows whose next announced use is ``next_use`` (torch ops, any device)."""
    ahead = (next_use > now) & (next_use != NEVER)
    d = torch.clamp(next_use - now, max=MAX_AHEAD)
    freq = torch.clamp(freq, max=FREQ_CAP)
    return torch.where(ahead, (1 << 56) - d * (1 << 36) + freq, freq)


def _counts_uses(policy: int) -> bool:
    return policy in (POLICY_CODES["lfu"], POLICY_CODES["lookahead-counts"])


def _row_scores(rows: Tensor, score: Tensor, next_use: Tensor, now: int, policy: int) -> Tensor:
    freq = score.index_select(0, rows)
    if policy < POLICY_CODES["lookahead"]:
        return freq
    return lookahead_score(next_use.index_select(0, rows), freq, now)


def stock(uniq: Tensor, id_slot: Tensor, slot_id: Tensor, last_use: Tensor, dirty: Tensor, pending: Tensor,
          score: Tensor, next_use: Tensor, slot_score: Tensor, slot_next: Tensor, ring: Tensor, counts: Tensor,
          slots: list[Tensor], backing: list[Tensor], hand: int, num_candidates: int, clock: int, pinned_from: int,
          now: int, policy: int, admit_all: bool, admit_misses: bool) -> tuple[Tensor, Tensor, Tensor]:
    R, S, u, C = id_slot.shape[0] - 1, slot_id.shape[0] - 1, uniq.shape[0], num_candidates
    dev = uniq.device
    valid = uniq < R
    slot = id_slot.index_select(0, uniq)  # (u,)
    hit = slot >= 0
    slot = torch.where(hit, slot, S)
    last_use.index_fill_(0, slot, clock)
    if _counts_uses(policy):
        score.index_add_(0, uniq, valid.long())  # batches that looked the row up
        slot_score.index_add_(0, slot, (valid & hit).long())
    if policy >= POLICY_CODES["lookahead"] and ring.numel():
        next_use.index_copy_(0, uniq, ring)  # the rows' next announced use after this batch
        slot_next.index_copy_(0, slot, ring)
    miss = valid & ~hit
    if not admit_misses:
        counts[:3].add_(torch.stack([valid, hit, miss]).sum(1))
        return slot, hit, hit
    if policy == POLICY_CODES["lru"]:  # misses in row order
        rank = torch.cumsum(miss, 0) - 1
        miss_score = None
    else:  # hottest first
        miss_score = _row_scores(uniq.clamp(max=R - 1), score, next_use, now, policy)
        order = torch.sort(torch.where(miss, miss_score, -1), descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(0, order, torch.arange(u, device=dev))
    window = torch.remainder(torch.arange(C, device=dev) + hand, S)  # (C,) the candidates
    if policy == POLICY_CODES["lru"]:
        key = last_use.index_select(0, window)
    else:  # from the slots' copies of their rows' score and next use: read in order, not over the rows
        key = slot_score.index_select(0, window)
        if policy >= POLICY_CODES["lookahead"]:
            key = lookahead_score(slot_next.index_select(0, window), key, now)
        key = key.masked_fill_(slot_id.index_select(0, window) < 0, -2)
    key = torch.where(last_use.index_select(0, window) >= pinned_from, NEVER, key)
    k = min(u, C)
    vkey, pos = torch.sort(key, stable=True)
    vkey, victims = vkey[:k], window.index_select(0, pos[:k])  # (k,) coldest first
    r = rank.clamp(0, k - 1)
    victim, victim_key = victims.index_select(0, r), vkey.index_select(0, r)
    admit = miss & (rank < k) & (victim_key < NEVER)
    if miss_score is not None and not admit_all:
        admit &= miss_score > victim_key
    old = slot_id.index_select(0, victim)
    evict = admit & (old >= 0)
    back = evict & dirty.index_select(0, victim)
    src, dst = torch.where(back, victim, S), torch.where(back, old, R)  # dirty victims written back (padded)
    for s, b in zip(slots, backing):
        b.index_copy_(0, dst.to(b.device), s.index_select(0, src).to(b.device))
    into = torch.where(admit, victim, S)
    id_slot.index_fill_(0, torch.where(evict, old, R), -1)
    id_slot.index_copy_(0, torch.where(admit, uniq, R), torch.where(admit, victim, -1))
    slot_id.index_copy_(0, into, torch.where(admit, uniq, -1))
    last_use.index_fill_(0, into, clock)
    dirty.index_fill_(0, into, False)
    pending.index_fill_(0, into, True)
    if policy != POLICY_CODES["lru"]:
        slot_score.index_copy_(0, into, score.index_select(0, uniq))
        if policy >= POLICY_CODES["lookahead"]:
            slot_next.index_copy_(0, into, next_use.index_select(0, uniq))
    # lookups, hits, misses, admitted, evicted, written back
    counts[:6].add_(torch.stack([valid, hit, miss, admit, evict, back]).sum(1))
    return torch.where(admit, victim, slot), hit, hit | admit


# ---------------------------------------------------------------------------------------------- CPU body
@njit(cache=True)
def _score(row, score, next_use, now, policy):  # pragma: no cover - compiled
    """A row's score (a slot's, from the slots' copies): selects, not branches on its data, which would
    mispredict in the window's pass over thousands of slots (72 us against 19 at C = 13 k, lookahead)."""
    f = score[row]
    if policy < 3:  # the same for every row of a plan: predicted
        return f
    f = min(f, FREQ_CAP)
    nu = next_use[row]
    d = min(nu - now, MAX_AHEAD)
    return ((1 << 56) - d * (1 << 36) + f) if (nu > now) & (nu != NEVER) else f


@njit(cache=True)
def _window_keys(slot_id, last_use, slot_score, slot_next, start, C, pinned_from, now, policy, keys,
                 wslots):  # pragma: no cover - compiled
    """The keys of the window's C slots, from slot ``start`` round the cache (C <= S), in two straight runs (to
    the last slot, then from slot 0), which LLVM vectorises; a wrap test inside one loop kept it from that (107
    against 19 us at C = 13 k, lookahead)."""
    S = slot_id.shape[0] - 1
    first = min(C, S - start)
    for lo, off, n in ((start, 0, first), (0, first, C - first)):
        for j in range(n):
            w = lo + j
            wslots[off + j] = w
            if policy == 0:
                k = last_use[w]
            else:
                k = _score(w, slot_score, slot_next, now, policy)
                k = -2 if slot_id[w] < 0 else k
            keys[off + j] = NEVER if last_use[w] >= pinned_from else k


@njit(cache=True)
def _plan_keys(uniq, id_slot, slot_id, last_use, score, next_use, slot_score, slot_next, ring, counts, hand, C,
               clock, pinned_from, now, policy, admit_misses, out_slot, out_hit, out_cached, order,
               keys, wslots):  # pragma: no cover - compiled
    """The plan's first half: hits and counters, the misses in admission order (``order``, returns their count),
    and the window's keys (``keys``, ``wslots``)."""
    R, S, u = id_slot.shape[0] - 1, slot_id.shape[0] - 1, uniq.shape[0]
    counting = policy == 1 or policy == 4
    has_ring = policy >= 3 and ring.shape[0] > 0
    nv = nh = 0
    nm = 0
    for i in range(u):
        r = uniq[i]
        s = id_slot[r]
        h = s >= 0
        sl = s if h else S
        out_hit[i] = h
        out_cached[i] = h
        out_slot[i] = sl
        last_use[sl] = clock
        if r < R:
            nv += 1
            if h:
                nh += 1
            else:
                order[nm] = i
                nm += 1
            if counting:
                score[r] += 1
                if h:
                    slot_score[s] += 1
        if has_ring:
            next_use[r] = ring[i]
            slot_next[sl] = ring[i]
    counts[0] += nv
    counts[1] += nh
    counts[2] += nm
    if not admit_misses:
        return 0
    if policy != 0:  # hottest first, ties in row order
        ms = np.empty(nm, np.int64)
        for j in range(nm):
            ms[j] = -_score(uniq[order[j]], score, next_use, now, policy)
        order[:nm] = order[:nm][np.argsort(ms, kind="mergesort")]
    _window_keys(slot_id, last_use, slot_score, slot_next, hand % S, C, pinned_from, now, policy, keys, wslots)
    return nm


@njit(cache=True)
def _plan_admit(uniq, id_slot, slot_id, last_use, dirty, pending, score, next_use, slot_score, slot_next, counts,
                clock, now, policy, admit_all, out_slot, out_cached, order, m, keys, wslots, thr, wb_src,
                wb_dst):  # pragma: no cover - compiled
    """The plan's second half: the m coldest slots of the window by (key, position) - those below ``thr``, the
    m-th smallest key, then the first ones equal to it - take the first m misses in order. Returns the dirty
    victims written to ``wb_src`` / ``wb_dst``."""
    C = keys.shape[0]
    sel = np.empty(m, np.int64)
    a = 0
    for j in range(C):
        if keys[j] < thr:
            sel[a] = j
            a += 1
    for j in range(C):
        if a == m:
            break
        if keys[j] == thr:
            sel[a] = j
            a += 1
    sel = sel[np.argsort(keys[sel], kind="mergesort")]
    na = ne = nb = 0
    for q in range(m):
        vk = keys[sel[q]]
        if vk == NEVER:
            break
        i = order[q]
        r = uniq[i]
        if policy != 0 and not admit_all and not _score(r, score, next_use, now, policy) > vk:
            continue
        v = wslots[sel[q]]
        old = slot_id[v]
        if old >= 0:
            id_slot[old] = -1
            ne += 1
            if dirty[v]:
                wb_src[nb] = v
                wb_dst[nb] = old
                nb += 1
        id_slot[r] = v
        slot_id[v] = r
        last_use[v] = clock
        dirty[v] = False
        pending[v] = True
        if policy != 0:
            slot_score[v] = score[r]
            if policy >= 3:
                slot_next[v] = next_use[r]
        out_slot[i] = v
        out_cached[i] = True
        na += 1
    counts[3] += na
    counts[4] += ne
    counts[5] += nb
    return nb


def cpu(uniq: Tensor, id_slot: Tensor, slot_id: Tensor, last_use: Tensor, dirty: Tensor, pending: Tensor,
        score: Tensor, next_use: Tensor, slot_score: Tensor, slot_next: Tensor, ring: Tensor, counts: Tensor,
        slots: list[Tensor], backing: list[Tensor], hand: int, num_candidates: int, clock: int, pinned_from: int,
        now: int, policy: int, admit_all: bool, admit_misses: bool) -> tuple[Tensor, Tensor, Tensor]:
    u, C = uniq.shape[0], num_candidates
    slot = torch.empty(u, dtype=torch.int64)
    hit, cached = torch.empty(u, dtype=torch.bool), torch.empty(u, dtype=torch.bool)
    empty = np.empty(0, np.int64)
    d = [uniq.numpy(), id_slot.numpy(), slot_id.numpy(), last_use.numpy(), dirty.numpy(), pending.numpy(),
         *(t.numpy() if t.numel() else empty for t in (score, next_use, slot_score, slot_next)), counts.numpy()]
    uniq_, id_slot_, slot_id_, last_use_, dirty_, pending_, score_, next_, sscore_, snext_, counts_ = d
    out_slot, out_hit, out_cached = slot.numpy(), hit.numpy(), cached.numpy()
    order, keys, wslots = np.empty(u, np.int64), np.empty(C, np.int64), np.empty(C, np.int64)
    nm = _plan_keys(uniq_, id_slot_, slot_id_, last_use_, score_, next_, sscore_, snext_,
                    ring.numpy() if ring.numel() else empty, counts_, hand, C, clock, pinned_from, now, policy,
                    admit_misses, out_slot, out_hit, out_cached, order, keys, wslots)
    m = min(nm, u, C)  # only the first m victims can be taken
    if not admit_misses or m == 0:
        return slot, hit, cached
    # the m-th smallest key: NumPy's partition (its vectorised one: ~11 us at C = 13 k, numba's took ~80 us)
    thr = int(np.partition(keys, m - 1)[m - 1]) if m < C else int(keys.max())
    src, dst = np.empty(m, np.int64), np.empty(m, np.int64)
    n = _plan_admit(uniq_, id_slot_, slot_id_, last_use_, dirty_, pending_, score_, next_, sscore_, snext_, counts_,
                    clock, now, policy, admit_all, out_slot, out_cached, order, m, keys, wslots, thr, src, dst)
    for s, b in zip(slots, backing):  # the dirty victims' rows, copied back
        if n:
            _copy_rows(rows2d(s), src, rows2d(b), dst, n)
    return slot, hit, cached


@njit(cache=True)
def _copy_rows(src, src_rows, dst, dst_rows, n):  # pragma: no cover - compiled
    for i in range(n):
        for d in range(src.shape[1]):
            dst[dst_rows[i], d] = src[src_rows[i], d]


_MUTATED = ("id_slot", "slot_id", "last_use", "dirty", "pending", "score", "next_use", "slot_score", "slot_next",
            "counts", "backing")


def _plan_fake(uniq, *args):
    u = uniq.shape[0]
    return uniq.new_empty(u), uniq.new_empty(u, dtype=torch.bool), uniq.new_empty(u, dtype=torch.bool)


OP = declare("cache_plan", stock, cpu, _plan_fake, mutates_args=_MUTATED,
             doc="a cache directory's plan for a batch: hits, victims, admissions, dirty write-back")


def announce_stock(uniq: Tensor, ring: Tensor, last_batch: Tensor, last_pos: Tensor, next_use: Tensor,
                   id_slot: Tensor, slot_next: Tensor, a: int, length: int, cap: int, trained: int) -> None:
    R, S, u = last_batch.shape[0] - 1, slot_next.shape[0] - 1, uniq.shape[0]
    sink = length * cap
    ring[(a % length) * cap:(a % length + 1) * cap].fill_(NEVER)
    last = last_batch.index_select(0, uniq)
    link = (uniq < R) & (last >= 0) & (last > a - length)  # its previous batch is still in the ring
    ring.index_fill_(0, torch.where(link, torch.remainder(last, length) * cap + last_pos.index_select(0, uniq), sink),
                     a)
    last_batch.index_fill_(0, uniq, a)
    last_pos.index_copy_(0, uniq, torch.arange(u, device=uniq.device))
    nxt = next_use.index_select(0, uniq)
    nxt = torch.where((nxt == NEVER) | (nxt < trained), a, nxt)
    next_use.index_copy_(0, uniq, nxt)
    slot = id_slot.index_select(0, uniq)
    slot_next.index_copy_(0, torch.where(slot >= 0, slot, S), nxt)  # a cached row's copy


@njit(cache=True)
def _announce(uniq, ring, last_batch, last_pos, next_use, id_slot, slot_next, a, length, cap,
              trained):  # pragma: no cover - compiled
    R = last_batch.shape[0] - 1
    base = (a % length) * cap
    ring[base:base + cap] = NEVER
    for i in range(uniq.shape[0]):
        r = uniq[i]
        if r >= R:
            continue
        b = last_batch[r]
        if b >= 0 and b > a - length:
            ring[(b % length) * cap + last_pos[r]] = a
        last_batch[r] = a
        last_pos[r] = i
        if next_use[r] == NEVER or next_use[r] < trained:
            next_use[r] = a
            if id_slot[r] >= 0:
                slot_next[id_slot[r]] = a


def announce_cpu(uniq: Tensor, ring: Tensor, last_batch: Tensor, last_pos: Tensor, next_use: Tensor,
                 id_slot: Tensor, slot_next: Tensor, a: int, length: int, cap: int, trained: int) -> None:
    _announce(uniq.numpy(), ring.numpy(), last_batch.numpy(), last_pos.numpy(), next_use.numpy(), id_slot.numpy(),
              slot_next.numpy(), a, length, cap, trained)


ANNOUNCE = declare("cache_announce", announce_stock, announce_cpu, lambda *args: None,
                   mutates_args=("ring", "last_batch", "last_pos", "next_use", "slot_next"),
                   doc="a lookahead directory told a batch to come: each row's next use, by a ring")


def cache_announce(*args) -> None:
    """Tell a lookahead directory batch ``a``'s rows (module docstring); the arguments as ``announce_stock``'s."""
    call(ANNOUNCE, *args)


def cache_plan(*args) -> tuple[Tensor, Tensor, Tensor]:
    """The plan of one batch (module docstring); the arguments as ``stock``'s. Mutates the directory tensors,
    the counters and (dirty victims written back) the backing rows."""
    return call(OP, *args)
