"""CUDA check: NCCL group, pinned memory, side streams, the halo exchange, GCN and DLRM training on CUDA vs CPU.

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

from haloflow.engine.dlrm.sharding import shard_dlrm
from haloflow.engine.dlrm.train import DLRMTrainConfig, train_dlrm
from haloflow.engine.gcn.halo import HaloExchange
from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
from haloflow.engine.runtime import RuntimeConfig, init_from_env, shutdown
from haloflow.models.dlrm import dlrm_loss

ROOT = Path(__file__).resolve().parents[1]


def _common(name: str = "dlrm_common"):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"tests/engine/scripts/{name}.py")
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

    # the halo exchange on CUDA: buffers and ids on the device, NCCL's stream ordered after the gather by
    # the process group and before the consumer by wait(); here rank 0 sends rows to itself
    n, f = 5000, 32
    ids = torch.randperm(n)[:1200]
    ex = HaloExchange(ids, [ids.numel()], [ids.numel()], n_inner=n, group=ctx.group)
    x = torch.randn(n, f, device=ctx.device, requires_grad=True)
    handle = ex.start(x)
    busy = torch.randn(2048, 2048, device=ctx.device) @ torch.randn(2048, 2048, device=ctx.device)  # overlaps
    halo = handle.wait()
    halo.sum().backward()  # the reverse exchange: each sent row gets a gradient of ones back
    dev_ids = ids.to(ctx.device)
    want = torch.zeros(n, f, device=ctx.device).index_add_(0, dev_ids, torch.ones(ids.numel(), f, device=ctx.device))
    check("halo exchange on CUDA", halo.is_cuda and torch.equal(halo, x.detach()[dev_ids])
          and torch.equal(x.grad, want) and all(b.is_cuda for b in ex._buffers.values()) and busy.is_cuda,
          f"{ids.numel()} rows x {f}, forward and backward")

    # GCN training on CUDA computes what it computes on the CPU: 20 epochs, losses to 1e-5
    graphs = _common("common")
    dataset = graphs.small_dataset(num_nodes=400, num_edges=2000, feat_dim=16, num_classes=4, seed=3)
    for precompute in (True, False):
        runs = {}
        for device in ("cpu", "cuda"):
            cfg = GCNTrainConfig(dataset="in-memory", epochs=20, hidden_dim=16, precompute_first=precompute,
                                 runtime=RuntimeConfig(device=device, progress=False))
            runs[device] = train_gcn(cfg, dataset=dataset)
        a = torch.tensor([e.loss for e in runs["cpu"].history])
        b = torch.tensor([e.loss for e in runs["cuda"].history])
        where = {k for v in runs["cuda"].devices.values() for k in v}
        check(f"GCN on CUDA = CPU (precompute={precompute})", torch.allclose(a, b, atol=1e-5, rtol=0)
              and where == {"cuda"}, f"max |loss difference| {float((a - b).abs().max()):.2e}, tensors on {where}")

    # DLRM training through the trainer on CUDA: model and batches on the device, same losses as on the CPU.
    # Two one-process runs: they must not join this script's NCCL group (the CPU run would find a CUDA group).
    shutdown()
    small = dict(synthetic=True, synthetic_max_rows=40, synthetic_train=160, synthetic_val=64, batch_size=32,
                 embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,), log_every=1)
    cpu = train_dlrm(DLRMTrainConfig(**small, runtime=RuntimeConfig(device="cpu", progress=False)))
    gpu = train_dlrm(DLRMTrainConfig(**small, runtime=RuntimeConfig(device="cuda", progress=False)))
    diff = max(abs(p - q) for p, q in zip(cpu.losses, gpu.losses))
    check("DLRM trainer on CUDA = CPU", diff < 1e-5 and gpu.devices == {"model": {"cuda"}, "batches": {"cuda"}},
          f"max |loss difference| {diff:.2e}, {gpu.devices}")


if __name__ == "__main__":
    main()
