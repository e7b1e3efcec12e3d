"""CUDA smoke check: NCCL process group, pinned host memory, side streams, sharded DLRM on NCCL.

Run on a machine with a GPU (one is enough; NCCL refuses two ranks on one device):

    torchrun --standalone --nproc-per-node 1 scripts/cuda_check.py

Each check prints one line; the script exits non-zero on the first mismatch.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from haloflow.engine.dist import init_from_env, shutdown
from haloflow.engine.sharding import shard_dlrm
from haloflow.models.dlrm import dlrm_loss

ROOT = Path(__file__).resolve().parents[1]


def _common():
    spec = importlib.util.spec_from_file_location("dlrm_common", ROOT / "tests/engine/scripts/dlrm_common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'OK  ' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        sys.exit(1)


def main() -> None:
    ctx = init_from_env(device="cuda", force_distributed=True, timeout_s=60)
    check("process group", ctx.backend == "nccl" and ctx.device.type == "cuda", f"{ctx.backend} on {ctx.device}")

    # pinned host memory -> device on a side stream, ordered by an event
    host = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        dev = host.to(ctx.device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
    torch.cuda.current_stream().wait_event(done)
    check("pinned copy on a side stream", host.is_pinned() and torch.equal(dev.cpu(), host))

    # asynchronous NCCL all-to-all with uneven (here: single-rank) splits, waited on as late as possible
    x = torch.randn(1000, 16, device=ctx.device)
    out = torch.empty_like(x)
    work = dist.all_to_all_single(out, x, [1000], [1000], async_op=True)
    y = x @ x.T  # work that overlaps the collective
    work.wait()
    check("async all_to_all_single", torch.equal(out, x) and y.shape == (1000, 1000))

    # the sharded DLRM (every sharding type) on NCCL equals the single-device model after 3 SGD steps
    common = _common()
    ref = common.small_model().to(ctx.device)
    sharded = shard_dlrm(common.small_model().to(ctx.device), common.mixed_plan(1), ctx.group)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, sharded)]
    for dense, sparse, labels in common.global_batches(3, 8, seed=2):
        dense, sparse, labels = dense.to(ctx.device), sparse.to(ctx.device), labels.to(ctx.device)
        for model, opt in zip((ref, sharded), opts):
            opt.zero_grad()
            dlrm_loss(model(dense, sparse), labels).backward()
            if model is sharded:
                sharded.finish_grad_sync()
            opt.step()
    got, want = sharded.to_dlrm().state_dict(), ref.state_dict()
    worst = max(float((got[k].cpu() - want[k].cpu()).abs().max()) for k in want)
    check("sharded DLRM on NCCL", worst < 1e-5, f"max |weight difference| {worst:.2e}")
    shutdown()


if __name__ == "__main__":
    main()
