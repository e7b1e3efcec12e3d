"""Run under torchrun (K ranks): ``ShardedEmbeddingCollection`` against the single-device ``EmbeddingTables``.

On one mixed plan and a multi-hot global batch split unevenly: every rank's pooled output equals the rows of
the single-device lookup for its samples; after backward of a weighted sum over all ranks, every table's
gradient (sharded rows gathered, replicas synced) equals the single-device gradient; the bytes sent equal
``predict_step_bytes``. Rank 0 prints ``COLLECTION OK``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dlrm_common import global_batches, mixed_plan, small_model
from haloflow.data.jagged import split_sizes
from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.engine.dlrm.embedding_layout import predict_step_bytes
from haloflow.engine.dlrm.sharded_embedding import ShardedEmbeddingCollection


def main() -> None:
    ctx = init_from_env(timeout_s=60, device="cpu")
    r, K = ctx.rank, ctx.world_size
    tables = small_model(seed=3).embeddings
    coll = ShardedEmbeddingCollection.from_tables(tables, mixed_plan(K), group=ctx.group)
    _, sparse, _ = global_batches(1, 11, seed=5)[0]
    sizes = split_sizes(sparse.batch_size, K)
    lo = sum(sizes[:r])

    ref = tables(sparse)  # (B, T, D)
    weight = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7))
    (ref * weight).sum().backward()

    out = coll(sparse.split_batch(sizes)[r], sizes)  # (B_r, T, D)
    torch.testing.assert_close(out, ref[lo:lo + sizes[r]].detach())
    (out * weight[lo:lo + sizes[r]]).sum().backward()
    coll.sync_grads()

    # Gradients: put each shard's rows into a full-size buffer, sum over ranks (each row has one holder).
    L = coll.layout
    for t in range(L.num_tables):
        full = torch.zeros(L.table_rows[t], L.dim)
        if t in L.dp_tables:
            if r == 0:
                full += coll.replicas[L.dp_tables.index(t)].grad.to_dense()
        for s, w in zip(coll.slots, coll.shards):
            if s.table == t and w.grad is not None:
                full[s.row_offset:s.row_offset + s.num_rows, s.col_offset:s.col_offset + s.num_cols] += \
                    w.grad.to_dense()
        dist.all_reduce(full)
        torch.testing.assert_close(full, tables.tables[t].weight.grad.to_dense(), msg=f"table {t} gradient")

    want = predict_step_bytes(L, sparse, sizes)[r]
    assert coll.stats.snapshot() == want, (coll.stats.snapshot(), want)
    if r == 0:
        print("COLLECTION OK", want)
    shutdown()


if __name__ == "__main__":
    main()
