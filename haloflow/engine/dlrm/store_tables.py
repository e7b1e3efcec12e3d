"""DLRM's embedding tables over row stores: every row and its optimizer state in a ``haloflow.cache`` store.

Put in place of ``DLRM.embeddings`` (the model's forward is unchanged)::

    table t  ->  CachedEmbeddingBag(store_t)        store_t = MemoryStore (the whole table on the device), or
                                                              CachedStore (S_t hot rows on the device over a
                                                              BackingStore in host memory)
    forward(sparse)   per table: unique ids -> store.gather -> pooled (B, D); stacked (B, T, D)
    step()            after backward: each store applies its rows' gradients with the row optimizer
    prefetch(sparse)  the next batch's rows start moving while this batch computes

The optimizer of the tables is fused into the stores (SGD, Adagrad, row-wise Adagrad), so a torch optimizer
sees only the MLPs. Initial rows are ``keyed_uniform_rows`` - the values ``EmbeddingTables`` starts from - so a
cached run and an uncached one start, and (the stores being exact) stay, identical.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from haloflow.cache import BackingStore, CacheConfig, CachedEmbeddingBag, CachedStore, CacheStats, MemoryStore
from haloflow.cache.types import RowOptimizer
from haloflow.data.jagged import JaggedBatch
from haloflow.errors import ConfigError
from haloflow.models.dlrm import CompletedHandle, DLRMConfig
from haloflow.kernels.keyed_uniform import keyed_uniform_rows

__all__ = ["StoreTables"]


class StoreTables(nn.Module):
    """One sum-pooled bag per sparse feature over a row store. Build with ``StoreTables.build``.

    Shapes:
        sparse JaggedBatch lengths (T, B) -> pooled (B, T, D)
    """

    def __init__(self, bags: list[CachedEmbeddingBag]):
        super().__init__()
        self.bags = nn.ModuleList(bags)
        self._prefetched: tuple[JaggedBatch, tuple[Tensor, ...]] | None = None  # the last prefetch's batch, split

    @classmethod
    def build(cls, config: DLRMConfig, optimizer: RowOptimizer, *, cache: CacheConfig | None = None,
              device="cpu") -> StoreTables:
        """Tables of ``config`` (initialised as ``DLRM(config)``'s) over ``MemoryStore`` (``cache=None``) or over
        a ``CachedStore`` per table in front of host memory."""
        bags = []
        for t, n in enumerate(config.table_sizes):
            weight = keyed_uniform_rows(config.seed, t, n, (0, n), (0, config.embedding_dim))
            if cache is None:
                store = MemoryStore(weight.to(device), optimizer, name=f"t{t}")
            else:
                backing = BackingStore.in_memory(n, config.embedding_dim, optimizer, weight=weight, name=f"t{t}")
                store = CachedStore.from_config(backing, cache, device=device)
            bags.append(CachedEmbeddingBag(store, include_last_offset=True))
        return cls(bags)

    def forward(self, sparse: JaggedBatch) -> Tensor:
        T = sparse.lengths.shape[0]
        if T != len(self.bags):
            raise ConfigError(f"sparse batch has {T} features but the model has {len(self.bags)} tables")
        prefetched, self._prefetched = self._prefetched, None
        # The prefetched batch's own id tensors: each bag knows them by identity and reuses their unique ids
        per_table = prefetched[1] if prefetched is not None and prefetched[0] is sparse else self._split(sparse)
        offsets = sparse.bag_offsets().unbind(0)  # T x (B+1,)
        return torch.stack([bag(ids, off) for bag, ids, off in zip(self.bags, per_table, offsets)], dim=1)

    def start(self, sparse: JaggedBatch) -> CompletedHandle:
        return CompletedHandle(self(sparse))

    def prefetch(self, sparse: JaggedBatch) -> None:
        """Start moving the rows of ``sparse`` (the next batch) in; its forward then reuses this split and each
        table's unique ids (one ``torch.unique`` per table and batch, not two)."""
        per_table = self._split(sparse)
        self._prefetched = sparse, per_table
        for bag, ids in zip(self.bags, per_table):
            bag.prefetch(ids)

    @staticmethod
    def _split(sparse: JaggedBatch) -> tuple[Tensor, ...]:
        return sparse.values.split(sparse.lengths.sum(1).tolist())  # T x (nnz_t,)

    def step(self) -> None:
        """Apply the last backward's row gradients in every store (after ``loss.backward()``)."""
        for bag in self.bags:
            bag.step()

    def cache_stats(self) -> CacheStats:
        """Hits, misses and bytes of every cached table, summed (all zero without a cache)."""
        total = CacheStats()
        for bag in self.bags:
            stats = getattr(bag.store, "stats", None)
            if stats is not None:
                total = total + stats
        return total

    def rectangles(self, replicas: bool = True) -> list:
        """``(table, rows, cols, store)`` of every table, whole (what checkpoints save and load)."""
        return [(t, (0, b.store.num_rows), (0, b.store.dim), b.store) for t, b in enumerate(self.bags)]

    def state_dict_rows(self) -> list[dict[str, Tensor]]:
        """Every table's weights and optimizer state (cached rows flushed first)."""
        return [bag.store.state_dict() for bag in self.bags]
