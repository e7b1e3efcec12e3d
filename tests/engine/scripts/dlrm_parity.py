"""Run under torchrun: K ranks train a sharded DLRM (mixed plan) and must match the single-process run.

Checks, per rank, for ``--steps`` steps of SGD lr 0.1 on the same global batches (split unevenly):
losses and final weights equal the single-process DLRM's (``assert_close`` defaults), and the bytes every
collective sent equal ``predict_step_bytes``. Runs once with sparse and once with dense data-parallel
gradient sync. Exits non-zero on any mismatch; rank 0 prints ``PARITY OK`` and a JSON summary.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from dlrm_common import global_batches, mixed_plan, small_model
from haloflow.data.jagged import split_sizes
from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.engine.dlrm.embedding_layout import predict_step_bytes
from haloflow.engine.dlrm.sharding import shard_dlrm
from haloflow.models.dlrm import dlrm_loss


def reference(batches, lr):
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for dense, sparse, labels in batches:
        opt.zero_grad()
        loss = dlrm_loss(model(dense, sparse), labels)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), model


def distributed(batches, plan, ctx, lr, dp_grad):
    model = shard_dlrm(small_model(), plan, ctx.group, dp_grad=dp_grad)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n_dense = model.dense_buckets
    losses, byte_log = [], []
    for step, (dense, sparse, labels) in enumerate(batches):
        B = labels.numel()
        sizes = split_sizes(B, ctx.world_size)
        lo = sum(sizes[: ctx.rank])
        my_sparse = sparse.split_batch(sizes)[ctx.rank]
        model.stats.reset()
        opt.zero_grad()
        # Step 0 lets the engine ask the peers for their batch sizes; later steps pass them.
        logits = model(dense[lo:lo + sizes[ctx.rank]], my_sparse, None if step == 0 else sizes)
        loss = dlrm_loss(logits, labels[lo:lo + sizes[ctx.rank]], global_batch_size=B)
        loss.backward()
        model.finish_grad_sync()
        opt.step()
        got = model.stats.snapshot()
        want = predict_step_bytes(model.embeddings.layout, sparse, sizes, dense_buckets=n_dense,
                                  dp_grad=dp_grad)[ctx.rank]
        if step == 0:
            want = dict(sorted({**want, "batch_sizes": 8 * (ctx.world_size - 1)}.items()))
        if got != want:
            raise AssertionError(f"rank {ctx.rank} step {step} ({dp_grad}): bytes {got} != predicted {want}")
        byte_log.append(sum(got.values()))
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total)
    return torch.stack(losses), model.to_dlrm(), byte_log


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=13)
    args = p.parse_args()
    ctx = init_from_env(timeout_s=60, device="cpu")
    plan = mixed_plan(ctx.world_size)
    batches = global_batches(args.steps, args.batch, seed=1)
    ref_losses, ref_model = reference(batches, 0.1)
    summary = {"world_size": ctx.world_size}
    for dp_grad, steps in (("sparse", args.steps), ("dense", 3)):
        losses, full, byte_log = distributed(batches[:steps], plan, ctx, 0.1, dp_grad)
        if dp_grad == "dense":
            ref_losses_d, ref_model_d = reference(batches[:steps], 0.1)
        else:
            ref_losses_d, ref_model_d = ref_losses, ref_model
        torch.testing.assert_close(losses, ref_losses_d)
        ref_state, got_state = ref_model_d.state_dict(), full.state_dict()
        assert ref_state.keys() == got_state.keys()
        for k in ref_state:
            torch.testing.assert_close(got_state[k], ref_state[k], msg=lambda m, k=k: f"{dp_grad} {k}: {m}")
        # The weights moved, so the comparison above is not between two untouched copies.
        assert (ref_state["embeddings.tables.2.weight"] != small_model().state_dict()["embeddings.tables.2.weight"]).any()
        summary[dp_grad] = {"losses": losses.tolist(), "bytes_per_step": byte_log}
    if ctx.rank == 0:
        print("PARITY OK " + json.dumps(summary))
    shutdown()


if __name__ == "__main__":
    main()
