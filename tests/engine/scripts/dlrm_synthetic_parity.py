"""Run under torchrun (or alone, K = 1): DLRM with SGD on the synthetic click log, the global batch split over K ranks.

The run of ``haloflow train dlrm --synthetic`` (``DLRMTrainConfig(synthetic=True)``'s data, model, batch and lr)
driven by a loop of its own, through ``parallelize_dlrm`` at every K (table-wise plan; a group of one at K = 1)::

    batch  = samples step*B .. step*B + B-1 of the log          every rank reads the same global batch
    mine   = contiguous slice r of split_sizes(B, K)
    loss   = dlrm_loss(net(dense_r, sparse_r, sizes), labels_r, global_batch_size=B)
    loss.backward(); net.finish_step(); sgd.step()              the logged loss: the sum over the ranks

Rank 0 prints ``LOSSES <json list>``, the global loss of every step. ``--dtype float32`` is the trainer's run:
its layouts part once a ReLU input falls within float32 rounding of zero (see ``engine/dlrm/parallelize``);
``float64`` (the default) pushes that far past a few hundred steps, so what is left to differ is the engine.

Usage: dlrm_synthetic_parity.py [--steps 200] [--dtype float64|float32]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.data.jagged import split_sizes
from haloflow.engine.comm import Group
from haloflow.engine.dlrm.config import DLRMTrainConfig
from haloflow.engine.dlrm.parallelize import parallelize_dlrm
from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.models.dlrm import DLRMConfig, dlrm_loss
from haloflow.partition.planner.planner import table_wise_plan

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def synthetic_losses(steps: int, group: Group | None, rank: int = 0, world_size: int = 1,
                     dtype: torch.dtype = torch.float64) -> list[float]:
    """The global loss of each of ``steps`` SGD steps on this rank's slices (every rank calls it together)."""
    cfg = DLRMTrainConfig(synthetic=True, max_steps=steps, log_every=1)
    gen = ClickLogGenerator(ClickLogConfig(scale=cfg.synthetic_scale, max_rows=cfg.synthetic_max_rows, seed=cfg.seed))
    model_config = DLRMConfig(table_sizes=gen.sizes, num_dense=gen.config.num_dense, embedding_dim=cfg.embedding_dim,
                              bottom_mlp=cfg.bottom_mlp, top_mlp=cfg.top_mlp, seed=cfg.seed)
    plan = table_wise_plan(gen.sizes, cfg.embedding_dim, world_size)
    net = parallelize_dlrm(model_config, plan, group, dtype=dtype)
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr)
    B = cfg.batch_size
    losses = []
    for step in range(steps):
        sizes = split_sizes(B, world_size)
        mine = gen.samples(step * B, B).split_batch(sizes)[rank]
        opt.zero_grad(set_to_none=True)
        logits = net(mine.dense.to(dtype), mine.sparse, sizes)  # (B_r,)
        loss = dlrm_loss(logits, mine.labels.to(dtype), global_batch_size=B)
        loss.backward()
        net.finish_step()
        opt.step()
        total = loss.detach().clone()
        if group is not None:
            dist.all_reduce(total, group=group)  # waits for every rank
        losses.append(float(total))
    return losses


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    args = p.parse_args()
    ctx = init_from_env(timeout_s=120, device="cpu")
    losses = synthetic_losses(args.steps, ctx.group, ctx.rank, ctx.world_size, DTYPES[args.dtype])
    if ctx.rank == 0:
        print("LOSSES " + json.dumps(losses), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
