"""``CachedStore``: a table's hot rows in S device slots in front of a `BackingStore` that holds every row.

::

    compute device (GPU memory; on CPU, RAM)          backing store (pinned host memory or memory-mapped file)
      slots  weight (S, D), state (S, ...)  <-- load ---  weight (N, D), state (N, ...): every row, always
             dirty (S,)                      -- write back (dirty victims only) -->
      SlotDirectory: slot_id (S,), id_slot (N,), policy

Per batch (``gather``): distinct ids -> hits stay, the policy admits misses into free or evicted slots (a dirty
victim is written back first), the rest overflow: read from the backing store, and later updated there by
``apply_gradients``. A batch with more distinct ids than slots therefore works (Colossal-AI asserts instead).
Each row's optimizer state moves with the row, so every optimizer (not only SGD) trains exactly as uncached.

Prefetch, and why no update can be lost to a stale row. FBGEMM resolves a batch's slots when it loads the batch
and uses them again at the update; a prefetch in between may have evicted and reused such a slot, and the
update lands on another row's slot (FACTS.md). Here, by construction:

1. ``apply_gradients`` resolves every id's location (slot or backing store) when it updates, from the
   directory; no slot number is carried from ``gather`` to the update.
2. The only thing that moves rows while the training thread runs is the prefetch job. ``prefetch`` plans in the
   training thread (the directory changes at once) with the slots of the outstanding batch (gathered, not yet
   updated) pinned, and that batch's backing-store rows deferred (not loaded now; the prefetched batch reads
   them from the backing store, after the update): so the job never evicts, overwrites or reads a row the
   outstanding batch will update, and the slots and rows it writes are disjoint from the ones
   ``apply_gradients`` writes.
3. ``apply_gradients`` with an id outside the outstanding batch, ``gather`` of anything, ``flush``,
   ``state_dict`` and ``close`` first wait for the job.

Shapes:
    gather: ids int64 (n,) -> (n, D) on ``device``; apply_gradients: ids (u,) distinct, grads (u, D)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from haloflow.cache.backing import BackingStore
from haloflow.cache.directory import BatchPlan, SlotDirectory
from haloflow.cache.kernels import ascending, read_rows, write_rows
from haloflow.cache.policy import DEFAULT_WINDOW, POLICIES, LRUPolicy, make_policy
from haloflow.cache.transfer import RowMover
from haloflow.cache.types import CachePolicy, CacheStats
from haloflow.errors import ConfigError

__all__ = ["CachedStore", "CacheConfig"]

_NO_VICTIMS = np.zeros(0, dtype=bool)


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """How big a table's cache is and how it chooses rows. Give ``num_slots`` or ``ratio``, not both.

    Args:
        num_slots: slots on the device (rows it can hold).
        ratio: slots as a fraction of the table's rows (``--cache-ratio``), rounded up, at least 1.
        policy: ``"lru"``, ``"lfu"``, ``"frequency"`` (Colossal-AI's; needs a histogram) or ``"lookahead"``
            (Belady within the next ``window`` batches, which the driver announces with ``CachedStore.upcoming``).
        admit_all: cache every miss (True, classic) or only misses the policy scores above the victim.
        window: batches ahead the lookahead policy sees (ignored by the others).
        max_bytes: device memory the slots (rows + optimizer state) may use; None: no budget.
    """

    num_slots: int | None = None
    ratio: float | None = None
    policy: str = "lru"  # needs no data statistics; "frequency" hits more when a histogram is at hand
    admit_all: bool = True
    window: int = DEFAULT_WINDOW
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if (self.num_slots is None) == (self.ratio is None):
            raise ConfigError(f"CacheConfig needs exactly one of num_slots and ratio, got num_slots="
                              f"{self.num_slots}, ratio={self.ratio}", field="num_slots")
        if self.num_slots is not None and self.num_slots < 1:
            raise ConfigError(f"CacheConfig.num_slots must be >= 1, got {self.num_slots}", field="num_slots")
        if self.ratio is not None and not 0 < self.ratio <= 1:
            raise ConfigError(f"CacheConfig.ratio must be in (0, 1] (a fraction of the rows), got {self.ratio}",
                              field="ratio")
        if self.policy not in POLICIES:
            raise ConfigError(f"CacheConfig.policy must be one of {POLICIES}, got {self.policy!r}", field="policy")
        if self.window < 1:
            raise ConfigError(f"CacheConfig.window must be >= 1 batch, got {self.window}", field="window")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ConfigError(f"CacheConfig.max_bytes must be >= 1, got {self.max_bytes}", field="max_bytes")

    def slots_for(self, num_rows: int) -> int:
        """Slots for a table of ``num_rows`` rows: ``num_slots``, or ceil(ratio x rows)."""
        if self.num_slots is not None:
            return self.num_slots
        return max(1, int(np.ceil(self.ratio * num_rows)))


class CachedStore:
    """A `RowStore` with ``num_slots`` hot rows on ``device`` over ``backing``. See the module docstring.

    Args:
        backing: every row and its optimizer state (``BackingStore.in_memory`` / ``create`` / ``open``); the
            store uses its optimizer and owns it from now on (``close`` closes it).
        num_slots: S, rows the device holds (1 <= S <= rows).
        policy: eviction/admission policy (a fresh LRU by default).
        device: where the slots live and rows are returned.
        max_bytes: budget of device memory for the slots; S x (row + state bytes) above it is an error.
        name: the table's name in errors (default: the backing store's).
        overlap: prefetch in the background (True), never (False: ``prefetch`` does nothing), or as ``RowMover``
            decides (None: in the background on CUDA; on a CPU whichever of the two gives the shorter step, timed
            as training goes).

    Attributes:
        stats: `CacheStats` counters (hits, misses, admitted, overflow, evicted, written back, bytes).

    Raises:
        ConfigError: S < 1, S > rows, or the slots need more than ``max_bytes``; the message names the table.
    """

    def __init__(self, backing: BackingStore, *, num_slots: int, policy: CachePolicy | None = None,
                 device: torch.device | str = "cpu", max_bytes: int | None = None, name: str | None = None,
                 overlap: bool | None = None):
        self.name = backing.name if name is None else name
        self.backing, self.optimizer = backing, backing.optimizer
        self.num_rows, self.dim = backing.num_rows, backing.dim
        self.device = torch.device(device)
        self.num_slots = int(num_slots)
        self.slot_bytes = backing.row_bytes
        if not 1 <= self.num_slots <= self.num_rows:
            raise ConfigError(f"table {self.name!r}: {self.num_slots} cache slots for {self.num_rows} rows; "
                              f"expected 1 <= num_slots <= {self.num_rows} (the cache cannot hold more rows than "
                              "the table has)", field="num_slots")
        need = self.num_slots * self.slot_bytes
        if max_bytes is not None and need > max_bytes:
            raise ConfigError(f"table {self.name!r}: {self.num_slots} cache slots x {self.slot_bytes} bytes (row + "
                              f"optimizer state) = {need} bytes, over max_bytes {max_bytes}; at most "
                              f"{max_bytes // self.slot_bytes} slots fit", field="max_bytes")
        self.slots = {k: torch.empty((self.num_slots, *a.shape[1:]), dtype=a.dtype, device=self.device)
                      for k, a in backing.arrays.items()}  # (S, D) weight, (S, ...) state
        self._host = BackingStore.host_views(self.slots)  # (S, w) NumPy views when the slots are in host memory
        self._keys = ["weight", *(k for k in self.slots if k != "weight")]
        # (slots, rows) views, the weight first, when the slots are in host memory (the rows always are, in the
        # slots' dtypes): moved by one compiled call per gather and two per update
        self._fused: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]] | None = None
        if self._host is not None:
            self._fused = tuple(self._host[k] for k in self._keys), backing.host_arrays(self._keys)
        self.dirty = np.zeros(self.num_slots, dtype=bool)  # (S,) slot differs from its backing row
        self.directory = SlotDirectory(self.num_rows, self.num_slots, policy if policy is not None else LRUPolicy())
        self._mover = RowMover(self.device, overlap)
        self._pending: BatchPlan | None = None  # plan of the prefetch in flight (or done, not yet gathered)
        self._outstanding: BatchPlan | None = None  # last gathered batch whose update has not come yet
        self._gathered: tuple[Tensor | None, int] = (None, 0)  # the ids tensor of the last gather, its version
        self._warm()

    @classmethod
    def from_config(cls, backing: BackingStore, config: CacheConfig, *, device: torch.device | str = "cpu",
                    histogram: np.ndarray | None = None, name: str | None = None) -> CachedStore:
        """A store sized and ruled by ``config`` (``histogram``: the row counts the frequency policy needs)."""
        policy = make_policy(config.policy, histogram=histogram, admit_all=config.admit_all, window=config.window)
        return cls(backing, num_slots=config.slots_for(backing.num_rows), policy=policy, device=device,
                   max_bytes=config.max_bytes, name=name)

    @property
    def stats(self) -> CacheStats:
        return self.directory.stats

    def reset_stats(self) -> None:
        self.directory.stats = CacheStats()

    # ------------------------------------------------------------------------------------------ lookups
    def gather(self, ids: Tensor) -> Tensor:
        """Rows ``ids`` (n,) as a (n, D) tensor on ``device``. One device sync: the ids go to the host."""
        u = self._host_ids(ids)
        inverse = None
        if not ascending(u):  # a bag hands over its distinct ids, ascending, already
            uniq, inverse = torch.unique(ids, return_inverse=True)  # (u,), (n,)
            u = self._host_ids(uniq)
        else:
            u = u.copy()  # the plans keep u: not a view of the caller's tensor
        self._gathered = ids, ids._version  # apply_gradients of this very tensor needs no comparison of ids
        pending, self._pending = self._pending, None
        self._mover.wait()
        self._mover.step()
        if pending is not None and np.array_equal(pending.ids, u):
            plan = self._complete(pending)  # prefetched rows are hits now
        else:
            served = self._serve(u) if self._fused is not None else None
            if served is not None:
                return served if inverse is None else served[inverse]
            plan = self.directory.plan(u)
        self._move(plan, self._claim(plan))
        self._outstanding = plan
        cached = plan.slots >= 0
        if cached.all():  # the common case: one gather from the slots
            rows = self.slots["weight"].index_select(0, torch.from_numpy(plan.slots).to(self.device))  # (u, D)
            return rows if inverse is None else rows[inverse.to(self.device)]
        if self._host is not None:  # host slots: one compiled gather from slots and backing store
            through = self.backing.read_through(self._host, plan.slots, plan.ids, keys=("weight",))
            self.stats.bytes_to_device += int(np.count_nonzero(~cached)) * self.dim * through["weight"].element_size()
            rows = through["weight"]  # (u, D)
            return rows if inverse is None else rows[inverse]
        rows = torch.empty((u.size, self.dim), dtype=self.slots["weight"].dtype, device=self.device)  # (u, D)
        if cached.any():
            pos = torch.from_numpy(np.flatnonzero(cached)).to(self.device)
            rows[pos] = self.slots["weight"][torch.from_numpy(plan.slots[cached]).to(self.device)]
        if not cached.all():
            over = torch.from_numpy(plan.ids[~cached])
            pos = torch.from_numpy(np.flatnonzero(~cached)).to(self.device)
            rows[pos] = self.backing.read(over, keys=("weight",))["weight"].to(self.device, non_blocking=True)
            self.stats.bytes_to_device += over.numel() * self.dim * rows.element_size()
        return rows if inverse is None else rows[inverse.to(self.device)]  # (n, D)

    def _serve(self, u: np.ndarray) -> Tensor | None:
        """``gather``'s plan, moves and read on host arrays in one compiled call (``SlotDirectory.serve``); None
        when the policy needs the NumPy plan."""
        slot_arrays, table_arrays = self._fused
        rows = np.empty((u.size, self.dim), dtype=slot_arrays[0].dtype)  # (u, D)
        served = self.directory.serve(u, self.dirty, slot_arrays, table_arrays, rows)
        if served is None:
            return None
        plan, written = served
        n_over = int(np.count_nonzero(plan.slots < 0))
        st = self.stats
        st.written_back += written
        st.bytes_to_host += written * self.slot_bytes
        st.bytes_to_device += plan.load_ids.size * self.slot_bytes + n_over * rows.strides[0]
        self.backing.touch(written + plan.load_ids.size + n_over)
        self._outstanding = plan
        return torch.from_numpy(rows)

    def prefetch(self, ids: Tensor) -> None:
        """Start bringing the rows of the next batch ``ids`` into slots while the current batch computes.

        The next ``gather`` of the same ids waits for it; a different batch just finds those rows cached. Skipped
        when copying in the background does not shorten a step (``RowMover.background``; on a CPU it is timed).
        """
        if not self._mover.background():
            self._pending = None  # the next gather plans and moves its batch itself, as without prefetch
            self._mover.wait()
            return
        u = self._host_ids(ids)
        if u.size > 1 and not (u[1:] > u[:-1]).all():  # a bag hands over its distinct ids, ascending, already
            u = self._host_ids(torch.unique(ids))
        else:
            u = u.copy()  # the plan keeps u: not a view of the caller's tensor
        self._pending = None
        self._mover.wait()
        out = self._outstanding
        pinned = out.slots[out.slots >= 0] if out is not None else np.empty(0, dtype=np.int64)
        deferred = out.overflow_ids if out is not None else np.empty(0, dtype=np.int64)
        plan = self.directory.plan(u, pinned=pinned, deferred=deferred, final=False)
        dirty = self._claim(plan)
        self._pending = plan
        self._mover.submit(lambda: self._move(plan, dirty))

    def _complete(self, prefetched: BatchPlan) -> BatchPlan:
        """The plan that serves a prefetched batch: the rows are where the prefetch put them, and nothing is
        planned again. The rows it deferred (updated by the batch before in the backing store) are served from
        the backing store like overflow; a later batch may admit them. (Planning the whole batch again, or only
        its deferred rows, cost a pass over the S slots per batch whenever one was left out, twice a plain step's
        planning: prefetch made a step slower.)"""
        none = prefetched.ids[:0]
        self.stats.overflow += int(np.count_nonzero(prefetched.slots < 0))
        return BatchPlan(prefetched.ids, prefetched.slots, none, none, none, none)

    def upcoming(self, ids: Tensor) -> None:
        """Announce the ids of the next batch not yet announced, for a policy that looks ahead (``policy.window``
        batches before each is gathered; batches in order, from the first). A no-op for the other policies."""
        if self.directory.policy.window:
            self.directory.policy.upcoming(ids.detach().to("cpu").numpy())

    # ------------------------------------------------------------------------------------------ updates
    def apply_gradients(self, ids: Tensor, grads: Tensor) -> None:
        """Apply the optimizer to rows ``ids`` (u,) distinct, wherever each row is now, with ``grads`` (u, D)."""
        out = self._outstanding
        same = out is not None and self._gathered[0] is ids and self._gathered[1] == ids._version
        u = out.ids if same else ids.detach().to("cpu").numpy().astype(np.int64, copy=False)
        inside = same or (out is not None and (np.array_equal(u, out.ids) or np.isin(u, out.ids).all()))
        if not inside:
            self._mover.wait()  # a row outside the outstanding batch may be moving
        grads = grads.detach().to(self.device)
        if self._fused is not None:  # host arrays: one compiled read, the update, one compiled write
            if u.size and not inside and (u.min() < 0 or u.max() >= self.num_rows):
                raise ConfigError(f"table {self.name!r}: ids outside its rows 0..{self.num_rows - 1} in "
                                  f"apply_gradients (min {u.min()}, max {u.max()})")
            slot_arrays, table_arrays = self._fused
            views = tuple(np.empty((u.size, a.shape[1]), dtype=a.dtype) for a in slot_arrays)  # (u, w) each
            slot = read_rows(u, self.directory.id_slot, slot_arrays, table_arrays, views)
            rows = {k: torch.from_numpy(v).view(u.size, *self.slots[k].shape[1:]) for k, v in zip(self._keys, views)}
            self._update(rows, grads)  # in place: the views hold the updated rows
            n = write_rows(u, slot, slot_arrays, table_arrays, views, self.dirty)
            self.stats.bytes_to_device += n * self.slot_bytes
            self.stats.bytes_to_host += n * self.slot_bytes
            self.backing.touch(2 * n)
            self._outstanding = None
            return
        slot = self.directory.lookup(u)  # (u,) located now, not at gather time
        cached = slot >= 0
        if cached.all():  # the common case: the batch's rows all in slots
            s = torch.from_numpy(slot).to(self.device)
            rows = {k: a.index_select(0, s) for k, a in self.slots.items()}  # (u, ...)
            self._update(rows, grads)
            for k, a in self.slots.items():
                a.index_copy_(0, s, rows[k])
            self.dirty[slot] = True
            self._outstanding = None
            return
        if cached.any():
            sel = torch.from_numpy(np.flatnonzero(cached)).to(self.device)
            s = torch.from_numpy(slot[cached]).to(self.device)
            rows = {k: a.index_select(0, s) for k, a in self.slots.items()}  # (c, ...)
            self._update(rows, grads.index_select(0, sel))
            for k, a in self.slots.items():
                a.index_copy_(0, s, rows[k])
            self.dirty[slot[cached]] = True
        if not cached.all():
            over = torch.from_numpy(u[~cached])
            sel = torch.from_numpy(np.flatnonzero(~cached)).to(self.device)
            rows = {k: v.to(self.device) for k, v in self.backing.read(over).items()}
            self._update(rows, grads.index_select(0, sel))
            self.backing.write(over, rows)
            self.stats.bytes_to_device += over.numel() * self.slot_bytes
            self.stats.bytes_to_host += over.numel() * self.slot_bytes
        self._outstanding = None

    def _update(self, rows: dict[str, Tensor], grad: Tensor) -> None:
        weight = rows.pop("weight")
        self.optimizer.update(weight, rows, grad)
        rows["weight"] = weight

    # ------------------------------------------------------------------------------------------ moving rows
    def _host_ids(self, uniq: Tensor) -> np.ndarray:
        if uniq.device.type == "cpu" and uniq.dtype == torch.int64:
            u = uniq.detach().numpy()  # the fast path: every call of a step comes here, 26 tables a step
        else:
            u = uniq.detach().to("cpu").numpy().astype(np.int64, copy=False)  # waits for the device
        if u.size and (u[0] < 0 or u[-1] >= self.num_rows):
            bad = u[0] if u[0] < 0 else u[-1]
            raise ConfigError(f"table {self.name!r}: id {bad} outside its rows 0..{self.num_rows - 1}")
        return u

    def _claim(self, plan: BatchPlan) -> np.ndarray:
        """Dirty flags of the plan's victims, taken now (the training thread owns ``dirty``); loaded slots are clean."""
        if not plan.load_ids.size:
            return _NO_VICTIMS
        victim_dirty = self.dirty[plan.evict_slots]
        self.dirty[plan.evict_slots] = False
        self.dirty[plan.load_slots] = False
        n = int(victim_dirty.sum())
        self.stats.written_back += n
        self.stats.bytes_to_host += n * self.slot_bytes
        self.stats.bytes_to_device += plan.load_ids.size * self.slot_bytes
        return victim_dirty

    def _move(self, plan: BatchPlan, victim_dirty: np.ndarray) -> None:
        """Write back the dirty victims, then read the admitted rows into their slots (in this order: a load may
        reuse a victim's slot)."""
        if not plan.load_ids.size:
            return  # a row is only evicted for a load
        if self._host is not None:  # host slots: one compiled copy per array
            self.backing.exchange(self._host, plan.evict_slots[victim_dirty], plan.evict_ids[victim_dirty],
                                  plan.load_ids, plan.load_slots)
            return
        if victim_dirty.any():
            s = torch.from_numpy(plan.evict_slots[victim_dirty]).to(self.device)
            rows = {k: a.index_select(0, s) for k, a in self.slots.items()}
            self.backing.write(torch.from_numpy(plan.evict_ids[victim_dirty]), rows)
        if plan.load_ids.size:
            rows = self.backing.read(torch.from_numpy(plan.load_ids))
            s = torch.from_numpy(plan.load_slots).to(self.device)
            for k, a in self.slots.items():
                a.index_copy_(0, s, rows[k].to(self.device, non_blocking=True))

    def _warm(self) -> None:
        ids, slots = self.directory.warm()
        if ids.size:
            plan = BatchPlan(ids, slots, ids, slots, ids[:0], slots[:0])
            self._move(plan, np.zeros(0, dtype=bool))
            self.stats.bytes_to_device += ids.size * self.slot_bytes

    # ------------------------------------------------------------------------------------------ state
    def flush(self) -> None:
        """Write every dirty slot back (then the backing store is complete) and flush the files."""
        self._mover.wait()
        dirty = np.flatnonzero(self.dirty)
        dirty = dirty[np.argsort(self.directory.slot_id[dirty])]  # in row order: the files are written forwards
        chunk = self.backing.write_chunk  # bounds the host buffer and the file pages mapped at once
        for lo in range(0, dirty.size, chunk):
            s = dirty[lo:lo + chunk]
            st = torch.from_numpy(s).to(self.device)
            self.backing.write(torch.from_numpy(self.directory.slot_id[s]),
                               {k: a.index_select(0, st) for k, a in self.slots.items()})
        self.stats.written_back += dirty.size
        self.stats.bytes_to_host += dirty.size * self.slot_bytes
        self.dirty[:] = False
        self.backing.flush()

    def state_dict(self) -> dict[str, Tensor]:
        """Flush, then every row's weight and state (the backing store's arrays, shared: clone to snapshot)."""
        self.flush()
        return self.backing.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Replace every row and its state; the cache starts over (warm start again, stats kept; a lookahead
        policy forgets the batches announced, so announce again from the next one)."""
        self._mover.wait()
        self._pending = self._outstanding = None
        self.backing.load_state_dict(state)
        self.dirty[:] = False
        self.directory.reset()
        self._warm()

    def close(self) -> None:
        """Flush and release the backing store (its files stay). The store must not be used afterwards."""
        self.flush()
        self._mover.close()
        self._fused = self._host = None  # no views of the backing store's maps are left to keep them mapped
        self.backing.close()
