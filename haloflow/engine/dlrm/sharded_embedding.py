"""``ShardedEmbeddingCollection``: the embedding tables of a DLRM split over ranks by a ``ShardingPlan``.

Each rank holds only its own shards (and full replicas of data-parallel tables) and is fed only its slice of
the global batch. One lookup is ``input dist -> local lookups -> output dist``::

    start(sparse)                                           rank r, local batch B_r (T features)
      ids of table-/column-/row-wise tables --all-to-all (lengths, then values)--> shard holders
      data-parallel tables: local lookup of the replica     (while the lengths are in flight)
      holders: one EmbeddingBag per slot over all B_global samples
      pooled all-to-all (table-/column-wise) and reduce-scatter (row-wise) started  -> handle
    [caller runs the bottom MLP]
    handle.wait()                                           -> pooled (B_r, T, D), in table order

Backward runs the reverse exchanges (see ``embedding_dist``); the shard weights get sparse gradients, which
plain ``torch.optim.SGD`` applies to the local rows. Data-parallel replicas need ``sync_grads()`` after
backward: it sums their gradients over the ranks (sparse and coalesced, or dense), so every replica applies
the same update. With ``stores=ShardStores(...)`` every shard and replica lives in a row store instead (the
optimizer fused, hot rows optionally cached; see ``shard_stores``): then ``step()`` after ``sync_grads()``
applies the updates, and no torch optimizer sees the tables.

Shapes:
    sparse JaggedBatch lengths (T, B_r) -> pooled (B_r, T, D)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from haloflow.cache import CachedEmbeddingBag, CacheStats
from haloflow.cache.batched import BatchedTables
from haloflow.cache.batched_cache import CachedTables
from haloflow.data.jagged import JaggedBatch
from haloflow.engine.comm import CommStats, Group, group_rank, group_size
from haloflow.engine.dlrm.embedding_dist import (
    PooledExchangeHandle,
    jagged_all_to_all,
    pooled_exchange,
    sparse_grad_all_reduce,
)
from haloflow.engine.dlrm.embedding_layout import RW, EmbeddingLayout, Slot
from haloflow.engine.dlrm.shard_stores import ShardStores, store_bytes
from haloflow.errors import ConfigError, PlanError
from haloflow.kernels.sgd_bags import fused_sgd_bag
from haloflow.kernels.keyed_uniform import keyed_uniform_rows
from haloflow.partition.planner.types import ShardingPlan, ShardingType, Storage

__all__ = ["ShardedEmbeddingCollection", "ShardedPooledHandle"]


class CompletedHandle:
    """A lookup that needed no exchange; ``wait()`` returns its pooled (B_r, T, D)."""

    def __init__(self, value: Tensor):
        self._value = value

    def wait(self) -> Tensor:
        return self._value


class LookupIds(NamedTuple):
    """The bags a rank's tables look up for one batch, as its exchange delivers them (``ahead_ids``)."""

    lengths: Tensor  # (n * B_global,) blocks (n, B_s) per source rank, in rank order
    values: Tensor  # (nnz,) their ids
    sizes: list[int]  # every rank's B_s


class ShardedPooledHandle:
    """The output dist in flight; ``wait()`` returns pooled (B_r, T, D) in table order."""

    def __init__(self, dp: Tensor, pooled: PooledExchangeHandle | None, rw: PooledExchangeHandle | None,
                 order: Tensor, dim: int):
        self._dp, self._pooled, self._rw, self._order, self._dim = dp, pooled, rw, order, dim

    def wait(self) -> Tensor:
        parts = [self._dp]  # (B_r, n_dp * D)
        if self._pooled is not None:
            parts.append(self._pooled.wait())  # (B_r, n_pooled * D)
        if self._rw is not None:
            parts.append(self._rw.wait())  # (B_r, n_rw * D)
        parts = [p for p in parts if p.shape[1]] or parts[:1]
        grouped = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        B = grouped.shape[0]
        if self._order is None:  # the groups are in table order already (every table table-wise, say)
            return grouped.view(B, -1, self._dim)  # (B_r, T, D)
        return grouped.view(B, -1, self._dim).index_select(1, self._order)  # (B_r, T, D)


