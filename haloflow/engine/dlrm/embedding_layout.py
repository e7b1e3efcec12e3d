"""Where every shard of a ``ShardingPlan`` sits in the exchanges, and the bytes a step sends.

The plan's shards become *slots*; a rank's slots are listed in table order, and within a table in shard
order. That one order fixes every buffer layout of the sharded engine::

    input dist, to rank d:      lengths of d's slots   [slot 0: (B_s,) | slot 1: (B_s,) | ...]
                                values of d's slots    [slot 0's ids   | slot 1's ids   | ...]
                                  table-/column-wise (or cached) slot: all ids of its table
                                  row-wise slot: the ids inside its row range, minus row_offset

    output dist, from holder s: pooled (B_global, W_s)  columns = s's table-/column-wise slots side by side
                                partial (B_global, V_s) columns = s's row-wise slots side by side

    pooled result on rank r:    [data-parallel tables | table-/column-wise tables | row-wise tables]
                                (B_r, T, D) after putting the tables back in table order

``predict_step_bytes`` computes, from the plan and one global batch alone, the bytes each rank's collectives
send to other ranks in one training step (forward and backward); the engine's ``CommStats`` must match it
exactly, and the planner's cost model can call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from haloflow.data.jagged import JaggedBatch
from haloflow.engine.grad_sync import sync_bytes
from haloflow.errors import PlanError
from haloflow.partition.planner.types import ShardingPlan, ShardingType, TableSpec
from haloflow.partition.planner.validate import validate_plan

__all__ = ["Slot", "EmbeddingLayout", "predict_step_bytes"]

DP, TW, RW, CW, CACHED = (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.ROW_WISE,
                          ShardingType.COLUMN_WISE, ShardingType.CACHED)


@dataclass(frozen=True)
class Slot:
    """One model-parallel shard: rows ``row_offset..+num_rows`` x columns ``col_offset..+num_cols`` of a table.

    ``cache_rows``: the device slots of a cached table's shard (the plan's ``cache_rows``), else None.
    """

    table: int
    sharding: ShardingType
    rank: int
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int
    cache_rows: int | None = None


@dataclass(frozen=True)
class EmbeddingLayout:
    """The plan as the engine uses it (build with ``from_plan``, which validates it).

    Args:
        world_size: K.
        dim: D, the width of every table.
        table_rows: rows of every table, in table order.
        slots: per rank, the model-parallel slots it holds (table order, then shard order).
        dp_tables / pooled_tables / rw_tables: table indices of each output group, ascending.
    """

    world_size: int
    dim: int
    table_rows: tuple[int, ...]
    shardings: tuple[ShardingType, ...]
    slots: tuple[tuple[Slot, ...], ...]
    dp_tables: tuple[int, ...]
    pooled_tables: tuple[int, ...]
    rw_tables: tuple[int, ...]

    @classmethod
    def from_plan(cls, plan: ShardingPlan, table_rows: Sequence[int], dim: int, *,
                  ranks: int | None = None) -> EmbeddingLayout:
        """Check ``plan`` against the tables (``PlanError`` naming the table and rule) and lay it out.

        ``ranks``: K physical ranks hosting the plan's V logical ranks (V / K each, contiguous: logical rank l on
        rank l // (V / K)); None: K = V. A physical rank then holds the shards of all its logical ranks, a table's
        row-wise shards in logical-rank order, so that the reduce of their partial sums (sources in rank order,
        then slots in order) adds them in the same order at any K::

            plan for V = 4     t0 row-wise on 0 1 2 3,   t1 table-wise on 3
            K = 2              rank 0: t0[rows of 0], t0[rows of 1]     rank 1: t0[rows of 2], t0[rows of 3], t1
        """
        if len(plan.tables) != len(table_rows):
            raise PlanError(f"plan has {len(plan.tables)} tables but the model has {len(table_rows)}")
        specs = [TableSpec(name=tp.table, num_rows=int(n), dim=int(dim)) for tp, n in zip(plan.tables, table_rows)]
        validate_plan(plan, specs)
        V = plan.world_size
        K = V if ranks is None else int(ranks)
        if K < 1 or V % K:
            raise PlanError(f"plan is for {V} logical ranks, which {K} ranks cannot host evenly ({V} % {K} != 0)")
        per = V // K
        slots: list[list[Slot]] = [[] for _ in range(K)]
        for tp in plan.tables:
            if tp.sharding is DP:
                continue
            for s in sorted(tp.shards, key=lambda s: s.rank):  # logical-rank order within each physical rank
                slots[s.rank // per].append(Slot(tp.table_index, tp.sharding, s.rank // per, s.row_offset,
                                                 s.num_rows, s.col_offset, s.num_cols, tp.cache_rows))
        kinds = tuple(tp.sharding for tp in plan.tables)
        return cls(
            world_size=K, dim=int(dim), table_rows=tuple(int(n) for n in table_rows), shardings=kinds,
            slots=tuple(tuple(s) for s in slots),
            dp_tables=tuple(t for t, k in enumerate(kinds) if k is DP),
            pooled_tables=tuple(t for t, k in enumerate(kinds) if k in (TW, CW, CACHED)),
            rw_tables=tuple(t for t, k in enumerate(kinds) if k is RW),
        )

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    def row_bounds(self, table: int) -> list[int]:
        """Row-wise table: the row ranges of its shards in shard order, as bounds (S+1,)."""
        shards = sorted((s for r in self.slots for s in r if s.table == table), key=lambda s: s.row_offset)
        return [shards[0].row_offset] + [s.row_offset + s.num_rows for s in shards]

    def widths(self, rw: bool) -> list[int]:
        """Per rank, the columns it sends in the pooled exchange (``rw=False``) or the reduce-scatter."""
        return [sum(s.num_cols for s in slots if (s.sharding is RW) == rw) for slots in self.slots]

    def columns(self, rw: bool) -> torch.Tensor:
        """Output column of every column received in an exchange, sources in rank order: int64 (sum W_s,).

        Output columns of group g are ``position of the table in g * D + column in the table``.
        """
        tables = self.rw_tables if rw else self.pooled_tables
        pos = {t: i for i, t in enumerate(tables)}
        cols = [pos[s.table] * self.dim + s.col_offset + c
                for slots in self.slots for s in slots if (s.sharding is RW) == rw for c in range(s.num_cols)]
        return torch.tensor(cols, dtype=torch.int64)

    def output_order(self) -> torch.Tensor:
        """Index that puts ``[dp | pooled | rw]`` tables back in table order: int64 (T,)."""
        order = [*self.dp_tables, *self.pooled_tables, *self.rw_tables]
        inv = [0] * len(order)
        for i, t in enumerate(order):
            inv[t] = i
        return torch.tensor(inv, dtype=torch.int64)


def _ids_in_slot(slot: Slot, ids: torch.Tensor) -> int:
    if slot.sharding is RW:
        return int(((ids >= slot.row_offset) & (ids < slot.row_offset + slot.num_rows)).sum())
    return int(ids.numel())


def predict_step_bytes(
    layout: EmbeddingLayout,
    batch: JaggedBatch,
    batch_sizes: Sequence[int],
    *,
    dense_buckets: Sequence[int] = (),
    dp_grad: str = "sparse",
    backward: bool = True,
    elem_size: int = 4,
) -> list[dict[str, int]]:
    """Bytes each rank sends to other ranks in one step on the global ``batch`` split into ``batch_sizes``.

    Keys match ``CommStats``: ``input_lengths``, ``input_values``, ``pooled``, ``reduce_scatter`` (forward);
    ``pooled_grad``, ``reduce_scatter_grad``, ``dp_grad_*`` and ``dense_grad`` (backward, with
    ``backward=True``). Kinds that send nothing are left out. ``dense_buckets`` are the element counts of the MLP
    gradient buckets (``BucketedGradSync.bucket_sizes``): reduce-scattered then all-gathered, about
    2 P (K-1) / K floats per rank for P weights.
    """
    K, D = layout.world_size, layout.dim
    if len(batch_sizes) != K or sum(batch_sizes) != batch.batch_size:
        raise ValueError(f"batch_sizes {list(batch_sizes)} must have {K} entries summing to {batch.batch_size}")
    parts = batch.split_batch(list(batch_sizes))
    pooled_w, rw_w = layout.widths(rw=False), layout.widths(rw=True)
    out = []
    for s, part in enumerate(parts):
        feats = [part.feature(t)[1] for t in range(layout.num_tables)]  # ids of each table in s's slice
        peers = [d for d in range(K) if d != s]
        b: dict[str, int] = {
            "input_lengths": 8 * sum(len(layout.slots[d]) * batch_sizes[s] for d in peers),
            "input_values": 8 * sum(_ids_in_slot(sl, feats[sl.table]) for d in peers for sl in layout.slots[d]),
        }
        if layout.pooled_tables:
            b["pooled"] = elem_size * pooled_w[s] * sum(batch_sizes[r] for r in peers)
        if layout.rw_tables:
            b["reduce_scatter"] = elem_size * rw_w[s] * sum(batch_sizes[r] for r in peers)
        if backward:
            if layout.pooled_tables:
                b["pooled_grad"] = elem_size * batch_sizes[s] * sum(pooled_w[r] for r in peers)
            if layout.rw_tables:
                b["reduce_scatter_grad"] = elem_size * batch_sizes[s] * sum(rw_w[r] for r in peers)
            if layout.dp_tables and K > 1:
                if dp_grad == "sparse":
                    unique = sum(int(torch.unique(feats[t]).numel()) for t in layout.dp_tables)
                    b["dp_grad_counts"] = 8 * len(layout.dp_tables) * (K - 1)
                    b["dp_grad_indices"] = 8 * unique * (K - 1)
                    b["dp_grad_values"] = elem_size * D * unique * (K - 1)
                else:
                    b["dp_grad_allreduce"] = elem_size * D * sum(layout.table_rows[t] for t in layout.dp_tables)
            if K > 1:
                b["dense_grad"] = sync_bytes(dense_buckets, K, s, elem_size)
        out.append({k: v for k, v in sorted(b.items()) if v})
    return out
