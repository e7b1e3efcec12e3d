"""DLRM training benchmark: haloflow against plain PyTorch on one process, and the sharded engine on K ranks.

1. One process: training throughput (samples/s) of haloflow's ``DLRM`` (JaggedBatch input, ``dlrm_loss``,
   SGD lr 0.1, fused into the tables' backward; also through autograd's sparse gradients, as a second row)
   against a plain PyTorch DLRM written here (one ``nn.EmbeddingBag`` per table, the same MLPs,
   ids and offsets prepared ahead like a data loader would), in the same run, timed in alternating rounds so
   both see the same machine load; both start from the same weights and their losses are checked equal.
   Target: haloflow >= 0.95x plain.
2. K = 2 and 4 ranks (torchrun, gloo): the sharded DLRM on a plan from the planner; every step's bytes per
   rank must equal ``predict_step_bytes`` for the plan and the batch; throughput reported.

Synthetic Criteo-like batches (``haloflow.data.clicks``): Kaggle dims (26 tables, 13 dense, D = 16, bottom
512-256-64, top 512-256, batch 128). The tables are capped at ``--max-rows`` rows each (default 200,000;
Kaggle's three largest have 8-10 M) so that two copies fit comfortably in memory and start quickly.

    haloflow bench dlrm                       # ~2 minutes on 2 cores
    haloflow bench dlrm --ranks 2 --steps 20 --out /tmp/dlrm.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.engine.runtime import shutdown
from haloflow.engine.launch import launch_torchrun
from haloflow.models.dlrm import DLRM, DLRMConfig, EmbeddingTables, dlrm_loss
from haloflow.utils.atomic import atomic_write_text

TARGET = 0.95


# ----------------------------------------------------------------------------------- the plain peer
class PlainDLRM(nn.Module):
    """DLRM in plain PyTorch: EmbeddingBag per table, MLPs as nn.Sequential, dot interaction (no self pairs)."""

    def __init__(self, table_sizes, num_dense=13, dim=16, bottom=(512, 256, 64), top=(512, 256)):
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum", sparse=True) for n in table_sizes)
        self.bottom = self._mlp([num_dense, *bottom, dim], last_relu=True)
        T = len(table_sizes)
        self.top = self._mlp([dim + T * (T + 1) // 2, *top, 1], last_relu=False)
        self.li, self.lj = torch.tril_indices(T + 1, T + 1, offset=-1)

    @staticmethod
    def _mlp(widths, last_relu):
        layers = []
        for i, (m, n) in enumerate(zip(widths[:-1], widths[1:])):
            layers.append(nn.Linear(m, n))
            if last_relu or i < len(widths) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    def forward(self, dense, ids, offsets):
        z = self.bottom(dense)  # (B, D)
        pooled = [bag(i, o) for bag, i, o in zip(self.emb, ids, offsets)]  # T x (B, D)
        v = torch.stack([z, *pooled], dim=1)  # (B, T+1, D)
        dots = torch.bmm(v, v.transpose(1, 2))[:, self.li, self.lj]  # (B, T(T+1)/2)
        return self.top(torch.cat([z, dots], dim=1)).squeeze(1)  # (B,)


def copy_weights(src: DLRM, dst: PlainDLRM) -> None:
    with torch.no_grad():
        for bag, w in zip(dst.emb, src.embeddings.tables):
            bag.weight.copy_(w.weight)
        dst.bottom.load_state_dict(src.bottom.state_dict())
        dst.top.load_state_dict(src.top.state_dict())


def plain_inputs(sparse):
    """Per table: ids (B,) and bag offsets (B,), as the reference DLRM's loader hands them over."""
    T, B = sparse.lengths.shape
    starts = sparse.bag_offsets()[:, :-1]  # (T, B)
    bounds = sparse.feature_offsets().tolist()
    return [sparse.values[bounds[t]:bounds[t + 1]] for t in range(T)], [starts[t] for t in range(T)]


