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
the same update.

Shapes:
    sparse JaggedBatch lengths (T, B_r) -> pooled (B_r, T, D)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from haloflow.data.jagged import JaggedBatch
from haloflow.engine.comm import CommStats, Group, group_rank, group_size
from haloflow.engine.dlrm.embedding_dist import (
    PooledExchangeHandle,
    jagged_all_to_all,
    pooled_exchange,
    sparse_grad_all_reduce,
)
from haloflow.engine.dlrm.embedding_layout import RW, EmbeddingLayout, Slot
from haloflow.errors import ConfigError, PlanError
from haloflow.models.keyed_init import keyed_uniform_rows
from haloflow.partition.planner.types import ShardingPlan

__all__ = ["ShardedEmbeddingCollection", "ShardedPooledHandle"]


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
        grouped = torch.cat(parts, dim=1)
        B = grouped.shape[0]
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
    """

    def __init__(self, layout: EmbeddingLayout, init: Callable[[int, tuple[int, int], tuple[int, int]], Tensor], *,
                 group: Group | None, dp_grad: str = "sparse", stats: CommStats | None = None):
        super().__init__()
        K, rank = group_size(group), group_rank(group)
        if layout.world_size != K:
            raise PlanError(f"plan is for {layout.world_size} ranks but the process group has {K}")
        if dp_grad not in ("sparse", "dense"):
            raise ConfigError(f"dp_grad must be 'sparse' or 'dense', got {dp_grad!r}")
        self.layout, self.group, self.rank, self.dp_grad = layout, group, rank, dp_grad
        self.stats = stats if stats is not None else CommStats()
        self.slots: tuple[Slot, ...] = layout.slots[rank]
        D = layout.dim
        self.replicas = nn.ParameterList([nn.Parameter(init(t, (0, layout.table_rows[t]), (0, D)))
                                          for t in layout.dp_tables])
        self.shards = nn.ParameterList([
            nn.Parameter(init(s.table, (s.row_offset, s.row_offset + s.num_rows), (s.col_offset, s.col_offset + s.num_cols)))
            for s in self.slots
        ])
        self._pooled_w, self._rw_w = layout.widths(rw=False), layout.widths(rw=True)
        self.batch_sizes: Sequence[int] | None = None  # every rank's B_r for the next lookup (None: ask them)
        # Index tensors as buffers on the weights' device, so that ``.to(device)`` moves them with the weights.
        dev = next(iter([*self.replicas, *self.shards]), torch.empty(0)).device
        self.register_buffer("_order", layout.output_order().to(dev), persistent=False)
        self.register_buffer("_pooled_cols", layout.columns(rw=False).to(dev), persistent=False)
        self.register_buffer("_rw_cols", layout.columns(rw=True).to(dev), persistent=False)
        self.register_buffer("_rows", torch.tensor(layout.table_rows, dtype=torch.int64, device=dev),
                             persistent=False)
        for t in layout.rw_tables:
            self.register_buffer(f"_bounds{t}", torch.tensor(layout.row_bounds(t), dtype=torch.int64, device=dev),
                                 persistent=False)

    @classmethod
    def from_plan(cls, plan: ShardingPlan, table_sizes: Sequence[int], dim: int, *, seed: int,
                  group: Group | None, **kwargs) -> ShardedEmbeddingCollection:
        """Build this rank's shards and replicas alone, with ``EmbeddingTables``' values for ``seed``."""
        layout = EmbeddingLayout.from_plan(plan, list(table_sizes), dim)

        def init(t: int, rows: tuple[int, int], cols: tuple[int, int]) -> Tensor:
            return keyed_uniform_rows(seed, t, layout.table_rows[t], rows, cols)

        return cls(layout, init, group=group, **kwargs)

    @classmethod
    def from_weights(cls, plan: ShardingPlan, weights: Sequence[Tensor], *, group: Group | None,
                     **kwargs) -> ShardedEmbeddingCollection:
        """Copy this rank's rectangles out of whole tables (identical on every rank)."""
        dim = int(weights[0].shape[1])
        layout = EmbeddingLayout.from_plan(plan, [int(w.shape[0]) for w in weights], dim)
        for t, w in enumerate(weights):
            if tuple(w.shape) != (layout.table_rows[t], dim):
                raise ConfigError(f"table {t}: weight of shape {tuple(w.shape)}, expected ({layout.table_rows[t]}, {dim})")

        def init(t: int, rows: tuple[int, int], cols: tuple[int, int]) -> Tensor:
            return weights[t].detach()[rows[0]:rows[1], cols[0]:cols[1]].clone()

        return cls(layout, init, group=group, **kwargs)

    def storage_bytes(self) -> int:
        """Bytes of this rank's embedding rows (shards and replicas; optimizer state not included)."""
        return sum(p.numel() * p.element_size() for p in [*self.replicas, *self.shards])

    @classmethod
    def from_tables(cls, tables: nn.Module, plan: ShardingPlan, *, group: Group | None,
                    **kwargs) -> ShardedEmbeddingCollection:
        """From a single-device ``EmbeddingTables`` (its ``tables`` of ``nn.EmbeddingBag``)."""
        return cls.from_weights(plan, [bag.weight for bag in tables.tables], group=group, **kwargs)

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, sparse: JaggedBatch, batch_sizes: Sequence[int] | None = None) -> Tensor:
        return self.start(sparse, batch_sizes).wait()

    def start(self, sparse: JaggedBatch, batch_sizes: Sequence[int] | None = None) -> ShardedPooledHandle:
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
        feats = self._split_and_check(sparse)  # T x (lengths (B_r,), ids)
        handle = None
        if any(L.slots):
            lengths, values = self._route(feats, sparse.batch_size)
            recv_len = [len(L.slots[self.rank]) * b for b in sizes]
            handle = jagged_all_to_all(lengths, values, recv_len, group=self.group, stats=self.stats)
        dp = self._dp_lookup(feats, sparse.batch_size)  # while the lengths are in flight
        pooled = rw = None
        if handle is not None:
            outputs = self._shard_lookup(handle.wait(), sizes)  # per slot (B_global, cols)
            if L.pooled_tables:
                pooled = self._exchange([o for o, s in zip(outputs, self.slots) if s.sharding is not RW],
                                        sizes, rw=False)
            if L.rw_tables:
                rw = self._exchange([o for o, s in zip(outputs, self.slots) if s.sharding is RW], sizes, rw=True)
        return ShardedPooledHandle(dp, pooled, rw, self._order, L.dim)

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

    def _split_and_check(self, sparse: JaggedBatch) -> list[tuple[Tensor, Tensor]]:
        bounds = sparse.feature_offsets()  # (T+1,)
        ids = sparse.values
        # One pass over nnz: every id must name a row of its table (a remote rank could not say which).
        limit = torch.repeat_interleave(self._rows, bounds.diff())  # (nnz,)
        bad = (ids < 0) | (ids >= limit)
        b = bounds.tolist()  # T+1 numbers (a device sync on an accelerator)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            t = bisect.bisect_right(b, i) - 1
            raise ConfigError(f"sparse feature {t}: id {int(ids[i])} outside table {t}'s rows 0..{int(self._rows[t]) - 1}")
        return [(sparse.lengths[t], ids[b[t]:b[t + 1]]) for t in range(sparse.num_features)]

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
        out = [_bag(feats[t][1], feats[t][0], w) for t, w in zip(self.layout.dp_tables, self.replicas)]
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
        for i, w in enumerate(self.shards):
            lens = torch.cat([blk[i] for blk in len_blocks])  # (B_global,)
            ids = torch.cat([vb[i] for vb in val_blocks])  # (nnz_slot,)
            outputs.append(_bag(ids, lens, w))  # (B_global, cols)
        return outputs

    def _exchange(self, outputs: list[Tensor], sizes: list[int], rw: bool) -> PooledExchangeHandle:
        tables = self.layout.rw_tables if rw else self.layout.pooled_tables
        send = torch.cat(outputs, dim=1) if outputs else torch.zeros(sum(sizes), 0, device=self._rows.device)
        return pooled_exchange(
            send, sizes, self._rw_w if rw else self._pooled_w, self._rw_cols if rw else self._pooled_cols,
            len(tables) * self.layout.dim, group=self.group, stats=self.stats,
            kind="reduce_scatter" if rw else "pooled",
        )

    # --------------------------------------------------------------------------------------- gradients
    def sync_grads(self) -> None:
        """Sum the data-parallel replicas' gradients over the ranks (call after backward, before the step)."""
        if not self.layout.dp_tables or self.group is None:
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
        summed = sparse_grad_all_reduce(grads, group=self.group, stats=self.stats).wait()
        for w, g in zip(self.replicas, summed):
            w.grad = g

    # --------------------------------------------------------------------------------------- full tables
    @torch.no_grad()
    def full_tables(self) -> list[Tensor]:
        """Every table whole, on every rank (a collective: one all-reduce of the sharded tables' rows).

        Each sharded row is held by exactly one rank and the others add zeros, so the result is exact.
        """
        L = self.layout
        sharded = [t for t in range(L.num_tables) if t not in L.dp_tables]
        bufs = {t: torch.zeros(L.table_rows[t], L.dim, device=self._rows.device) for t in sharded}
        for s, w in zip(self.slots, self.shards):
            bufs[s.table][s.row_offset:s.row_offset + s.num_rows, s.col_offset:s.col_offset + s.num_cols] = w
        if sharded and self.group is not None:
            flat = torch.cat([bufs[t].reshape(-1) for t in sharded])
            dist.all_reduce(flat, group=self.group)
            for t, chunk in zip(sharded, flat.split([bufs[t].numel() for t in sharded])):
                bufs[t] = chunk.view(L.table_rows[t], L.dim)
        for t, w in zip(L.dp_tables, self.replicas):
            bufs[t] = w.detach().clone()
        return [bufs[t] for t in range(L.num_tables)]


def _bag(ids: Tensor, lengths: Tensor, weight: Tensor) -> Tensor:
    """Sum-pooled bags with sparse gradients: ids (nnz,), lengths (B,) -> (B, cols)."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return F.embedding_bag(ids, weight, offsets, mode="sum", sparse=True, include_last_offset=True)
