"""Distributed GCN epoch time at K = 1, 2, 4 ranks, bytes exchanged against the prediction, overlap, cost model.

    haloflow bench gcn-dist [--scale 20] [--ks 1,2,4] [--epochs 5] [--out bench-results/gcn_dist.json]

A planted-partition graph of 2^scale nodes is partitioned (METIS) for each K; ``torchrun`` runs each K with
OMP threads = cores / K per rank (at least 1). Per K it reports:

- epoch time (median training step after one warm-up epoch) and its ratio to K = 1;
- halo bytes per epoch, measured by the engine, next to the prediction (halo sizes x width x 4 bytes, forward
  and backward) - they must be equal;
- overlap = 1 - (time blocked on halos) / (time of the same exchanges run alone, blocking);
- the cost model's predicted epoch time (``haloflow.engine.cost_model``) from the partition statistics, compute
  rates measured here in one process and the bandwidth of the standalone exchange. The rate of "other" work per
  activation element comes from timing a whole single-process training step with the same threads, so K = 1
  is the calibration point and K = 2, 4 are the predictions to judge.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

CORES = os.cpu_count() or 1


def _model_config(args, in_dim: int, out_dim: int):
    from haloflow.models.gcn import GCNConfig

    return GCNConfig(in_dim=in_dim, out_dim=out_dim, hidden_dim=args.hidden, num_layers=args.layers)


# ------------------------------------------------------------------------------------------------ worker (per rank)
def _standalone_exchange_s(agg, model_cfg, repeats: int = 3) -> float:
    """Seconds of one epoch's halo exchanges (forward and backward) run alone, blocking, on this rank."""
    from haloflow.engine.cost_model import _exchange_widths
    from haloflow.engine.halo import HaloExchange

    best = float("inf")
    widths = _exchange_widths(model_cfg)
    exchanges = [HaloExchange.from_part(agg.part, agg.group) for _ in widths]
    for _ in range(repeats + 1):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        for ex, w in zip(exchanges, widths):
            x = torch.ones(agg.part.n_inner, w, requires_grad=True)
            halo = ex.start(x).wait()  # nothing to overlap with: the full exchange time
            halo.sum().backward()  # the reverse exchange
        best = min(best, time.perf_counter() - t0)
    return best


def worker(args) -> None:
    from haloflow.engine.dist import init_from_env, shutdown
    from haloflow.engine.train_gcn import GCNTrainConfig, train_gcn

    ctx = init_from_env(timeout_s=600, force_distributed=True)
    cfg = GCNTrainConfig(partitions=args.partitions, epochs=args.epochs + 1, hidden_dim=args.hidden,
                         num_layers=args.layers, progress=False, normalize_features=False)
    result = train_gcn(cfg)
    # rebuild the aggregator's view to time the exchanges alone (same part, same widths)
    from haloflow.engine.parallelize import HaloAggregator
    from haloflow.partition.format import load_partition

    part = load_partition(args.partitions, ctx.rank)
    agg = HaloAggregator(part, ctx.group)
    model_cfg = _model_config(args, part.features.shape[1], part.num_classes)
    alone = _standalone_exchange_s(agg, model_cfg) if ctx.world_size > 1 else 0.0
    rows = torch.zeros(ctx.world_size, dtype=torch.float64)
    torch.distributed.all_gather(list(rows.view(-1, 1).unbind(0)), torch.tensor([alone], dtype=torch.float64))
    if ctx.rank == 0:
        hist = result.history[1:]  # skip the warm-up epoch
        Path(args.worker_out).write_text(json.dumps({
            "epoch_s": statistics.median(e.epoch_s for e in hist),
            "eval_s": statistics.median(e.eval_s for e in hist),
            "halo_bytes": [e.halo_bytes for e in hist],
            "halo_blocked_s": statistics.median(e.halo_blocked_s for e in hist),
            "exchange_alone_s": float(rows.max()),
        }))
    shutdown()


