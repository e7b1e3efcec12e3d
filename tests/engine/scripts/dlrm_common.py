"""Hand-built plans mixing every sharding type, small DLRMs and seeded global batches for the DLRM scripts."""

from __future__ import annotations

import torch

from haloflow.data.jagged import JaggedBatch
from haloflow.models.dlrm import DLRM, DLRMConfig
from haloflow.partition.planner.types import Shard, ShardingPlan, ShardingType, TablePlan

DP, TW, RW, CW = (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.ROW_WISE,
                  ShardingType.COLUMN_WISE)
ROWS = (11, 7, 13, 6, 9, 10)
DIM = 4


def _tw(rows: int, rank: int) -> tuple[Shard, ...]:
    return (Shard(rank, 0, rows, 0, DIM),)


def _rw(bounds: list[int], ranks: list[int]) -> tuple[Shard, ...]:
    return tuple(Shard(r, a, b - a, 0, DIM) for r, a, b in zip(ranks, bounds[:-1], bounds[1:]))


def _cw(rows: int, bounds: list[int], ranks: list[int]) -> tuple[Shard, ...]:
    return tuple(Shard(r, 0, rows, a, b - a) for r, a, b in zip(ranks, bounds[:-1], bounds[1:]))


def mixed_plan(k: int) -> ShardingPlan:
    """Every sharding type; row ranges on ranks out of order; some ranks hold no table-/column-wise shard."""
    if k == 1:
        kinds = [(TW, _tw(ROWS[0], 0)), (DP, _tw(ROWS[1], 0)), (RW, _rw([0, 13], [0])),
                 (CW, _cw(ROWS[3], [0, 4], [0])), (TW, _tw(ROWS[4], 0)), (RW, _rw([0, 10], [0]))]
    elif k == 2:
        kinds = [(TW, _tw(ROWS[0], 1)), (DP, None), (RW, _rw([0, 5, 13], [1, 0])),
                 (CW, _cw(ROWS[3], [0, 1, 4], [0, 1])), (TW, _tw(ROWS[4], 0)), (RW, _rw([0, 4, 10], [0, 1]))]
    elif k == 3:
        kinds = [(TW, _tw(ROWS[0], 2)), (DP, None), (RW, _rw([0, 6, 13], [2, 0])),
                 (CW, _cw(ROWS[3], [0, 2, 3, 4], [1, 0, 2])), (TW, _tw(ROWS[4], 2)), (RW, _rw([0, 3, 10], [1, 2]))]
    elif k == 4:
        kinds = [(TW, _tw(ROWS[0], 3)), (DP, None), (RW, _rw([0, 3, 8, 13], [2, 0, 3])),
                 (CW, _cw(ROWS[3], [0, 2, 4], [1, 3])), (TW, _tw(ROWS[4], 1)), (RW, _rw([0, 2, 5, 7, 10], [0, 1, 2, 3]))]
    else:
        raise ValueError(f"no hand-made plan for {k} ranks")
    tables = []
    for t, (kind, shards) in enumerate(kinds):
        if kind is DP:
            shards = tuple(Shard(r, 0, ROWS[t], 0, DIM) for r in range(k))
        tables.append(TablePlan(f"t{t}", t, kind, shards))
    return ShardingPlan(k, tuple(tables))


def small_model(seed: int = 0) -> DLRM:
    return DLRM(DLRMConfig(table_sizes=ROWS, num_dense=3, embedding_dim=DIM, bottom_mlp=(8,), top_mlp=(8,),
                           seed=seed))


def global_batches(steps: int, batch: int, seed: int = 0):
    """``steps`` global batches (dense (B, 3), multi-hot JaggedBatch, labels (B,)), seeded."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (len(ROWS), batch), generator=g)  # bags of 0..3 ids, some empty
        values = torch.cat([torch.randint(0, n, (int(lengths[t].sum()),), generator=g) for t, n in enumerate(ROWS)])
        dense = torch.randn(batch, 3, generator=g)
        labels = torch.randint(0, 2, (batch,), generator=g).float()
        out.append((dense, JaggedBatch(lengths, values), labels))
    return out