# ------------------------------------------------------------------------------------ one process
def single_process(args, sizes) -> dict:
    """haloflow's DLRM with SGD fused into the tables' backward (``EmbeddingTables(fused_sgd_lr=...)``, TorchRec's
    fused-optimizer style), the same model through autograd's sparse gradients and ``torch.optim.SGD`` (the path
    of earlier releases), and the plain peer: the same batches and weights, rounds in rotating order."""
    dev = torch.device(args.device)
    gen = ClickLogGenerator(ClickLogConfig(max_rows=args.max_rows or None, seed=0))
    batches = [b.to(dev) for b in gen.batches(args.batch_size, args.steps + args.warmup)]
    plain_batches = [plain_inputs(b.sparse) for b in batches]
    config = DLRMConfig(table_sizes=sizes)
    fused = DLRM(config, embeddings=EmbeddingTables(config.table_sizes, config.embedding_dim, config.seed,
                                                    fused_sgd_lr=0.1)).to(dev)
    model = DLRM(config).to(dev)
    plain = PlainDLRM(sizes).to(dev)
    copy_weights(model, plain)
    opts = {"haloflow": torch.optim.SGD(fused.parameters(), lr=0.1),  # the tables get no .grad: the MLPs only
            "haloflow-autograd": torch.optim.SGD(model.parameters(), lr=0.1),
            "plain": torch.optim.SGD(plain.parameters(), lr=0.1)}

    def step(name, b, inputs):
        opt = opts[name]
        opt.zero_grad(set_to_none=True)
        if name == "plain":
            loss = nn.functional.binary_cross_entropy_with_logits(plain(b.dense, *inputs), b.labels)
        else:
            loss = dlrm_loss((fused if name == "haloflow" else model)(b.dense, b.sparse), b.labels)
        loss.backward()
        opt.step()
        return loss.detach()

    names = list(opts)
    losses = {name: [] for name in names}
    for i in range(args.warmup):  # same batches, same weights: the three must agree step for step
        for name in names:
            losses[name].append(float(step(name, batches[i], plain_batches[i])))
    same = all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for name in names[:2]
               for a, b in zip(losses[name], losses["plain"]))
    rates = {name: [] for name in names}
    chunk = max(1, args.steps // args.rounds)
    for r in range(args.rounds):  # rotate, so a burst of load on the shared machine hits every contestant
        lo = args.warmup + r * chunk
        for name in names[r % 3:] + names[:r % 3]:
            t0 = time.perf_counter()
            for i in range(lo, lo + chunk):
                step(name, batches[i], plain_batches[i])
            if dev.type == "cuda":
                torch.cuda.synchronize()  # the clock stops when the device has finished
            rates[name].append(chunk * args.batch_size / (time.perf_counter() - t0))

    def ratio(name):  # the median of per-round ratios against the peer
        return statistics.median(a / b for a, b in zip(rates[name], rates["plain"]))

    return {"haloflow_samples_per_s": statistics.median(rates["haloflow"]),
            "autograd_samples_per_s": statistics.median(rates["haloflow-autograd"]),
            "plain_samples_per_s": statistics.median(rates["plain"]), "ratio": ratio("haloflow"),
            "autograd_ratio": ratio("haloflow-autograd"), "target": TARGET, "meets_target": ratio("haloflow") >= TARGET,
            "warmup_losses_equal": same, "rounds": args.rounds, "steps_per_round": chunk}


# ------------------------------------------------------------------------------------- K ranks
def launch(args, k: int) -> dict:
    out = Path(args.out).with_name(f".dlrm-k{k}-{os.getpid()}.json")
    worker_argv = ["-m", "haloflow.bench.dlrm", "--worker", "--out", out, "--steps", args.steps,
                   "--warmup", args.warmup, "--max-rows", args.max_rows, "--batch-size", args.batch_size,
                   "--memory-factor", args.memory_factor]
    proc = launch_torchrun(k, worker_argv, threads_per_rank=1, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"K={k} workers failed:\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    out.unlink()
    return result


def worker(args) -> None:
    import torch.distributed as dist

    from haloflow.data.jagged import split_sizes
    from haloflow.engine.runtime import init_from_env
    from haloflow.engine.dlrm.embedding_layout import predict_step_bytes
    from haloflow.engine.dlrm.sharding import shard_dlrm
    from haloflow.partition.planner.planner import plan_tables
    from haloflow.partition.planner.types import TableSpec, Topology

    ctx = init_from_env(timeout_s=120, device="cpu")
    gen = ClickLogGenerator(ClickLogConfig(max_rows=args.max_rows or None, seed=0))
    sizes = gen.sizes
    specs = [TableSpec(name=f"C{t + 1}", num_rows=n, dim=16) for t, n in enumerate(sizes)]
    # A budget below "every table on every rank" makes the planner shard the large tables.
    table_bytes = 4 * 16 * sum(sizes)
    budget = args.memory_factor * table_bytes / ctx.world_size
    plan = plan_tables(specs, Topology(world_size=ctx.world_size, memory_per_rank=budget))
    model = shard_dlrm(DLRM(DLRMConfig(table_sizes=sizes)), plan, ctx.group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n_dense = model.dense_buckets
    batches = list(gen.batches(args.batch_size, args.steps + args.warmup))
    # Predicted from the plan and each global batch alone, before the clock starts.
    predicted = [predict_step_bytes(model.embeddings.layout, b.sparse, split_sizes(b.batch_size, ctx.world_size),
                                    dense_buckets=n_dense)[ctx.rank] for b in batches]
    mismatches, step_bytes = 0, []
    t0 = None
    for i, b in enumerate(batches):
        if i == args.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        bs = split_sizes(b.batch_size, ctx.world_size)
        mine = b.split_batch(bs)[ctx.rank]
        model.stats.reset()
        opt.zero_grad(set_to_none=True)
        loss = dlrm_loss(model(mine.dense, mine.sparse, bs), mine.labels, global_batch_size=b.batch_size)
        loss.backward()
        model.finish_grad_sync()
        opt.step()
        got = model.stats.snapshot()
        mismatches += got != predicted[i]
        step_bytes.append(sum(got.values()))
    dist.barrier()
    seconds = time.perf_counter() - t0
    per_rank = [None] * ctx.world_size
    dist.all_gather_object(per_rank, {"bytes_per_step": statistics.mean(step_bytes), "mismatches": mismatches})
    if ctx.rank == 0:
        kinds = {}
        for tp in plan.tables:
            kinds[tp.sharding.value] = kinds.get(tp.sharding.value, 0) + 1
        Path(args.out).write_text(json.dumps({
            "world_size": ctx.world_size, "samples_per_s": args.steps * args.batch_size / seconds,
            "bytes_per_step_per_rank": [r["bytes_per_step"] for r in per_rank],
            "bytes_checked_steps": len(batches),
            "bytes_equal_prediction": all(r["mismatches"] == 0 for r in per_rank), "plan_kinds": kinds,
        }))
    shutdown()



def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps (one process: losses compared on these)")
    p.add_argument("--rounds", type=int, default=6, help="alternating timing rounds (one process)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--max-rows", type=int, default=200_000,
                   help="cap on a table's rows (Kaggle scaled down); 0: the full Kaggle sizes")
    p.add_argument("--device", default="cpu", help="device of the one-process runs (the K-rank runs use gloo on CPU)")
    p.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    p.add_argument("--memory-factor", type=float, default=1.2,
                   help="planner's memory per rank = this x (all tables' bytes / K)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the one-process runs (each of the K ranks uses one)")
    p.add_argument("--out", default="bench-results/dlrm.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    sizes = ClickLogConfig(max_rows=args.max_rows or None).sizes
    cap = f"capped at {args.max_rows:,} rows" if args.max_rows else "uncapped"
    print(f"tables: 26 Kaggle cardinalities {cap} ({sum(sizes):,} rows in all), D=16, batch {args.batch_size}, "
          f"one-process runs on {args.device} with {torch.get_num_threads()} torch threads")
    single = single_process(args, sizes)
    dist_results = [launch(args, k) for k in args.ranks]
    print(f"{'run':<22} {'samples/s':>10} {'vs plain':>9}  notes (sharded rows: vs the one-process plain run)")
    print(f"{'plain PyTorch (K=1)':<22} {single['plain_samples_per_s']:>10.0f} {1.0:>9.2f}")
    print(f"{'haloflow DLRM (K=1)':<22} {single['haloflow_samples_per_s']:>10.0f} {single['ratio']:>9.2f}  "
          f"SGD fused into the tables' backward; target >= {TARGET}: {'met' if single['meets_target'] else 'NOT met'}; "
          f"losses equal: {single['warmup_losses_equal']}")
    print(f"{'  autograd sparse path':<22} {single['autograd_samples_per_s']:>10.0f} {single['autograd_ratio']:>9.2f}  "
          "sparse gradients + torch.optim.SGD, as the peer")
    for r in dist_results:
        print(f"{'sharded K=' + str(r['world_size']):<22} {r['samples_per_s']:>10.0f} "
              f"{r['samples_per_s'] / single['plain_samples_per_s']:>9.2f}  bytes/step/rank "
              f"{[round(b) for b in r['bytes_per_step_per_rank']]} = prediction: {r['bytes_equal_prediction']}; "
              f"plan {r['plan_kinds']}")
    result = {"benchmark": "dlrm", "max_rows": args.max_rows, "device": args.device, "table_rows_total": sum(sizes),
              "batch_size": args.batch_size, "single_process": single, "sharded": dist_results}
    out = atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    ok = single["warmup_losses_equal"] and all(r["bytes_equal_prediction"] for r in dist_results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