# ------------------------------------------------------------------------------------------------ rates
def _time(fn, repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_rates(graph, threads: int, width: int):
    """Per-unit compute costs on this machine with ``threads`` threads (one process)."""
    from haloflow.engine.cost_model import Rates
    from haloflow.models.aggregate import LocalAggregator
    from haloflow.models.dropout import keyed_dropout

    torch.set_num_threads(threads)
    agg = LocalAggregator(graph)
    x = torch.randn(graph.num_nodes, width)
    spmm = _time(lambda: agg.op @ x) / (agg.op.nnz * width)
    a, b = torch.randn(graph.num_nodes, width), torch.randn(width, width)
    gemm = _time(lambda: a @ b) / (graph.num_nodes * width * width)
    ids = torch.arange(graph.num_nodes)
    elem = _time(lambda: keyed_dropout(a, ids, p=0.5, seed=0, epoch=0, layer=0, training=True)) / a.numel()
    return Rates(spmm_s=spmm, gemm_s=gemm, elem_s=elem, byte_s=0.0)


def measure_other_rate(dataset, model_cfg, rates, threads: int, repeats: int = 3) -> float:
    """Seconds per activation element that a whole training step (one process, the full graph) spends beyond
    the cost model's SpMM, GEMM and dropout terms: bias, relu, loss, backward elementwise kernels, Adam."""
    from haloflow.engine.cost_model import PartLoad, predict_epoch
    from haloflow.models import GCN, LocalAggregator, gcn_loss

    torch.set_num_threads(threads)
    graph = dataset.graph
    agg = LocalAggregator(graph)
    model = GCN(model_cfg)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.from_numpy(dataset.features)
    labels = torch.from_numpy(dataset.labels)
    mask = torch.from_numpy(dataset.train_mask)
    ids = torch.arange(graph.num_nodes)
    n_train = int(mask.sum())
    epoch = [0]

    def step():
        opt.zero_grad()
        gcn_loss(model(x, agg, ids, epoch[0]), labels, mask, n_train).backward()
        opt.step()
        epoch[0] += 1

    model.train()
    step_s = _time(step, repeats)
    modelled = predict_epoch([PartLoad.whole(graph.num_nodes, int(graph.indptr[-1]))], model_cfg,
                             rates).compute_s
    elements = graph.num_nodes * sum(model_cfg.dims[1:])
    return max(0.0, step_s - modelled) / elements


# ------------------------------------------------------------------------------------------------ driver
def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=20, help="2^scale nodes")
    p.add_argument("--ks", default="1,2,4")
    p.add_argument("--epochs", type=int, default=5, help="timed epochs (after one warm-up)")
    p.add_argument("--feat", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--degree", type=float, default=10.0)
    p.add_argument("--out", default="bench-results/gcn_dist.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--partitions", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    from dataclasses import replace

    from haloflow.data.generators import sbm_dataset
    from haloflow.engine.cost_model import PartLoad, halo_bytes_per_epoch, predict_epoch
    from haloflow.partition.api import PartitionConfig
    from haloflow.partition.format import load_partition
    from haloflow.partition.pipeline import partition_dataset
    from haloflow.utils.table import format_table

    ks = [int(k) for k in args.ks.split(",")]
    n = 1 << args.scale
    t0 = time.perf_counter()
    dataset = sbm_dataset(num_nodes=n, avg_degree=args.degree, feature_dim=args.feat, num_classes=16)
    print(f"graph: {n:,} nodes, {dataset.graph.num_edges:,} entries ({time.perf_counter() - t0:.1f} s)", flush=True)
    model_cfg = _model_config(args, args.feat, dataset.num_classes)
    rows, records = [], []
    base = None
    with tempfile.TemporaryDirectory(prefix="gcn_dist-") as tmp:
        for k in ks:
            parts_dir = Path(tmp) / f"k{k}"
            t0 = time.perf_counter()
            partition_dataset(dataset, PartitionConfig(num_parts=k, method="metis"), parts_dir, progress=False)
            part_s = time.perf_counter() - t0
            loads = [PartLoad.from_part(load_partition(parts_dir, r)) for r in range(k)]
            threads = max(1, CORES // k)
            out = Path(tmp) / f"k{k}.json"
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(k),
                   "-m", "haloflow.bench.gcn_dist", "--worker", "--partitions", str(parts_dir),
                   "--worker-out", str(out), "--epochs", str(args.epochs), "--hidden", str(args.hidden),
                   "--layers", str(args.layers)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"K={k} failed:\n{proc.stderr[-3000:]}")
            res = json.loads(out.read_text())
            predicted_bytes = halo_bytes_per_epoch(loads, model_cfg)
            rates = measure_rates(dataset.graph, threads, args.hidden)
            rates = replace(rates, other_s=measure_other_rate(dataset, model_cfg, rates, threads))
            oversub = max(1.0, k * threads / CORES)  # K processes sharing fewer cores run proportionally slower
            rates = replace(rates, spmm_s=rates.spmm_s * oversub, gemm_s=rates.gemm_s * oversub,
                            elem_s=rates.elem_s * oversub)
            if k > 1 and res["exchange_alone_s"] > 0:  # bandwidth of the standalone exchange, per rank
                worst = max(loads, key=lambda ld: ld.n_send + ld.n_halo)
                per_rank_bytes = halo_bytes_per_epoch([worst], model_cfg)
                rates = replace(rates, byte_s=res["exchange_alone_s"] / per_rank_bytes)
            pred = predict_epoch(loads, model_cfg, rates)
            base = base or res["epoch_s"]
            overlap = (1 - res["halo_blocked_s"] / res["exchange_alone_s"]) if k > 1 and res["exchange_alone_s"] else None
            measured_bytes = res["halo_bytes"][-1]
            rows.append([k, threads, part_s, res["epoch_s"], base / res["epoch_s"], pred.total_s,
                         measured_bytes, predicted_bytes, measured_bytes == predicted_bytes,
                         res["exchange_alone_s"] if k > 1 else None, res["halo_blocked_s"] if k > 1 else None, overlap])
            records.append({"k": k, "threads_per_rank": threads, "partition_s": part_s, **res,
                            "halo_bytes_predicted": predicted_bytes, "bytes_match": measured_bytes == predicted_bytes,
                            "speedup_vs_k1": base / res["epoch_s"], "overlap": overlap,
                            "predicted_epoch_s": pred.total_s, "predicted_compute_s": pred.compute_s,
                            "predicted_comm_s": pred.comm_s, "predicted_exposed_s": pred.exposed_s,
                            "rates": rates.__dict__, "halo_rows": sum(ld.n_halo for ld in loads)})
            print(f"K={k}: epoch {res['epoch_s']:.3f} s, predicted {pred.total_s:.3f} s", flush=True)
    headers = ["K", "thr", "partition s", "epoch s", "speedup", "model s", "halo bytes", "predicted", "equal",
               "exchange s", "blocked s", "overlap"]
    print(format_table(headers, rows, title=f"GCN epoch, {n:,} nodes, {args.layers} layers, hidden {args.hidden}"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"scale": args.scale, "nodes": n, "entries": dataset.graph.num_edges,
                               "model": model_cfg.__dict__, "cores": CORES, "runs": records}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
