"""Gradient sync: bytes per rank per step and time, reduce-scatter + all-gather against an all-gather + sum.

    haloflow bench grad-sync [--ks 2,4] [--steps 30] [--out bench-results/grad_sync.json]

Both schemes sum the ranks' gradients in rank order, so both are bit-identical on every rank (checked here on
every step); they differ in what moves. For P weights on K ranks, per rank and step:

    all-gather + sum (the control; haloflow's scheme before)   receives (K-1) P floats, sends (K-1) P
    reduce-scatter + all-gather (``BucketedGradSync``)         sends 2 P (K-1) / K floats, receives the same

Models: GCN (the ``gcn-dist`` model: 64 -> 64 -> 64 -> 16, and Cora's 1433 -> 16 -> 7) and DLRM (the Kaggle MLPs
13-512-256-64-16 and 367-512-256-1). Each K runs under torchrun with one thread per rank; the schemes run
interleaved on the same gradients, each timed from a barrier to its last wait (the slowest rank).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from haloflow.bench.args import at_least, k_list
from haloflow.utils.help_format import HelpFormatter

MODELS = {  # name -> parameter shapes
    "gcn 64-64-64-16": [(64, 64), (64, 64), (64, 16), (64,), (64,), (16,)],
    "gcn cora 1433-16-7": [(1433, 16), (16, 7), (16,), (7,)],
    "dlrm kaggle MLPs": [(512, 13), (512,), (256, 512), (256,), (64, 256), (64,), (16, 64), (16,),
                         (512, 367), (512,), (256, 512), (256,), (1, 256), (1,)],
}


class AllGatherSum:
    """The control: one all-gather of every gradient, then the K rows summed in rank order (what haloflow did)."""

    def __init__(self, params: list[nn.Parameter], group):
        self.params, self.group = params, group
        self.world = torch.distributed.get_world_size(group)
        n = sum(p.numel() for p in params)
        self.flat = torch.zeros(n)
        self.rows = torch.empty(self.world, n)
        self.bytes = 0

    def sync(self) -> None:
        torch.cat([p.grad.reshape(-1) for p in self.params], out=self.flat)
        torch.distributed.all_gather(list(self.rows.unbind(0)), self.flat, group=self.group)
        self.bytes += self.flat.numel() * 4 * (self.world - 1)
        total = self.rows[0].clone()
        for r in range(1, self.world):
            total += self.rows[r]
        off = 0
        for p in self.params:
            p.grad.copy_(total[off : off + p.numel()].view_as(p))
            off += p.numel()


def worker(args) -> None:
    from haloflow.engine.comm import CommStats
    from haloflow.engine.grad_sync import BucketedGradSync
    from haloflow.engine.runtime import Runtime, RuntimeConfig

    with Runtime.start(RuntimeConfig(device="cpu", timeout_s=300, progress=False), distributed=True) as rt:
        group, rank, K = rt.layout.group, rt.layout.rank, rt.layout.world_size
        results = {}
        for name, shapes in MODELS.items():
            params = [nn.Parameter(torch.zeros(s)) for s in shapes]
            coefs = [torch.randn(s, generator=torch.Generator().manual_seed(7 * rank + i)) for i, s in enumerate(shapes)]
            stats = CommStats()
            ours = BucketedGradSync(params, group, stats=stats)
            control = AllGatherSum(params, group)
            times = {"reduce-scatter + all-gather": [], "all-gather + sum": []}
            equal = True
            for step in range(args.steps + 1):
                got = {}
                for scheme in (times if step % 2 == 0 else list(times)[::-1]):
                    for p in params:
                        p.grad = None
                    torch.distributed.barrier()
                    t0 = time.perf_counter()
                    if scheme == "all-gather + sum":
                        ours.remove()  # no hooks: the control syncs by hand
                        sum((p * c).sum() for p, c in zip(params, coefs)).backward()
                        control.sync()
                        ours = BucketedGradSync(params, group, stats=stats)
                    else:
                        sum((p * c).sum() for p, c in zip(params, coefs)).backward()
                        ours.wait()
                    dt = time.perf_counter() - t0
                    if step:  # step 0 warms up both
                        times[scheme].append(dt)
                    got[scheme] = torch.cat([p.grad.reshape(-1) for p in params])
                equal &= torch.equal(got["reduce-scatter + all-gather"], got["all-gather + sum"])
            steps = args.steps + 1
            results[name] = {"params": sum(p.numel() for p in params), "buckets": len(ours.buckets),
                             "bytes_ours": stats.grad_bytes / steps, "bytes_control": control.bytes / steps,
                             "s_ours": statistics.median(times["reduce-scatter + all-gather"]),
                             "s_control": statistics.median(times["all-gather + sum"]), "bit_identical": equal}
        gathered = [None] * K
        torch.distributed.all_gather_object(gathered, results)
        if rt.layout.is_main:
            Path(args.worker_out).write_text(json.dumps(gathered))


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--ks", type=k_list, default="2,4", help="rank counts to run, comma-separated")
    p.add_argument("--steps", type=at_least(1), default=30, help="timed steps per scheme")
    p.add_argument("--out", default="bench-results/grad_sync.json", help="where the JSON results go")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    from haloflow.engine.launch import launch_torchrun
    from haloflow.utils.atomic import atomic_write_text
    from haloflow.utils.table import format_table

    rows, records = [], []
    with tempfile.TemporaryDirectory(prefix="grad_sync-") as tmp:
        for k in [int(x) for x in args.ks.split(",")]:
            out = Path(tmp) / f"k{k}.json"
            proc = launch_torchrun(k, ["-m", "haloflow.bench.grad_sync", "--worker", "--worker-out", out,
                                       "--steps", args.steps], threads_per_rank=1, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"K={k} failed:\n{proc.stderr[-3000:]}")
            per_rank = json.loads(out.read_text())
            for name in MODELS:
                rs = [r[name] for r in per_rank]
                P = rs[0]["params"]
                ours = max(r["bytes_ours"] for r in rs)
                formula = 2 * P * (k - 1) / k * 4
                s_ours, s_ctl = max(r["s_ours"] for r in rs), max(r["s_control"] for r in rs)
                identical = all(r["bit_identical"] for r in rs)
                rows.append([k, name, P, rs[0]["buckets"], round(ours), round(formula), round(rs[0]["bytes_control"]),
                             1000 * s_ours, 1000 * s_ctl, s_ours / s_ctl, identical])
                records.append({"k": k, "model": name, "params": P, "per_rank": rs, "bytes_formula": formula})
    print(format_table(["K", "model", "P", "buckets", "bytes/rank ours", "2P(K-1)/K x 4", "bytes all-gather",
                        "ms ours", "ms all-gather", "time ratio", "bit-identical"], rows,
                       float_fmt=[".0f"] * 7 + [".2f", ".2f", ".2f", ""],  # bytes are ints
                       title="gradient sync per step, 1 thread per rank (gloo)"))
    atomic_write_text(args.out, json.dumps({"benchmark": "grad_sync", "runs": records}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
