"""A rank's embedding shards in row stores: the row optimizer fused into them, hot rows optionally cached.

``ShardedEmbeddingCollection(..., stores=ShardStores(...))`` puts every slot and replica of this rank in a
``haloflow.cache`` row store instead of an ``nn.Parameter``::

    slot (table t, rows a..b-1, cols c..d-1)   ->  a store of (b - a) rows x (d - c) columns (row ids local to it)
    data-parallel replica of table t            ->  a store of the whole table, on every rank

    which store   plan gives the slot cache_rows (sharding "cached")  ->  CachedStore of cache_rows slots
                  ShardStores.cache (--cache-ratio R)                 ->  CachedStore of ceil(R x its rows) slots
                  otherwise                                           ->  MemoryStore (the rows whole, on the device)
    per step      forward   a slot's ids -> unique -> store.gather -> sum-pooled        (CachedEmbeddingBag)
                  backward  rows.grad (u, cols): each row's gradient summed over its occurrences
                  sync      replicas: (ids, grads) of every rank summed in rank order (sparse all-gather)
                  step      every store applies its rows' gradients with the row optimizer (SGD, Adagrad,
                            row-wise Adagrad); a torch optimizer sees only the MLPs

Why a sharded run equals the single-process ``StoreTables``: a model-parallel slot looks up the ids of the
*global* batch in global sample order (the input dist delivers sources in rank order, and each rank's slice is
contiguous), so each row's gradient sums the same occurrences in the same order as one process does, and a
store of any cache size updates its rows exactly as an uncached one (``haloflow.cache``). What differs from one
process is float rounding elsewhere: the MLP gradients are summed over ranks, and so are a replica's.

Row-wise Adagrad keeps one accumulator per row, the mean of g^2 over all D columns; a column-wise shard sees
only its own columns, so it cannot keep that accumulator alone, and the combination is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from haloflow.cache import (
    BackingStore,
    CacheConfig,
    CachedStore,
    MemoryStore,
    RowOptimizer,
    RowStore,
    make_optimizer,
)
from haloflow.cache.batched import BatchedTables
from haloflow.cache.batched_cache import DEVICE_POLICIES, CachedTables
from haloflow.errors import ConfigError

__all__ = ["ShardStores", "store_bytes"]


@dataclass(frozen=True, kw_only=True)
class ShardStores:
    """How this rank's shards and replicas live in row stores.

    Args:
        optimizer: the row optimizer of every table (``make_optimizer({"name": "adagrad", "lr": 0.1})``).
        cache: cache every shard and replica with this config (its ``ratio`` applies to each store's own rows;
            ``num_slots`` to each store alike); None: only the plan's cached tables get a cache.
        device: where the stores' device rows (whole tables, or cache slots) live.
        backing_dir: put cached stores' backing rows in memory-mapped folders under it (one per store, made
            afresh), for tables larger than host memory; None: in host memory.
        histograms: the count of every row of every table in the data (one int64 (rows,) array a table), which
            the "frequency" policy ranks rows by (Colossal-AI's); a store gets the slice of its own rows.
        dtype: floating type of uncached rows (float64 for parity checks); a cache holds float32 rows.
    """

    optimizer: RowOptimizer
    cache: CacheConfig | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backing_dir: Path | None = None
    histograms: tuple[np.ndarray, ...] | None = None
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "optimizer", make_optimizer(self.optimizer))
        object.__setattr__(self, "device", torch.device(self.device))
        if self.backing_dir is not None:
            object.__setattr__(self, "backing_dir", Path(self.backing_dir))

    def batches(self, slots) -> bool:
        """Whether ``slots`` go into one ``BatchedTables`` or ``CachedTables`` (one lookup and update for all):
        one width, no slot cached by the plan, and a cache (``--cache-ratio``) in host memory with a policy the
        device directory runs (LRU, LFU, frequency)."""
        if not slots or len({s.num_cols for s in slots}) != 1 or any(s.cache_rows is not None for s in slots):
            return False
        return self.cache is None or (self.backing_dir is None and self.cache.policy in DEVICE_POLICIES)

    def make_batch(self, slots, init, names) -> BatchedTables:
        """One ``BatchedTables`` of ``slots`` (``init(i)``: slot i's initial rows), on ``device`` in ``dtype``;
        with ``cache``, a ``CachedTables`` of as many slots as the slots' own caches would have together."""
        sizes, dim = [s.num_rows for s in slots], slots[0].num_cols
        if self.cache is None:
            return BatchedTables(sizes, dim, self.optimizer, init=init, device=self.device, dtype=self.dtype,
                                 names=names)
        if self.dtype != torch.float32:
            raise ConfigError(f"a cache holds float32 rows, but dtype {self.dtype} was asked for", field="dtype")
        num_slots = sum(min(self.cache.slots_for(n), n) for n in sizes)
        row_bytes = 4 * (dim + sum(int(np.prod(shape)) if shape else 1
                                   for shape, _ in self.optimizer.state_spec(dim).values()))
        if self.cache.max_bytes is not None and num_slots * row_bytes > self.cache.max_bytes:
            raise ConfigError(f"{num_slots} cache slots x {row_bytes} bytes (row + optimizer state) = "
                              f"{num_slots * row_bytes} bytes, over max_bytes {self.cache.max_bytes}", field="max_bytes")
        histogram = None
        if self.histograms is not None:
            histogram = np.concatenate([self.histograms[s.table][s.row_offset:s.row_offset + s.num_rows]
                                        for s in slots])
        return CachedTables(sizes, dim, self.optimizer, num_slots=num_slots, init=init, device=self.device,
                            names=names, policy=self.cache.policy, admit_all=self.cache.admit_all,
                            histogram=histogram, window=self.cache.window)

    def make(self, name: str, weight: Tensor, *, cache_rows: int | None = None, table: int | None = None,
             rows: tuple[int, int] | None = None) -> RowStore:
        """A store holding ``weight`` (rows, cols) under ``name``: cached with ``cache_rows`` slots when given
        (a plan's cached table), else as ``cache`` says, else whole on the device. ``table`` and ``rows`` (its
        first and last + 1 row in the table) say which rows it holds, for the "frequency" policy's histogram."""
        n, d = (int(x) for x in weight.shape)
        if cache_rows is None and self.cache is None:
            return MemoryStore(weight.to(self.device, self.dtype), self.optimizer, name=name)
        if self.dtype != torch.float32:
            raise ConfigError(f"table {name!r}: a cache holds float32 rows, but dtype {self.dtype} was asked for",
                              field="dtype")
        slots = int(cache_rows) if cache_rows is not None else self.cache.slots_for(n)
        if not 1 <= slots <= n:
            raise ConfigError(f"table {name!r}: {slots} cache slots for a shard of {n} rows; expected 1..{n}",
                              field="cache_rows")
        if self.backing_dir is None:
            backing = BackingStore.in_memory(n, d, self.optimizer, weight=weight, name=name, copy=False)
        else:
            backing = BackingStore.create(self.backing_dir / name, n, d, self.optimizer, weight=weight, name=name,
                                          overwrite=True)
        config = (CacheConfig(num_slots=slots) if self.cache is None
                  else replace(self.cache, num_slots=slots, ratio=None))  # this store's own size, the rest as asked
        histogram = None
        if self.histograms is not None and table is not None:
            lo, hi = rows if rows is not None else (0, n)
            histogram = self.histograms[table][lo:hi]
        return CachedStore.from_config(backing, config, device=self.device, histogram=histogram, name=name)


def store_bytes(store: RowStore) -> tuple[int, int]:
    """(device bytes, host bytes) a store holds: rows and optimizer state; for a cache, its slots on the device,
    and the backing rows, the row <-> slot maps and the policy's per-row state on the host."""
    if isinstance(store, CachedStore):
        device = sum(a.numel() * a.element_size() for a in store.slots.values())
        host = sum(a.numel() * a.element_size() for a in store.backing.arrays.values()) + store.directory.nbytes
        return device, host
    return sum(a.numel() * a.element_size() for a in store.state_dict().values()), 0
