"""Run under torchrun: K ranks train a sharded DLRM whose shards live in row stores, cached or not, and must
match the single-process DLRM over ``StoreTables`` with the same row optimizer.

Usage: dlrm_store_parity.py OUT_DIR [--steps N] [--batch B] [--ratio R]. For each optimizer (SGD, Adagrad,
row-wise Adagrad) and the global batches of ``dlrm_common`` (split unevenly), on a plan with data-parallel,
table-, row-, column-wise (not for row-wise Adagrad) and one ``cached`` table:

- uncached stores (``MemoryStore`` s, the plan's cached table still cached) and stores all cached at ratio R
  train to bit-identical tables, optimizer state and losses (a cache is exact, sharded too);
- both equal the single-process run to float tolerance (``assert_close`` defaults): losses, MLPs, every table's
  weights and optimizer state; the bytes every collective sent equal ``predict_step_bytes``;
- the cached stores hit and missed (the caches were really exercised).

Rank 0 writes OUT_DIR/summary.json with, per optimizer, which results were bit-identical to one process, and
prints ``STORE PARITY OK``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from dlrm_common import CW, DIM, TW, global_batches, mixed_plan, small_model  # noqa: E402

from haloflow.cache import CacheConfig, make_optimizer  # noqa: E402
from haloflow.data.jagged import split_sizes  # noqa: E402
from haloflow.engine.dlrm.embedding_layout import predict_step_bytes  # noqa: E402
from haloflow.engine.dlrm.shard_stores import ShardStores  # noqa: E402
from haloflow.engine.dlrm.sharding import build_sharded_dlrm  # noqa: E402
from haloflow.engine.dlrm.store_tables import StoreTables  # noqa: E402
from haloflow.engine.runtime import init_from_env, shutdown  # noqa: E402
from haloflow.models.dlrm import DLRM, dlrm_loss  # noqa: E402
from haloflow.partition.planner.types import Shard, ShardingPlan, ShardingType, TablePlan  # noqa: E402

LR = 0.05
CACHED_TABLE = 4  # table-wise in every mixed plan; cached here with 3 of its 9 rows on the device


def store_plan(k: int, optimizer: str) -> ShardingPlan:
    """``mixed_plan(k)`` with table 4 cached; for row-wise Adagrad the column-wise table becomes table-wise."""
    tables = []
    for tp in mixed_plan(k).tables:
        if tp.table_index == CACHED_TABLE:
            tp = replace(tp, sharding=ShardingType.CACHED, cache_rows=3)
        elif tp.sharding is CW and optimizer == "rowwise_adagrad":
            tp = TablePlan(tp.table, tp.table_index, TW, (Shard(k - 1, 0, tp.shards[0].num_rows, 0, DIM),))
        tables.append(tp)
    return ShardingPlan(k, tuple(tables))


def mlp_optimizer(name: str, params):
    # What the trainer does: the MLPs take Adagrad when the tables do (row-wise Adagrad is for rows only).
    return (torch.optim.SGD if name == "sgd" else torch.optim.Adagrad)(params, lr=LR)


def reference(batches, name: str):
    config = small_model().config
    model = DLRM(config, embeddings=StoreTables.build(config, make_optimizer({"name": name, "lr": LR})))
    opt = mlp_optimizer(name, model.parameters())
    losses = []
    for dense, sparse, labels in batches:
        opt.zero_grad()
        loss = dlrm_loss(model(dense, sparse), labels)
        loss.backward()
        model.embeddings.step()
        opt.step()
        losses.append(loss.detach())
    rows = model.embeddings.state_dict_rows()
    tables = {key: [r[key] for r in rows] for key in rows[0]}
    return torch.stack(losses), tables, model


def distributed(batches, plan, ctx, name: str, cache: CacheConfig | None):
    stores = ShardStores(optimizer=make_optimizer({"name": name, "lr": LR}), cache=cache)
    model = build_sharded_dlrm(small_model().config, plan, ctx.group, stores=stores)
    opt = mlp_optimizer(name, model.parameters())
    assert all(not p.is_sparse for p in model.parameters()) and not list(model.embeddings.parameters())
    losses = []
    for dense, sparse, labels in batches:
        B = labels.numel()
        sizes = split_sizes(B, ctx.world_size)
        lo = sum(sizes[: ctx.rank])
        model.stats.reset()
        opt.zero_grad()
        logits = model(dense[lo:lo + sizes[ctx.rank]], sparse.split_batch(sizes)[ctx.rank], sizes)
        loss = dlrm_loss(logits, labels[lo:lo + sizes[ctx.rank]], global_batch_size=B)
        loss.backward()
        model.finish_grad_sync()
        model.embeddings.step()
        opt.step()
        want = predict_step_bytes(model.embeddings.layout, sparse, sizes, dense_buckets=model.dense_buckets)[ctx.rank]
        if model.stats.snapshot() != want:
            raise AssertionError(f"rank {ctx.rank} ({name}): bytes {model.stats.snapshot()} != predicted {want}")
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total)
    arrays = ["weight", *stores.optimizer.state_spec(DIM)]
    tables = {key: model.embeddings.full_tables(key) for key in arrays}
    return torch.stack(losses), tables, model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=13)
    p.add_argument("--ratio", type=float, default=0.3)
    args = p.parse_args()
    ctx = init_from_env(timeout_s=60, device="cpu")
    batches = global_batches(args.steps, args.batch, seed=1)
    summary = {"world_size": ctx.world_size}
    for name in ("sgd", "adagrad", "rowwise_adagrad"):
        plan = store_plan(ctx.world_size, name)
        ref_losses, ref_tables, ref_model = reference(batches, name)
        plain_losses, plain_tables, plain = distributed(batches, plan, ctx, name, None)
        losses, tables, cached = distributed(batches, plan, ctx, name, CacheConfig(ratio=args.ratio))
        # 1. a cache of any size is exact, sharded too: bit for bit against the uncached stores
        assert torch.equal(losses, plain_losses), (name, losses, plain_losses)
        for key in tables:
            for t, (a, b) in enumerate(zip(tables[key], plain_tables[key])):
                assert torch.equal(a, b), f"{name} {key} table {t}: cached != uncached stores"
        stats = cached.embeddings.cache_stats()
        assert stats.hits > 0 and stats.misses > 0, stats
        # 2. the single process, to float tolerance
        torch.testing.assert_close(losses, ref_losses)
        exact = {}
        for key in tables:
            for t, (got, want) in enumerate(zip(tables[key], ref_tables[key])):
                torch.testing.assert_close(got, want, msg=lambda m, k=key, t=t: f"{name} {k} table {t}: {m}")
                exact[f"{key} t{t}"] = bool(torch.equal(got, want))
        ref_state, got_state = ref_model.state_dict(), cached.model.state_dict()
        for k in ref_state:
            if not k.startswith("embeddings"):
                torch.testing.assert_close(got_state[k], ref_state[k], msg=lambda m, k=k: f"{name} {k}: {m}")
        # the tables moved, so the comparison is not between two untouched copies
        start = small_model().embeddings.tables[CACHED_TABLE].weight
        assert not torch.equal(ref_tables["weight"][CACHED_TABLE], start)
        summary[name] = {"losses_bit_identical": bool(torch.equal(losses, ref_losses)),
                         "mlps_bit_identical": all(torch.equal(got_state[k], ref_state[k]) for k in ref_state
                                                   if not k.startswith("embeddings")),
                         "tables_bit_identical": exact, "cache_hit_rate": stats.hit_rate,
                         "max_abs_weight_diff": max(float((a - b).abs().max()) for a, b in
                                                    zip(tables["weight"], ref_tables["weight"]))}
    if ctx.rank == 0:
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        print("STORE PARITY OK")
    shutdown()


if __name__ == "__main__":
    main()
