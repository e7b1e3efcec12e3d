"""``CachedTables``: a ``BatchedTables`` whose rows live in host memory with S hot rows on the device, and a
cache directory that is device tensors for all tables at once, planned with torch ops of fixed shapes.

::

    host (pinned on CUDA)                        device
      backing  weight (R+1, D), state: every row    slots    weight (S+1, D), state: hot rows; slot S = pad
                                                    id_slot  (R+1,) row -> slot, -1 = not cached
                                                    slot_id  (S+1,) slot -> row, -1 = free
                                                    last_use (S+1,) the plan that last used a slot's row
                                                    dirty    (S+1,) slot differs from its backing row

One plan per batch (``padded_unique``'s u = nnz distinct rows, padded with row R)::

    hit     = id_slot[u] >= 0                          last_use[hit slots] = clock
    victims = the S' = min(u, S) slots of lowest key (``topk``): LRU's key is last_use, LFU's the rows' batch
              counts, frequency's the data's histogram; a slot the outstanding batch uses (last_use >= its
              clock) is never a victim
    miss i  = the r-th miss (hottest first) takes victim r if one is left (and, without admit_all, only when
              it scores above it); the rest overflow: read from, and updated in, the backing rows
    moves   = dirty victims written back, admitted rows loaded: every index padded (to slot S / row R), so each
              move is one indexed copy of u rows whatever the data
    rows    = read from the slot where it holds the row, else from the backing rows (``haloflow::cache_gather``);
              updated rows written to their slot or backing row (``haloflow::cache_scatter``)

Nothing in a plan or a step reads a device value on the host (the counts stay device tensors: ``stats()``
reads them). Why a dense row -> slot map, not FBGEMM's set-associative one: measured on this project's 2-core
CPU at Kaggle's shape capped to 200 k rows a table (R = 2.9 M, S = 5 %, u = 53 k), a plan's directory work is
3.4 ms with the dense map and a global ``topk`` against 9 / 14 / 27 ms with 8 / 16 / 32 ways (the ways of
every id sorted by age), and a global LRU evicts no row a set's conflicts would; the map costs 8 bytes a row on
the device (270 MB at Kaggle's 33.8 M rows, beside 2.2 GB of float32 rows).

Exactness: a row and its optimizer state move together and the update is the same arithmetic wherever the row
is, so the cached tables train the floats of ``BatchedTables`` (tested bit for bit).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from haloflow.cache.batched import BatchedTables, padded_unique, pooled_sum
from haloflow.cache.types import CacheStats, RowOptimizer
from haloflow.cache.policy import DEFAULT_WINDOW
from haloflow.errors import ConfigError
from haloflow.kernels.cache_plan import NEVER, POLICY_CODES, cache_announce, cache_plan
from haloflow.kernels.cache_rows import cache_gather, cache_scatter
from haloflow.kernels.unique import table_unique

__all__ = ["CachedTables", "DEVICE_POLICIES"]

DEVICE_POLICIES = ("lru", "lfu", "frequency", "lookahead")
_STATS = ("lookups", "hits", "misses", "admitted", "evicted", "written_back")  # overflow = misses - admitted
# Candidate victims a plan ranks per row it looks up. 2, not 4: the same hit rates to three places (bench cache
# 2026-12-07: Zipf and Criteo traces at 0.5-10 % of the rows, DLRM at batch 128, lookahead and LRU) with half the
# window's keys to read and rank: 5 % lookahead 0.851 -> 0.864x all in memory (medians of six alternating runs).
# At 1 the hit rates drop a little (1 % LRU 0.579 -> 0.577).
WINDOW_PER_ROW = 2


class CachedTables(BatchedTables):
    """Tables end to end in host memory, ``num_slots`` hot rows on ``device``. See the module docstring.

    Args:
        sizes, dim, optimizer, init, dtype, names: as ``BatchedTables``.
        num_slots: S, rows the device holds (1 <= S <= the rows of all tables).
        device: where the slots and the directory live (the compute device).
        policy: "lru", "lfu", "frequency" (needs ``histogram``: each row's count in the data, the tables end
            to end; the hottest rows are loaded before the first batch) or "lookahead" (Belady within the next
            ``window`` batches, which the driver announces with ``announce``; then the histogram when given, else
            the rows' batch counts so far).
        admit_all: a miss always takes a victim's slot (True), or only when it scores above it (for lookahead:
            only when it is used again sooner than its victim, Belady's bypass).

    Shapes:
        lookup: ids (nnz,), lengths (n,), tables (n,) -> (n, D)
    """

    def __init__(self, sizes: Sequence[int], dim: int, optimizer: RowOptimizer, *, num_slots: int,
                 init: Callable[[int], Tensor] | None = None, device=None, dtype: torch.dtype = torch.float32,
                 names: Sequence[str] | None = None, policy: str = "lru", admit_all: bool = True,
                 histogram: np.ndarray | None = None, window: int = DEFAULT_WINDOW):
        dev = torch.device(device if device is not None else "cpu")
        host = torch.device("cpu")
        super().__init__(sizes, dim, optimizer, init=init, device=host, dtype=dtype, names=names)
        R = self.num_rows
        if not 1 <= num_slots <= R:
            raise ConfigError(f"{num_slots} cache slots for tables of {R} rows; expected 1..{R}", field="num_slots")
        if policy not in DEVICE_POLICIES:
            raise ConfigError(f"cache policy {policy!r}: expected one of {DEVICE_POLICIES}", field="policy")
        if policy == "frequency" and histogram is None:
            raise ConfigError(f"cache policy 'frequency' ranks rows by their count in the data: it needs a histogram "
                              f"of the {R} rows", field="histogram")
        if histogram is not None and len(histogram) != R:
            raise ConfigError(f"a histogram of {len(histogram)} counts for tables of {R} rows; expected one count a "
                              "row", field="histogram")
        if dev.type != "cpu":  # every row on the host, pinned so that rows move to and from the device directly
            self.arrays = {k: a.pin_memory() for k, a in self.arrays.items()}
        self.backing = self.arrays
        self.device, self.num_slots, self.policy, self.admit_all = dev, int(num_slots), policy, admit_all
        S = self.num_slots
        self.slots = {k: torch.zeros((S + 1, *a.shape[1:]), dtype=a.dtype, device=dev) for k, a in self.backing.items()}
        self.id_slot = torch.full((R + 1,), -1, dtype=torch.int64, device=dev)
        self.slot_id = torch.full((S + 1,), -1, dtype=torch.int64, device=dev)
        self.last_use = torch.full((S + 1,), -1, dtype=torch.int64, device=dev)
        self.dirty = torch.zeros(S + 1, dtype=torch.bool, device=dev)
        self.pending = torch.zeros(S + 1, dtype=torch.bool, device=dev)  # admitted, its row not yet written in
        self.counts = torch.zeros(len(_STATS), dtype=torch.int64, device=dev)  # read by ``stats`` only
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        self._empty = empty
        # (R+1,) each row's score: LFU's batch counts, frequency's histogram, lookahead's either (its frequency)
        self.score = empty
        if histogram is not None and policy in ("frequency", "lookahead"):
            self.score = torch.as_tensor(np.append(np.asarray(histogram, dtype=np.int64), -1), device=dev)
        elif policy in ("lfu", "lookahead"):
            self.score = torch.zeros(R + 1, dtype=torch.int64, device=dev)
        self._code = POLICY_CODES["lookahead-counts" if policy == "lookahead" and histogram is None else policy]
        self.window = int(window)
        self.next_use = empty  # lookahead: (R+1,) each row's next announced batch (NEVER: none)
        if policy == "lookahead":
            if self.window < 1:
                raise ConfigError(f"a lookahead window of {window} batches; expected >= 1", field="window")
            self.next_use = torch.full((R + 1,), NEVER, dtype=torch.int64, device=dev)
            self._last_batch = torch.full((R + 1,), -1, dtype=torch.int64, device=dev)  # its last announced batch
            self._last_pos = torch.zeros(R + 1, dtype=torch.int64, device=dev)  # its place in that batch's rows
        self._ring_len = self.window + 3  # announced batches held: the window, the one planned, one prefetched
        self._ring: Tensor | None = None  # (L * cap + 1,) each announced row's next announced batch; last: a sink
        self._cap = 0
        self._announced: collections.deque = collections.deque()  # ((ids, lengths, tables), number, uniq, inverse)
        # of the batches announced and not yet planned
        self._fed = 0  # batches announced (numbered as the training plans)
        # training plans made, of them prefetched (planned before their lookup) and from an announcement (host
        # counts: how much of what the driver told was used)
        self.ahead = {"plans": 0, "prefetched": 0, "announced": 0}
        self._trained = 0  # training plans made
        # the slots' copies of their rows' score and next use (the plan reads a window of slots in order)
        self.slot_score = empty if policy == "lru" else torch.zeros(S + 1, dtype=torch.int64, device=dev)
        self.slot_next = (torch.full((S + 1,), NEVER, dtype=torch.int64, device=dev) if policy == "lookahead"
                          else empty)
        self.row_offsets = self.row_offsets.to(dev)
        self.clock = 0  # plans made (a host counter: no device value is read for it)
        self._hand = 0  # where the next plan's window of candidate victims starts
        self._pending_rows: list[tuple] = []  # (uniq, slot, hit, cached, rows, plan clock) of lookups not yet
        # updated
        self._prefetched: tuple | None = None  # ((ids, lengths, tables), uniq, inverse, slot, hit, cached, clock)
        self._thread: threading.Thread | None = None  # a prefetch in the background
        self._failed: BaseException | None = None  # what the background prefetch raised
        self._side = None  # the CUDA stream of a background prefetch
        self._histogram = histogram is not None and policy in ("frequency", "lookahead")
        if self._histogram:
            self._warm()

    # ------------------------------------------------------------------------------------------ the plan
    def _plan(self, uniq: Tensor, pinned_from: int, admit_misses: bool = True,
              ring: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Decide the moves of the batch with distinct rows ``uniq`` (padded with R) and write the dirty victims
        back (``kernels.cache_plan``: one op). Returns each row's slot (S: served from the backing rows), whether
        it had one before this plan (``hit``), and whether its update goes there (``cached``). An admitted row is
        not loaded here: its batch reads it from the backing rows and its update writes it into its slot
        (``pending`` until then), so a step moves each admitted row once. Slots last used by a plan numbered
        ``pinned_from`` or later are kept (the batches not yet updated); ``admit_misses`` False (a lookup without
        an update) admits none. ``ring``: the rows' next announced use after this batch (lookahead)."""
        self.clock += 1
        # the candidates: a window of C slots that moves round the cache, plan by plan (CLOCK's hand), so a plan
        # ranks C slots, not S; a slot's key is looked at once every S / C plans
        S = self.num_slots
        C = min(S, WINDOW_PER_ROW * uniq.numel())
        hand = self._hand
        if admit_misses and C < S:
            self._hand = (hand + C) % S
        now = self._trained
        if admit_misses:
            self._trained += 1
            self.ahead["plans"] += 1
        return cache_plan(uniq, self.id_slot, self.slot_id, self.last_use, self.dirty, self.pending, self.score,
                          self.next_use, self.slot_score, self.slot_next, ring if ring is not None else self._empty,
                          self.counts,
                          list(self.slots.values()), list(self.backing.values()), hand, C, self.clock, pinned_from,
                          now, self._code, self.admit_all, admit_misses)

    def _warm(self) -> None:
        """Load the hottest rows of the histogram (the frequency policy's static hot set) before the first batch."""
        hot = torch.topk(self.score[:self.num_rows], self.num_slots).indices
        hot = torch.sort(hot[self.score.index_select(0, hot) > 0]).values  # warm start only: a read is fine here
        into = torch.arange(hot.numel(), device=self.device)
        for k, a in self.slots.items():
            a.index_copy_(0, into, self.backing[k].index_select(0, hot.to(a.device)).to(self.device))
        self.id_slot.index_copy_(0, hot, into)
        self.slot_id.index_copy_(0, into, hot)
        self.slot_score.index_copy_(0, into, self.score.index_select(0, hot))
        if self.slot_next.numel():
            self.slot_next.index_copy_(0, into, self.next_use.index_select(0, hot))

    # ------------------------------------------------------------------------------------------ lookups
    def _rows(self, ids: Tensor, lengths: Tensor, tables: Tensor) -> tuple[Tensor, Tensor]:
        return table_unique(ids, lengths, tables, self.row_offsets, self.num_rows)[1:]

    def announce(self, ids: Tensor, lengths: Tensor, tables: Tensor) -> None:
        """Tell a lookahead directory the rows of a batch to come (other policies ignore it). Batches are announced
        in the order they will be trained, from the next one planned on, at most ``window`` + 1 ahead of it: the
        first announced is the next training lookup (or prefetch), and so on. A lookup of ids that are not the
        announced tensor (``is``) is planned as unannounced: the policy then knows less, the values are the same.

        Each announced row tells its previous announced batch where it is used next (``kernels.cache_announce``:
        a ring of the last batches' rows, and where each row stands in its last one), so a plan reads its rows'
        next use as one slice; fixed shapes, nothing read back."""
        if self.policy != "lookahead":
            return
        self._join()
        a, L = self._fed, self._ring_len
        if a - self._trained >= L - 1:
            raise ConfigError(f"batch {a} announced while the next planned is {self._trained}: a lookahead directory "
                              f"holds at most window + 1 = {L - 2} batches ahead", field="window")
        dev = self.device
        ids, lengths, tables = ids.to(dev), lengths.to(dev), tables.to(dev)
        uniq, inverse = self._rows(ids, lengths, tables)
        u = uniq.numel()
        if u > self._cap:  # more rows than a ring row holds: widen every row (positions stay valid)
            cap = max(u, 2 * self._cap)
            ring = torch.full((L * cap + 1,), NEVER, dtype=torch.int64, device=dev)
            if self._ring is not None:
                ring[:L * cap].view(L, cap)[:, :self._cap] = self._ring[:L * self._cap].view(L, self._cap)
            self._ring, self._cap = ring, cap
        cache_announce(uniq, self._ring, self._last_batch, self._last_pos, self.next_use, self.id_slot,
                       self.slot_next, a, L, self._cap, self._trained)
        self._announced.append(((ids, lengths, tables), a, uniq, inverse))
        self._fed += 1

    def _rows_of(self, ids: Tensor, lengths: Tensor, tables: Tensor, train: bool
                 ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The distinct rows of a batch about to be planned and their inverse; for a training batch that was
        announced, the ones computed then and the rows' next announced use after it (the ring's row)."""
        q = self._announced
        while q and q[0][1] < self._trained:  # announced, but planned without (other ids were looked up)
            q.popleft()
        if train and q and q[0][1] == self._trained and _same_ids(q[0][0], (ids, lengths, tables)):
            _, a, uniq, inverse = q.popleft()
            self.ahead["announced"] += 1
            L, cap = self._ring_len, self._cap
            return uniq, inverse, self._ring[(a % L) * cap:(a % L) * cap + uniq.numel()]
        return (*self._rows(ids, lengths, tables), None)

    def prefetch(self, ids: Tensor, lengths: Tensor, tables: Tensor, *, background: bool = False) -> None:
        """Plan the next batch now, before the outstanding one's update: its rows get slots and the dirty
        victims go back to the host, so that its own lookup and update only read and write rows. The outstanding
        batch's slots are never victims, so nothing here touches a row or slot its update writes (but the pad
        row and slot, which hold nothing).

        ``background``: plan in a thread (on CUDA on a side stream) while the caller goes on to the outstanding
        batch's backward and update; the next lookup, ``flush``, ``stats`` and ``load_rows`` wait for it.
        """
        self._join()
        dev = self.device
        ids, lengths, tables = ids.to(dev), lengths.to(dev), tables.to(dev)
        pinned_from = self._pinned_from()

        def work() -> None:
            try:
                uniq, inverse, ring = self._rows_of(ids, lengths, tables, True)
                plan = self._plan(uniq, pinned_from, ring=ring)
                self._prefetched = ((ids, lengths, tables), uniq, inverse, *plan, self.clock)
            except BaseException as err:  # raised again by the next call that waits for it
                self._failed = err

        if not background:
            work()
            return
        if dev.type == "cuda":  # the moves on a side stream, after what the training stream has queued so far
            side, main = torch.cuda.Stream(dev), torch.cuda.current_stream(dev)
            side.wait_stream(main)
            self._side = side
            plain = work

            def work() -> None:
                with torch.cuda.stream(side):
                    plain()

        self._thread = threading.Thread(target=work, name="haloflow-prefetch", daemon=True)
        self._thread.start()

    def _pinned_from(self) -> int:
        """The oldest plan whose batch is not updated yet (looked up and waiting for ``step``, or prefetched and
        not looked up): the slots last used by it or a later plan keep their rows. (Plans are not one per batch:
        an evaluation lookup plans too, so the clock alone does not say which batches are outstanding.)"""
        clocks = [p[-1] for p in self._pending_rows]
        if self._prefetched is not None:
            clocks.append(self._prefetched[-1])
        return min(clocks, default=self.clock + 1)

    def _join(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        side, self._side = self._side, None
        if side is not None:  # the training stream goes on after the moves
            torch.cuda.current_stream(self.device).wait_stream(side)
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def lookup(self, ids: Tensor, lengths: Tensor, tables: Tensor, *, train: bool) -> Tensor:
        self._join()
        dev = self.device
        ids, lengths, tables = ids.to(dev), lengths.to(dev), tables.to(dev)
        pre = self._prefetched
        if pre is not None and _same_ids(pre[0], (ids, lengths, tables)):
            self._prefetched = None
            _, uniq, inverse, slot, hit, cached, planned_at = pre
            if train:
                self.ahead["prefetched"] += 1
        else:  # the batches not yet updated keep their slots; a lookup without an update admits nothing (an
            # evaluation lookup between a prefetch and its batch leaves the prefetched plan for that batch)
            if train:
                self._prefetched = None
            uniq, inverse, ring = self._rows_of(ids, lengths, tables, train)
            slot, hit, cached = self._plan(uniq, self._pinned_from(), admit_misses=train, ring=ring)
            planned_at = self.clock
        # a row's values are in its slot unless it was admitted and no update has written it there yet (read
        # now, not at the plan: a prefetch plans before the batch before it is updated; ``pending`` is the same at
        # this batch's update, since a later plan never takes a slot of a batch not yet updated)
        rows = cache_gather(self.slots["weight"], self.backing["weight"], slot, uniq, hit, self.pending)  # (u, D)
        rows.requires_grad_(train)  # a leaf: the rows' gradients sum here
        if train:
            self._pending_rows.append((uniq, slot, hit, cached, rows, planned_at))
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=dev)
        torch.cumsum(lengths, 0, out=offsets[1:])
        return pooled_sum(rows, inverse, offsets, lengths)  # (n, D)

    def step(self) -> None:
        """The row optimizer on every pending lookup's rows, read where they are (slot or backing rows), written
        where they belong: a cached row (hit or just admitted) into its slot, marked dirty; an overflow row
        into the backing rows. One update of the u rows; ``kernels.cache_rows`` reads them (one op per state
        array: the weight was read at the lookup) and writes every array and marks the slots in one op."""
        pending, self._pending_rows = self._pending_rows, []
        for uniq, slot, hit, cached, rows, _ in pending:
            if rows.grad is None:
                continue
            state = {k: cache_gather(a, self.backing[k], slot, uniq, hit, self.pending) for k, a in self.slots.items()
                     if k != "weight"}
            weight = rows.detach()  # (u, D) read at the lookup; no longer needed by autograd: updated in place
            self.optimizer.update(weight, state, rows.grad)
            state["weight"] = weight
            cache_scatter(list(self.slots.values()), list(self.backing.values()), [state[k] for k in self.slots],
                          slot, uniq, cached, self.dirty, self.pending)

    # ------------------------------------------------------------------------------------------ state
    def flush(self) -> None:
        """Write every dirty slot back: then the backing rows hold every row (a read of the device: not in a step)."""
        self._join()
        S, R = self.num_slots, self.num_rows
        back = self.dirty[:S] & (self.slot_id[:S] >= 0)
        src = torch.where(back, torch.arange(S, device=self.device), S)
        dst = torch.where(back, self.slot_id[:S], R)
        for k, a in self.backing.items():
            a.index_copy_(0, dst.to(a.device), self.slots[k].index_select(0, src).to(a.device))
        self.counts[_STATS.index("written_back")] += back.sum()
        self.dirty.fill_(False)

    def state_dict(self) -> dict[str, Tensor]:
        self.flush()
        return {k: a[:self.num_rows] for k, a in self.backing.items()}

    def load_rows(self, lo: int, hi: int, state: dict[str, Tensor]) -> None:
        """Replace rows lo..hi-1 and their state; the cache starts over empty (warm again from a histogram), and
        a lookahead directory forgets the batches announced."""
        self._join()
        self.flush()
        for k, a in self.backing.items():
            a[lo:hi].copy_(state[k])
        self.id_slot.fill_(-1)
        self.slot_id.fill_(-1)
        self.last_use.fill_(-1)
        self.pending.fill_(False)
        self._hand = 0
        if self.policy == "lookahead":
            self.next_use.fill_(NEVER)
            self.slot_next.fill_(NEVER)
            self._last_batch.fill_(-1)
            self._ring, self._cap = None, 0
            self._announced.clear()
            self._fed = self._trained
        if self._histogram:
            self._warm()

    def stats(self) -> CacheStats:
        """The counters so far (reads them from the device)."""
        self._join()
        values = dict(zip(_STATS, self.counts.tolist()))
        values["overflow"] = values["misses"] - values["admitted"]
        row = self.dim * self.backing["weight"].element_size() + sum(
            a[0].numel() * a.element_size() for k, a in self.backing.items() if k != "weight")
        return CacheStats(**values, bytes_to_device=values["admitted"] * row, bytes_to_host=values["written_back"] * row)

    @property
    def nbytes(self) -> int:
        """Device bytes: the slots with their state, the directory (id_slot 8 bytes a row)."""
        return (sum(a.numel() * a.element_size() for a in self.slots.values()) + self.id_slot.numel() * 8
                + 3 * (self.num_slots + 1) * 8)


def _same_ids(planned: tuple[Tensor, ...], batch: tuple[Tensor, ...]) -> bool:
    """Whether a lookup's (ids, lengths, tables) are the ones planned ahead: the same memory (one process: its
    own batch, lengths viewed again), else the same values (K ranks: the exchange's copy of what ``ahead_ids``
    told; a comparison that reads the device). A lookup of other ids is planned again."""
    def same(a: Tensor, b: Tensor) -> bool:
        if a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
                      and a.dtype == b.dtype and a.device == b.device):
            return True
        return a.shape == b.shape and a.device == b.device and bool(torch.equal(a, b))

    return all(same(a, b) for a, b in zip(planned, batch))


def simulate_tables(trace: Sequence[np.ndarray], num_slots: int, policy: str, *, num_rows: int,
                    window: int = DEFAULT_WINDOW, histogram: np.ndarray | None = None,
                    admit_all: bool = True) -> CacheStats:
    """The hit rate ``CachedTables``' own directory gets on ``trace`` (batches of row ids of one table of
    ``num_rows`` rows), each batch planned as a training lookup is (a lookahead directory told the next
    ``window`` batches first); rows of width 1, no update (no row changes: the decisions do not look at values)."""
    from haloflow.cache.optim import make_optimizer

    tables = CachedTables([num_rows], 1, make_optimizer({"name": "sgd", "lr": 1.0}), num_slots=num_slots,
                          init=lambda t: torch.zeros(num_rows, 1), policy=policy, histogram=histogram,
                          window=window, admit_all=admit_all)
    batches = [torch.as_tensor(np.asarray(b, dtype=np.int64)) for b in trace]
    one = torch.zeros(1, dtype=torch.int64)
    told = 0
    for i, ids in enumerate(batches):
        while policy == "lookahead" and told < min(len(batches), i + window + 1):
            tables.announce(batches[told], torch.tensor([batches[told].numel()]), one)
            told += 1
        tables.lookup(ids, torch.tensor([ids.numel()]), one, train=True)
        tables.step()  # no gradient: nothing written, the batch no longer pins its slots
    return tables.stats()
