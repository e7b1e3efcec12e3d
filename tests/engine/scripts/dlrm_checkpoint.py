"""torchrun script (2 ranks): a sharded DLRM in Adagrad row stores trains two steps, then saves its tables with a
real ``Checkpointer`` to OUT_DIR/ck; rank 0 also writes the whole tables (``full_tables``) to OUT_DIR/whole.pt, so
that the test can read the checkpoint back in one process and compare.

Usage: dlrm_checkpoint.py OUT_DIR. The plan is ``dlrm_common.mixed_plan(2)``: one data-parallel table (saved once,
by rank 0), a row-wise table split over both ranks in reverse order, a column-wise one split over both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from dlrm_common import global_batches, mixed_plan, small_model  # noqa: E402

from haloflow.data.jagged import split_sizes  # noqa: E402
from haloflow.engine.checkpoint import CheckpointConfig, Checkpointer  # noqa: E402
from haloflow.engine.dlrm.checkpoint import table_pieces  # noqa: E402
from haloflow.engine.dlrm.shard_stores import ShardStores  # noqa: E402
from haloflow.engine.dlrm.sharding import build_sharded_dlrm  # noqa: E402
from haloflow.engine.runtime import init_from_env, shutdown  # noqa: E402
from haloflow.models.dlrm import dlrm_loss  # noqa: E402

BATCH = 8
OPTIMIZER = {"name": "adagrad", "lr": 0.1}


def main(out: Path) -> None:
    ctx = init_from_env(timeout_s=30, device="cpu")
    r, K = ctx.rank, ctx.world_size
    model = build_sharded_dlrm(small_model().config, mixed_plan(K), ctx.group, stores=ShardStores(optimizer=OPTIMIZER))
    sizes = split_sizes(BATCH, K)
    lo, hi = sum(sizes[:r]), sum(sizes[:r + 1])
    for dense, sparse, labels in global_batches(2, BATCH, seed=3):
        loss = dlrm_loss(model(dense[lo:hi], sparse.split_batch(sizes)[r], sizes), labels[lo:hi],
                         global_batch_size=BATCH)
        loss.backward()
        model.finish_grad_sync()
        model.embeddings.step()
    Checkpointer(CheckpointConfig(dir=out / "ck"), ctx, "dlrm", {}).save(2, {}, table_pieces(model.embeddings, r))
    whole = {name: model.embeddings.full_tables(name) for name in ("weight", "sum")}  # collectives
    if r == 0:
        torch.save(whole, out / "whole.pt")
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