class ShardedEmbeddingCollection(nn.Module):
    """This rank's part of the tables of a plan. Build with ``from_plan`` (each shard initialised alone, from
    (seed, table, row, column): no rank ever holds a table it does not own), or ``from_weights`` /
    ``from_tables`` (copied out of whole tables every rank holds; for tests against a given model).

    Args:
        layout: the plan laid out (``EmbeddingLayout.from_plan``).
        init: ``init(table, (row_lo, row_hi), (col_lo, col_hi)) -> (rows, cols)`` float tensor: the initial
            values of that rectangle of a table; called once per shard and per replica of this rank.
        group: the process group of the plan's ranks (None: one process, world size 1).
        dp_grad: how data-parallel gradients are summed: "sparse" (exchange the touched rows, coalesce) or
            "dense" (all-reduce the whole table's gradient; cheaper for tiny, hot tables).
        stats: where the collectives count their bytes (a fresh ``CommStats`` by default).
        stores: keep every slot and replica in a row store with the optimizer fused (``ShardStores``; needed
            for Adagrad, row-wise Adagrad, caches and the plan's cached tables); None: ``nn.Parameter`` s with
            sparse gradients for a torch optimizer. See ``shard_stores``.
        fused_sgd_lr: with parameters, SGD at this rate fused into the backward of this rank's shards (its owned
            rows: ``models.dlrm.fused_sgd_bag``, the same floats as SGD on their sparse gradients); the
            data-parallel replicas keep sparse gradients, which ``sync_grads`` sums over the ranks.
        k_invariant: the replicas' gradients summed as one process sums them, whatever K: every rank sends its
            gradient rows uncoalesced (one per id it looked up, not one per distinct row: more bytes) and every
            rank coalesces all of them in rank order, which is the global sample order.
    """

    def __init__(self, layout: EmbeddingLayout, init: Callable[[int, tuple[int, int], tuple[int, int]], Tensor], *,
                 group: Group | None, dp_grad: str = "sparse", stats: CommStats | None = None,
                 stores: ShardStores | None = None, fused_sgd_lr: float | None = None, k_invariant: bool = False):
        super().__init__()
        self.k_invariant = k_invariant
        if fused_sgd_lr is not None and (stores is not None or not fused_sgd_lr > 0):
            raise ConfigError(f"fused_sgd_lr {fused_sgd_lr}: expected a learning rate > 0, and parameters, not "
                              "row stores (which fuse their own optimizer)")
        self.fused_sgd_lr = fused_sgd_lr
        K, rank = group_size(group), group_rank(group)
        if layout.world_size != K:
            raise PlanError(f"plan is for {layout.world_size} ranks but the process group has {K}")
        if dp_grad not in ("sparse", "dense"):
            raise ConfigError(f"dp_grad must be 'sparse' or 'dense', got {dp_grad!r}")
        self.layout, self.group, self.rank, self.dp_grad = layout, group, rank, dp_grad
        self.stats = stats if stats is not None else CommStats()
        self.slots: tuple[Slot, ...] = layout.slots[rank]
        self.stores = stores
        D = layout.dim
        self._check_stores(layout, stores)

        def rect(s: Slot) -> Tensor:
            return init(s.table, (s.row_offset, s.row_offset + s.num_rows), (s.col_offset, s.col_offset + s.num_cols))

        # Either parameters (a torch optimizer steps them) or row stores (``step()`` does), never both; row stores
        # of uncached shards of one width are one ``BatchedTables`` (``_batch``), else one store per shard.
        self._batch: BatchedTables | None = None
        self._bag_slots: dict[tuple[int, ...], Tensor] = {}  # every received bag's slot, per batch sizes
        self.check_ids = True  # ids checked against their tables in ``start`` (a caller that checked them first
        # on the host sets False: the check reads a device value)
        self.replicas, self.shards = nn.ParameterList(), nn.ParameterList()
        self.replica_bags, self.shard_bags = nn.ModuleList(), nn.ModuleList()
        if stores is None:
            self.replicas.extend(nn.Parameter(init(t, (0, layout.table_rows[t]), (0, D))) for t in layout.dp_tables)
            self.shards.extend(nn.Parameter(rect(s)) for s in self.slots)
        else:
            # One store at a time: each initial rectangle is freed once its store holds it.
            for t in layout.dp_tables:
                store = stores.make(f"t{t}", init(t, (0, layout.table_rows[t]), (0, D)), table=t,
                                    rows=(0, layout.table_rows[t]))
                self.replica_bags.append(CachedEmbeddingBag(store, include_last_offset=True,
                                                            per_occurrence=k_invariant))
            if stores.batches(self.slots):  # every shard uncached, one width: one lookup and update for all
                self._batch = stores.make_batch(self.slots, lambda i: rect(self.slots[i]),
                                                [_slot_name(s) for s in self.slots])
            else:
                for s in self.slots:
                    store = stores.make(_slot_name(s), rect(s), cache_rows=s.cache_rows, table=s.table,
                                        rows=(s.row_offset, s.row_offset + s.num_rows))
                    self.shard_bags.append(CachedEmbeddingBag(store, include_last_offset=True))
        self._replica_grads: list[tuple[Tensor, Tensor]] = []  # summed (ids, grads) of the replicas, for step()
        self._pooled_w, self._rw_w = layout.widths(rw=False), layout.widths(rw=True)
        self.batch_sizes: Sequence[int] | None = None  # every rank's B_r for the next lookup (None: ask them)
        # Index tensors as buffers on the weights' device, so that ``.to(device)`` moves them with the weights.
        dev = stores.device if stores is not None else next(iter([*self.replicas, *self.shards]), torch.empty(0)).device
        self.register_buffer("_order", layout.output_order().to(dev), persistent=False)
        self._order_is_identity = torch.equal(self._order.cpu(), torch.arange(layout.num_tables))
        self.register_buffer("_pooled_cols", layout.columns(rw=False).to(dev), persistent=False)
        self.register_buffer("_rw_cols", layout.columns(rw=True).to(dev), persistent=False)
        self.register_buffer("_rows", torch.tensor(layout.table_rows, dtype=torch.int64, device=dev),
                             persistent=False)
        self.register_buffer("_pooled_slots", torch.tensor([i for i, s in enumerate(self.slots) if s.sharding is not RW],
                                                           dtype=torch.int64, device=dev), persistent=False)
        self.register_buffer("_rw_slots", torch.tensor([i for i, s in enumerate(self.slots) if s.sharding is RW],
                                                       dtype=torch.int64, device=dev), persistent=False)
        self._local_in_order = (self._batch is not None and K == 1 and not layout.dp_tables
                                and [s.table for s in self.slots] == list(range(layout.num_tables))
                                and all(s.sharding is not RW for s in self.slots))
        self._can_prefetch = (isinstance(self._batch, CachedTables) and not layout.dp_tables
                              and all(s.sharding is not RW for s in self.slots))  # fixed once built
        for t in layout.rw_tables:
            self.register_buffer(f"_bounds{t}", torch.tensor(layout.row_bounds(t), dtype=torch.int64, device=dev),
                                 persistent=False)

    @staticmethod
    def _check_stores(layout: EmbeddingLayout, stores: ShardStores | None) -> None:
        cached = [s.table for slots in layout.slots for s in slots if s.cache_rows is not None]
        if cached and stores is None:
            raise ConfigError(f"the plan caches table t{cached[0]}: its shard needs a row store (stores=ShardStores"
                              "(...)); a parameter cannot be cached", field="stores")
        if stores is not None and stores.optimizer.name == "rowwise_adagrad":
            cw = [t for t, k in enumerate(layout.shardings) if k is ShardingType.COLUMN_WISE]
            if cw:
                raise ConfigError(f"table t{cw[0]} is column-wise, which row-wise Adagrad cannot train exactly: its "
                                  "accumulator is the mean of g^2 over all columns of a row, and a column-wise shard "
                                  "holds only some of them; use --optimizer adagrad or another sharding for it",
                                  field="optimizer")

    @classmethod
    def from_plan(cls, plan: ShardingPlan, table_sizes: Sequence[int], dim: int, *, seed: int,
                  group: Group | None, **kwargs) -> ShardedEmbeddingCollection:
        """Build this rank's shards and replicas alone, with ``EmbeddingTables``' values for ``seed``."""
        layout = EmbeddingLayout.from_plan(plan, list(table_sizes), dim, ranks=group_size(group))

        def init(t: int, rows: tuple[int, int], cols: tuple[int, int]) -> Tensor:
            return keyed_uniform_rows(seed, t, layout.table_rows[t], rows, cols)

        return cls(layout, init, group=group, **kwargs)

    @classmethod
    def from_weights(cls, plan: ShardingPlan, weights: Sequence[Tensor], *, group: Group | None,
                     **kwargs) -> ShardedEmbeddingCollection:
        """Copy this rank's rectangles out of whole tables (identical on every rank)."""
        dim = int(weights[0].shape[1])
        layout = EmbeddingLayout.from_plan(plan, [int(w.shape[0]) for w in weights], dim, ranks=group_size(group))
        for t, w in enumerate(weights):
            if tuple(w.shape) != (layout.table_rows[t], dim):
                raise ConfigError(f"table {t}: weight of shape {tuple(w.shape)}, expected ({layout.table_rows[t]}, {dim})")

        def init(t: int, rows: tuple[int, int], cols: tuple[int, int]) -> Tensor:
            return weights[t].detach()[rows[0]:rows[1], cols[0]:cols[1]].clone()

        return cls(layout, init, group=group, **kwargs)

    def slot_stores(self) -> list:
        """The row store of every slot of this rank, in slot order (row stores only)."""
        if self._batch is not None:
            return [self._batch.table(i) for i in range(len(self.slots))]
        return [bag.store for bag in self.shard_bags]

    def rectangles(self, replicas: bool) -> list[tuple[int, tuple[int, int], tuple[int, int], object]]:
        """``(table, rows, cols, holder)`` of every rectangle this rank holds (with ``replicas``, its data-parallel
        replicas too: every rank loads them, rank 0 alone saves them); ``holder`` is an ``nn.Parameter`` or a
        row store. What checkpoints save and load (``engine/dlrm/checkpoint.py``)."""
        L = self.layout
        holders = self.slot_stores() if self.stores is not None else list(self.shards)
        out = [(s.table, (s.row_offset, s.row_offset + s.num_rows), (s.col_offset, s.col_offset + s.num_cols), h)
               for s, h in zip(self.slots, holders)]
        if replicas:
            reps = [b.store for b in self.replica_bags] if self.stores is not None else list(self.replicas)
            out += [(t, (0, L.table_rows[t]), (0, L.dim), h) for t, h in zip(L.dp_tables, reps)]
        return out

    def storage(self) -> Storage:
        """Bytes of this rank's embedding storage, on the device and in host memory: the rows of its shards and
        replicas, and with row stores their optimizer state and cache slots (a cache's rows counted twice: in
        its device slots and in its backing store). Parameters' optimizer state lives in the torch optimizer
        and is not counted."""
        if self.stores is None:
            return Storage(device=sum(p.numel() * p.element_size() for p in [*self.replicas, *self.shards]))
        device = self._batch.nbytes if self._batch is not None else 0
        host = (sum(a.numel() * a.element_size() for a in self._batch.backing.values())
                if isinstance(self._batch, CachedTables) else 0)
        for bag in [*self.replica_bags, *self.shard_bags]:
            d, h = store_bytes(bag.store)
            device, host = device + d, host + h
        return Storage(device=device, host=host)

    def storage_bytes(self) -> int:
        """All bytes of ``storage()``, device and host."""
        m = self.storage()
        return int(m.device + m.host)

    @classmethod
    def from_tables(cls, tables: nn.Module, plan: ShardingPlan, *, group: Group | None,
                    **kwargs) -> ShardedEmbeddingCollection:
        """From a single-device ``EmbeddingTables`` (its ``tables`` of ``nn.EmbeddingBag``)."""
        return cls.from_weights(plan, [bag.weight for bag in tables.tables], group=group, **kwargs)

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, sparse: JaggedBatch, batch_sizes: Sequence[int] | None = None) -> Tensor:
        return self.start(sparse, batch_sizes).wait()

    def start(self, sparse: JaggedBatch, batch_sizes: Sequence[int] | None = None
              ) -> ShardedPooledHandle | CompletedHandle:
        """Start a lookup of this rank's slice of the global batch; see the module docstring.

        Args:
            sparse: the local samples, lengths (T, B_r).
            batch_sizes: B_p of every rank (known to a training loop that split the global batch); None asks
                the peers (a small all-gather that waits for every rank).
        """
        L = self.layout
        if sparse.num_features != L.num_tables:
            raise ConfigError(f"sparse batch has {sparse.num_features} features but the plan has {L.num_tables} tables")
        sizes = self._batch_sizes(sparse.batch_size, batch_sizes if batch_sizes is not None else self.batch_sizes)
        if self.check_ids:
            self._check_ids(sparse)
        if self._local_in_order:  # one rank, every table once, in order: the batch is its own input and output dist
            return CompletedHandle(self._batch_lookup(sparse.lengths.reshape(-1), sparse.values, sizes))  # (B, T, D)
        feats = self._split(sparse)  # T x (lengths (B_r,), ids)
        handle = None
        if any(L.slots):
            lengths, values = self._route(feats, sparse.batch_size)
            recv_len = [len(L.slots[self.rank]) * b for b in sizes]
            handle = jagged_all_to_all(lengths, values, recv_len, group=self.group, stats=self.stats)
        dp = self._dp_lookup(feats, sparse.batch_size)  # while the lengths are in flight
        pooled = rw = None
        if handle is not None:
            received = handle.wait()
            if self._batch is not None:  # (B_global, n, cols): every slot's bags at once
                grouped = self._batch_lookup(received.lengths, received.values, sizes)
                if L.pooled_tables:
                    pooled = self._exchange(grouped.index_select(1, self._pooled_slots), sizes, rw=False)
                if L.rw_tables:
                    rw = self._exchange(grouped.index_select(1, self._rw_slots), sizes, rw=True)
            else:
                outputs = self._shard_lookup(received, sizes)  # per slot (B_global, cols)
                if L.pooled_tables:
                    pooled = self._exchange([o for o, s in zip(outputs, self.slots) if s.sharding is not RW],
                                            sizes, rw=False)
                if L.rw_tables:
                    rw = self._exchange([o for o, s in zip(outputs, self.slots) if s.sharding is RW], sizes,
                                        rw=True)
        return ShardedPooledHandle(dp, pooled, rw, None if self._order_is_identity else self._order, L.dim)

    @property
    def can_prefetch(self) -> bool:
        """Whether ``prefetch`` does anything: cached tables, and every shard of this rank table- or column-wise
        with no replicas, so that the ids it will look up for a batch can be told from the global batch alone."""
        return self._can_prefetch

    def ahead_ids(self, sparse: JaggedBatch, sizes: Sequence[int] | None = None) -> LookupIds:
        """What this rank's tables will look up for a batch, told before its exchange: the bags' lengths and ids
        as the exchange delivers them (blocks (n, B_s) per source rank s, in rank order).

        ``sparse``: the global batch (every rank's samples, lengths (T, B)), ``sizes`` every rank's B_s; one
        process that looks every table up in order needs only its own batch (it is the global one). Where the
        ids cannot be told this way (``can_prefetch`` False) a ``ConfigError``."""
        if not self.can_prefetch:
            raise ConfigError("this rank's tables cannot be planned ahead: they are not cached, or a shard is "
                              "row-wise or replicated (its ids are known only after the exchange)")
        sizes = [sparse.batch_size] if sizes is None else [int(b) for b in sizes]
        if len(sizes) != self.layout.world_size or sum(sizes) != sparse.batch_size:
            raise ConfigError(f"ahead_ids: batch sizes {sizes} for a global batch of {sparse.batch_size} samples and "
                              f"{self.layout.world_size} ranks; expected one size per rank, summing to the batch")
        dev = self._rows.device
        if self._local_in_order:
            return LookupIds(sparse.lengths.reshape(-1).to(dev), sparse.values.to(dev), sizes)
        lengths = sparse.lengths.cpu()  # (T, B) on the host: the cuts are host numbers
        values = sparse.values.cpu()
        offsets = sparse.feature_offsets().tolist()
        cuts = np.cumsum([0, *sizes])
        lens, vals = [], []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            for slot in self.slots:  # each source's block: its samples' bags of every slot of this rank
                row = lengths[slot.table]
                start = offsets[slot.table] + int(row[:lo].sum())
                lens.append(row[lo:hi])
                vals.append(values[start:start + int(row[lo:hi].sum())])
        empty = torch.empty(0, dtype=torch.int64)
        return LookupIds(torch.cat(lens or [empty]).to(dev), torch.cat(vals or [empty]).to(dev), sizes)

    def _lookup_ids(self, upcoming: LookupIds | JaggedBatch) -> LookupIds:
        return upcoming if isinstance(upcoming, LookupIds) else self.ahead_ids(upcoming)

    def prefetch(self, upcoming: LookupIds | JaggedBatch, *, background: bool = False) -> bool:
        """Plan the next batch's cache moves and carry them out now (``background``: in a thread) so that its
        lookup finds its rows on the device. ``upcoming``: its ``ahead_ids`` (a ``JaggedBatch``: one process's
        own batch). Returns whether it was planned (cached tables that ``can_prefetch``; else a no-op)."""
        if not self.can_prefetch:
            return False
        ids = self._lookup_ids(upcoming)
        self._batch.prefetch(ids.values, ids.lengths, self._slots_of_bags(ids.sizes), background=background)
        return True

    def planned_ahead(self) -> dict[str, int]:
        """This rank's cache's training plans so far, and how many of them were prefetched and announced."""
        if isinstance(self._batch, CachedTables):
            return dict(self._batch.ahead)
        return {"plans": 0, "prefetched": 0, "announced": 0}

    @property
    def looks_ahead(self) -> bool:
        """Whether ``announce`` does anything: ``prefetch`` does, and the cache's policy is lookahead."""
        return self.can_prefetch and self._batch.policy == "lookahead"

    def announce(self, upcoming: LookupIds | JaggedBatch) -> None:
        """Tell a lookahead cache the rows of a batch to come (``CachedTables.announce``: in training order, from
        the next batch looked up, at most its window + 1 ahead); ``upcoming`` as ``prefetch``'s. A no-op
        without a lookahead cache."""
        if self.looks_ahead:
            ids = self._lookup_ids(upcoming)
            self._batch.announce(ids.values, ids.lengths, self._slots_of_bags(ids.sizes))

    def announce_through(self, batches: Sequence[JaggedBatch], told: int, step: int) -> int:
        """Announce ``batches[told:]`` as far as the window reaches from ``batches[step]``, the batch about to
        train (its index + window + 1), as the trainer announces the batches it reads ahead. Returns how many of
        ``batches`` are announced now (``told`` without a lookahead cache)."""
        if not self.looks_ahead:
            return told
        last = min(step + self._batch.window + 1, len(batches) - 1)
        for b in batches[told:last + 1]:
            self.announce(b)
        return max(told, last + 1)

    def _batch_sizes(self, local: int, given: Sequence[int] | None) -> list[int]:
        K = self.layout.world_size
        if given is not None:
            sizes = [int(b) for b in given]
            if len(sizes) != K or sizes[self.rank] != local:
                raise ConfigError(f"batch_sizes {sizes} must have {K} entries with entry {self.rank} = {local} "
                                  "(this rank's batch size)")
            return sizes
        if self.group is None:
            return [local]
        dev = self._rows.device
        out = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(K)]
        dist.all_gather(out, torch.tensor([local], dtype=torch.int64, device=dev), group=self.group)  # a sync
        self.stats.record("batch_sizes", 8 * (K - 1))
        return [int(x) for x in out]

    def _check_ids(self, sparse: JaggedBatch) -> None:
        """Every id must name a row of its table (a remote rank could not say which): one pass over nnz, and a
        device value read (a sync on an accelerator; a trainer that checked its batch on the host skips it)."""
        bounds = sparse.feature_offsets()  # (T+1,)
        ids = sparse.values
        limit = torch.repeat_interleave(self._rows, bounds.diff(), output_size=ids.numel())  # (nnz,)
        bad = (ids < 0) | (ids >= limit)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            t = bisect.bisect_right(bounds.tolist(), i) - 1
            raise ConfigError(f"sparse feature {t}: id {int(ids[i])} outside table {t}'s rows 0..{int(self._rows[t]) - 1}")

    def _split(self, sparse: JaggedBatch) -> list[tuple[Tensor, Tensor]]:
        b = sparse.feature_offsets().tolist()  # T+1 numbers (a device sync on an accelerator)
        return [(sparse.lengths[t], sparse.values[b[t]:b[t + 1]]) for t in range(sparse.num_features)]

    def _slots_of_bags(self, sizes: list[int]) -> Tensor:
        """The slot of every received bag (blocks (n, B_s) per source): known from the sizes alone, kept (two
        sizes a run at most: full batches and the last)."""
        key = tuple(sizes)
        slots = self._bag_slots.get(key)
        if slots is None:
            per = torch.arange(len(self.slots), device=self._rows.device)
            slots = torch.cat([per.repeat_interleave(b) for b in sizes])
            self._bag_slots[key] = slots
        return slots

    def _batch_lookup(self, lengths: Tensor, values: Tensor, sizes: list[int]) -> Tensor:
        """Every received bag in one lookup of ``_batch``: lengths (n * B_global,) in blocks (n, B_s) per source,
        in rank order, and their ids -> (B_global, n, cols), samples in global order."""
        n = len(self.slots)
        pooled = self._batch.lookup(values, lengths, self._slots_of_bags(sizes),
                                    train=self.training and torch.is_grad_enabled())
        if len(sizes) == 1:
            return pooled.view(n, sizes[0], -1).transpose(0, 1)  # (B, n, cols)
        return torch.cat([blk.view(n, b, -1).transpose(0, 1) for blk, b in zip(pooled.split([n * b for b in sizes]),
                                                                             sizes)])  # (B_global, n, cols)

    def _route(self, feats: list[tuple[Tensor, Tensor]], B: int) -> tuple[list[Tensor], list[Tensor]]:
        """Per destination rank: lengths (n_d, B) and values of its slots (row-wise ids bucketised)."""
        buckets: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}
        for t in self.layout.rw_tables:
            lens, ids = feats[t]
            bounds = getattr(self, f"_bounds{t}")  # (S+1,)
            S = bounds.numel() - 1
            shard = torch.bucketize(ids, bounds[1:-1], right=True)  # (nnz_t,) shard position of every id
            sample = torch.repeat_interleave(torch.arange(B, device=ids.device), lens)  # (nnz_t,)
            counts = torch.bincount(shard * B + sample, minlength=S * B).view(S, B)  # (S, B)
            order = torch.argsort(shard, stable=True)  # keeps sample order and in-bag order per shard
            local = ids[order] - bounds[shard[order]]  # row inside the shard
            for j, chunk in enumerate(local.split(counts.sum(1).tolist())):
                buckets[(t, bounds[j].item())] = (counts[j], chunk)
        lengths, values = [], []
        for slots in self.layout.slots:
            ls, vs = [], []
            for s in slots:
                l_, v_ = buckets[(s.table, s.row_offset)] if s.sharding is RW else feats[s.table]
                ls.append(l_)
                vs.append(v_)
            dev = self._rows.device
            lengths.append(torch.stack(ls) if ls else torch.empty(0, B, dtype=torch.int64, device=dev))  # (n_d, B)
            values.append(torch.cat(vs) if vs else torch.empty(0, dtype=torch.int64, device=dev))
        return lengths, values

    def _dp_lookup(self, feats: list[tuple[Tensor, Tensor]], B: int) -> Tensor:
        if self.stores is None:
            out = [_bag(feats[t][1], feats[t][0], w) for t, w in zip(self.layout.dp_tables, self.replicas)]
        else:
            out = [bag(feats[t][1], _offsets(feats[t][0])) for t, bag in zip(self.layout.dp_tables, self.replica_bags)]
        return torch.cat(out, dim=1) if out else torch.zeros(B, 0, device=self._rows.device)  # (B_r, n_dp * D)

    def _shard_lookup(self, received, sizes: list[int]) -> list[Tensor]:
        """One pooled lookup per local slot over all B_global samples (sources in rank order)."""
        n = len(self.slots)
        if n == 0:
            return []
        len_blocks = [c.view(n, b) for c, b in zip(received.lengths.split(received.length_splits), sizes)]
        per_slot_ids = torch.stack([blk.sum(1) for blk in len_blocks])  # (K, n) ids per (source, slot)
        val_blocks = [v.split(cnt) for v, cnt in zip(received.values.split(received.value_splits),
                                                     per_slot_ids.tolist())]
        outputs = []
        one = len(len_blocks) == 1  # a group of one: no blocks to join (a copy of every slot's ids per step)
        for i in range(n):
            lens = len_blocks[0][i] if one else torch.cat([blk[i] for blk in len_blocks])  # (B_global,)
            ids = val_blocks[0][i] if one else torch.cat([vb[i] for vb in val_blocks])  # (nnz_slot,)
            if self.stores is None and self.fused_sgd_lr is not None and self.training and torch.is_grad_enabled():
                outputs.append(fused_sgd_bag(ids, _offsets(lens), self.shards[i], self.fused_sgd_lr))  # its owner's
            elif self.stores is None:
                outputs.append(_bag(ids, lens, self.shards[i]))  # (B_global, cols)
            else:
                outputs.append(self.shard_bags[i](ids, _offsets(lens)))  # (B_global, cols)
        return outputs

    def _exchange(self, outputs: list[Tensor] | Tensor, sizes: list[int], rw: bool) -> PooledExchangeHandle:
        """Start the output dist of per-slot outputs (B_global, cols) side by side (a list, or (B_global, n,
        cols) of one width)."""
        tables = self.layout.rw_tables if rw else self.layout.pooled_tables
        if isinstance(outputs, Tensor):
            send = outputs.reshape(outputs.shape[0], -1)
        else:
            send = torch.cat(outputs, dim=1) if outputs else torch.zeros(sum(sizes), 0, device=self._rows.device)
        return pooled_exchange(
            send, sizes, self._rw_w if rw else self._pooled_w, self._rw_cols if rw else self._pooled_cols,
            len(tables) * self.layout.dim, group=self.group, stats=self.stats,
            kind="reduce_scatter" if rw else "pooled",
        )

    # --------------------------------------------------------------------------------------- gradients
    def sync_grads(self) -> None:
        """Sum the data-parallel replicas' gradients over the ranks (call after backward, before the step)."""
        if self.stores is not None:
            self._sync_store_grads()
            return
        if not self.layout.dp_tables:
            return
        if self.group is None:
            if self.k_invariant:  # coalesced as K ranks coalesce the gathered rows: one sum per row, then the step
                for w in self.replicas:
                    if w.grad is not None and w.grad.is_sparse:
                        w.grad = w.grad.coalesce()
            return
        if self.dp_grad == "dense":
            works = []
            for w in self.replicas:
                g = w.grad.to_dense() if w.grad is not None and w.grad.is_sparse else w.grad
                w.grad = g if g is not None else torch.zeros_like(w)
                self.stats.record("dp_grad_allreduce", w.grad.numel() * w.grad.element_size())
                works.append(dist.all_reduce(w.grad, group=self.group, async_op=True))
            for work in works:
                work.wait()
            return
        grads = [w.grad if w.grad is not None else torch.sparse_coo_tensor(
            torch.empty(1, 0, dtype=torch.int64, device=w.device), torch.empty(0, w.shape[1], device=w.device),
            tuple(w.shape)) for w in self.replicas]
        summed = sparse_grad_all_reduce(grads, group=self.group, stats=self.stats,
                                        coalesce_first=not self.k_invariant).wait()
        for w, g in zip(self.replicas, summed):
            w.grad = g

    def _sync_store_grads(self) -> None:
        """Replicas in row stores: this rank's (ids, grads) of each replica, summed over the ranks like the
        parameters' sparse gradients (or densely), kept for ``step``."""
        L = self.layout
        local = []
        for t, bag in zip(L.dp_tables, self.replica_bags):
            taken = bag.take_gradients()  # one (ids, grads) per forward since the last step
            dev = bag.store.device
            idx = torch.cat([i for i, _ in taken]) if taken else torch.empty(0, dtype=torch.int64, device=dev)
            val = torch.cat([g for _, g in taken]) if taken else torch.empty(0, L.dim, device=dev)
            local.append(torch.sparse_coo_tensor(idx.to(dev).unsqueeze(0), val.to(dev), (L.table_rows[t], L.dim),
                                                 check_invariants=False))
        if not local:
            self._replica_grads = []
            return
        if self.group is not None and self.dp_grad == "dense":
            dense = [g.to_dense() for g in local]
            works = []
            for g in dense:
                self.stats.record("dp_grad_allreduce", g.numel() * g.element_size())
                works.append(dist.all_reduce(g, group=self.group, async_op=True))
            for work in works:
                work.wait()
            # A row no rank touched has a zero gradient, and a zero gradient leaves a row and its state as they are
            # under SGD and both Adagrads: apply the rows with a non-zero sum only.
            rows = [torch.nonzero(g.ne(0).any(1)).reshape(-1) for g in dense]
            self._replica_grads = [(i, g.index_select(0, i)) for i, g in zip(rows, dense)]
            return
        summed = sparse_grad_all_reduce(local, group=self.group, stats=self.stats,
                                        coalesce_first=not self.k_invariant).wait()
        self._replica_grads = [(g.indices()[0], g.values()) for g in summed]

    def step(self) -> None:
        """Apply the last backward's row gradients in every store (after ``sync_grads``); nothing to do for
        parameters (a torch optimizer steps them)."""
        if self._batch is not None:
            self._batch.step()
        for bag in self.shard_bags:
            bag.step()
        grads, self._replica_grads = self._replica_grads, []
        for bag, (ids, g) in zip(self.replica_bags, grads):
            bag.store.apply_gradients(ids, g)

    def cache_stats(self) -> CacheStats:
        """Hits, misses and bytes of every cached store, summed over this rank's stores and over the ranks (a
        collective when the tables live in stores: every rank calls it together, as the trainer does)."""
        total = self._batch.stats() if isinstance(self._batch, CachedTables) else CacheStats()
        for bag in [*self.replica_bags, *self.shard_bags]:
            stats = getattr(bag.store, "stats", None)
            if stats is not None:
                total = total + stats
        if self.stores is None or self.group is None:
            return total
        names = [f.name for f in fields(CacheStats)]
        vec = torch.tensor([getattr(total, k) for k in names], dtype=torch.int64, device=self._rows.device)
        dist.all_reduce(vec, group=self.group)  # waits for every rank
        return CacheStats(**{k: int(v) for k, v in zip(names, vec.tolist())})

    # --------------------------------------------------------------------------------------- full tables
    @torch.no_grad()
    def full_tables(self, array: str = "weight") -> list[Tensor]:
        """Every table whole, on every rank (a collective: one all-reduce of the sharded tables' rows).

        Each sharded row is held by exactly one rank and the others add zeros, so the result is exact.
        ``array``: "weight", or with row stores an optimizer state array ("sum": (rows, D) for Adagrad, (rows,)
        for row-wise Adagrad), each store flushed first.
        """
        L = self.layout
        # Every rank must agree on the shapes (the all-reduce below), so they come from the config, not the data.
        tail = (L.dim,)
        if array != "weight":
            spec = self.stores.optimizer.state_spec(L.dim) if self.stores is not None else {}
            if array not in spec:
                raise ConfigError(f"array {array!r}: these tables keep 'weight' and {sorted(spec)}", field="array")
            tail = spec[array][0]  # (D,) for Adagrad, () for row-wise Adagrad (one value per row)
        if self.stores is None:
            local = list(self.shards)
            replicas = [w.detach() for w in self.replicas]
        else:
            local = [store.state_dict()[array] for store in self.slot_stores()]
            replicas = [bag.store.state_dict()[array] for bag in self.replica_bags]
        dev = self._rows.device
        sharded = [t for t in range(L.num_tables) if t not in L.dp_tables]
        bufs = {t: torch.zeros(L.table_rows[t], *tail, device=dev) for t in sharded}
        for s, w in zip(self.slots, local):
            rows = slice(s.row_offset, s.row_offset + s.num_rows)
            if tail:
                bufs[s.table][rows, s.col_offset:s.col_offset + s.num_cols] = w.to(dev)
            else:
                bufs[s.table][rows] = w.to(dev)
        if sharded and self.group is not None:
            flat = torch.cat([bufs[t].reshape(-1) for t in sharded])
            dist.all_reduce(flat, group=self.group)
            for t, chunk in zip(sharded, flat.split([bufs[t].numel() for t in sharded])):
                bufs[t] = chunk.view(L.table_rows[t], *tail)
        for t, w in zip(L.dp_tables, replicas):
            bufs[t] = w.to(dev).clone()
        return [bufs[t] for t in range(L.num_tables)]


def _offsets(lengths: Tensor) -> Tensor:
    """Bag bounds of lengths (B,): (B+1,) offsets, the last one the end of the last bag."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return offsets


def _bag(ids: Tensor, lengths: Tensor, weight: Tensor) -> Tensor:
    """Sum-pooled bags with sparse gradients: ids (nnz,), lengths (B,) -> (B, cols)."""
    return F.embedding_bag(ids, weight, _offsets(lengths), mode="sum", sparse=True, include_last_offset=True)


def _slot_name(s: Slot) -> str:
    """``t3`` for a whole table, ``t3[rows 0:500]`` / ``t3[cols 0:8]`` for part of one (names stores in errors)."""
    if s.sharding is RW:
        return f"t{s.table}[rows {s.row_offset}:{s.row_offset + s.num_rows}]"
    if s.sharding is ShardingType.COLUMN_WISE:
        return f"t{s.table}[cols {s.col_offset}:{s.col_offset + s.num_cols}]"
    return f"t{s.table}"
