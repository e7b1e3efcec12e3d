"""Distributed GCN epoch time at K = 1, 2, 4 ranks, bytes exchanged against the prediction, overlap, cost model.

    haloflow bench gcn-dist [--scale 20] [--ks 1,2,4] [--epochs 5] [--threads T] [--method metis]
                            [--device cpu] [--out bench-results/gcn_dist.json]

A planted-partition graph of 2^scale nodes is partitioned (``--method``, default METIS) for each K; ``torchrun``
runs each K with OMP threads = ``--threads`` per rank (default cores / K, at least 1). Per K it reports:

- epoch time (median training step after one warm-up epoch per schedule) and its ratio to K = 1;
- halo bytes per epoch, measured by the engine, next to the prediction (halo sizes x width x 4 bytes, forward
  and backward) - they must be equal;
- the overlapped schedule against a control that waits for every halo before any inner compute (forward and
  backward), interleaved in one job on the same partition; the bare all-to-alls of one epoch on preallocated
  buffers, and the inner SpMMs alone (forward and backward); overlap = (T_control - T_overlapped) /
  min(T_exchange, T_inner): the share of the hideable time that the schedule really hid. A schedule that hides
  nothing scores about 0, whatever the blocked time says;
- the cost model's predicted epoch time (``haloflow.engine.gcn.cost_model``) from the partition statistics, compute
  rates measured here in one process and the bandwidth of the standalone exchange. The rate of "other" work per
  activation element comes from timing a whole single-process training step with the same threads, so K = 1
  is the calibration point and K = 2, 4 are the predictions to judge.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from haloflow.bench.args import at_least, k_list
from haloflow.partition.api import METHODS
from haloflow.utils.help_format import HelpFormatter

CORES = os.cpu_count() or 1


def _model_config(args, in_dim: int, out_dim: int):
    from haloflow.models.gcn import GCNConfig

    return GCNConfig(in_dim=in_dim, out_dim=out_dim, hidden_dim=args.hidden, num_layers=args.layers)


# ------------------------------------------------------------------------------------------------ worker (per rank)
def _barrier_time(fn, device, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs, every run started together on all ranks."""
    from haloflow.engine.runtime import synchronize

    times = []
    for _ in range(repeats):
        torch.distributed.barrier()
        synchronize(device)  # on CUDA the clock reads the device's finished work
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bare_exchanges(agg, widths, device) -> callable:
    """One epoch's all-to-alls (each exchanging layer, forward and backward) on preallocated buffers, nothing else."""
    import torch.distributed as dist

    calls = []
    for layer, w in widths:
        ex = agg._exchange(layer)  # the rank's exchange of its hosted parts
        send = torch.zeros(sum(ex.send_counts), w, device=device)  # (sum send, w)
        halo = torch.zeros(sum(ex.recv_counts), w, device=device)  # (rows received, w)
        calls.append((halo, send, ex.recv_counts, ex.send_counts))  # forward: rows to the halo holders
        calls.append((send, halo, ex.send_counts, ex.recv_counts))  # backward: halo gradients to the owners

    def run():
        for out, inp, recv, sent in calls:
            dist.all_to_all_single(out, inp, recv, sent, group=agg.group)  # blocking: the exchange alone

    return run


def _inner_compute(agg, widths, device) -> callable:
    """One epoch's inner SpMMs alone (A_inner @ h forward and its backward), the work an exchange can hide behind."""
    pairs = [(a_inner, torch.randn(p.n_inner, w, device=device, requires_grad=True),
              torch.randn(p.n_inner, w, device=device)) for _, w in widths for p, (a_inner, _) in zip(agg.parts, agg.ops)]

    def run():
        for a_inner, x, g in pairs:
            (a_inner @ x).backward(g)
            x.grad = None

    return run


def worker(args) -> None:
    from dataclasses import replace

    from haloflow.engine.gcn.train import GCNFamily, GCNTrainConfig
    from haloflow.engine.runtime import Runtime, RuntimeConfig

    cfg = GCNTrainConfig(partitions=args.partitions, hidden_dim=args.hidden, num_layers=args.layers,
                         normalize_features=False, runtime=RuntimeConfig(timeout_s=600, progress=False,
                                                                         device=args.device))
    with Runtime.start(cfg.runtime, distributed=True) as rt:
        device, K = rt.layout.device, rt.layout.world_size
        family = GCNFamily(cfg)  # the trainer's own training step, with the trainer's optimizer
        family.setup(rt)
        family.begin(0)
        model, agg, stats = family.model, family.agg, family.stats
        epoch = [0]

        def step():
            family.train_step(epoch[0])
            epoch[0] += 1

        schedules = {name: replace(agg.config, schedule=name) for name in ("overlap", "wait_first")}
        for config in schedules.values():  # warm-up: buffers, kernels, both schedules once
            agg.config = config
            step()
        times = {name: [] for name in schedules}
        for r in range(args.epochs):  # interleaved, so both see the same machine
            order = list(schedules) if r % 2 == 0 else list(schedules)[::-1]
            for name in order:
                agg.config = schedules[name]
                times[name].append(_barrier_time(step, device, 1))
        stats.reset()
        agg.config = schedules["overlap"]
        step()
        halo_bytes = stats.halo_bytes
        widths = [(layer, w) for layer, w in _layer_widths(model.config)]
        exchange_s = _barrier_time(_bare_exchanges(agg, widths, device), device, 5) if K > 1 else 0.0
        inner_s = _barrier_time(_inner_compute(agg, widths, device), device, 5)
        row = [statistics.median(times["overlap"]), statistics.median(times["wait_first"]), exchange_s, inner_s,
               halo_bytes]
        rows = torch.zeros(K, len(row), dtype=torch.float64)
        torch.distributed.all_gather(list(rows.unbind(0)), torch.tensor(row, dtype=torch.float64))
        if rt.layout.is_main:
            slowest = rows.max(0).values
            Path(args.worker_out).write_text(json.dumps({
                "epoch_s": float(slowest[0]), "control_epoch_s": float(slowest[1]),
                "exchange_alone_s": float(slowest[2]), "inner_alone_s": float(slowest[3]),
                "halo_bytes": int(rows[:, 4].sum()), "threads_per_rank": rt.threads, "device": str(device),
                "epochs_each": args.epochs,
            }))


def _layer_widths(model_cfg) -> list[tuple[int, int]]:
    """(layer, width it exchanges) of every layer that exchanges halos (layer 0 is precomputed)."""
    d = model_cfg.dims
    return [(layer, d[layer + 1] if model_cfg.transform_first(layer) else d[layer])
            for layer in range(1, model_cfg.num_layers)]


def overlap_ratio(control_s: float, overlapped_s: float, exchange_s: float, inner_s: float) -> float | None:
    """How much of the hideable time the overlapped schedule hid: (T_control - T_overlapped) / min(T_exch, T_inner).

    1.0: all of the smaller of the two was hidden; 0: nothing (the schedules took equally long); negative: the
    overlapped schedule was slower.
    """
    hideable = min(exchange_s, inner_s)
    return (control_s - overlapped_s) / hideable if hideable > 0 else None


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
    from haloflow.engine.gcn.cost_model import Rates
    from haloflow.models.aggregate import LocalAggregator
    from haloflow.kernels.keyed_dropout import keyed_dropout

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
    from haloflow.engine.gcn.cost_model import PartLoad, predict_epoch
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
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--scale", type=at_least(1, 40), default=20, help="2^scale nodes")
    p.add_argument("--ks", type=k_list, default="1,2,4", help="rank counts to run, comma-separated")
    p.add_argument("--epochs", type=at_least(1), default=5, help="timed epochs per schedule (after one warm-up each)")
    p.add_argument("--feat", type=int, default=64, help="input feature width")
    p.add_argument("--hidden", type=int, default=64, help="hidden width")
    p.add_argument("--layers", type=int, default=3, help="graph convolutions")
    p.add_argument("--degree", type=float, default=10.0, help="mean degree of the block graph")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank, the same at every K (default 0: cores // K, at least 1)")
    p.add_argument("--method", default="metis", choices=METHODS,
                   help="partitioner (metis needs pymetis; fennel and random do not)")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    p.add_argument("--out", default="bench-results/gcn_dist.json", help="where the JSON results go")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--partitions", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    from dataclasses import replace

    from haloflow.data.generators import sbm_dataset
    from haloflow.engine.gcn.cost_model import PartLoad, halo_bytes_per_epoch, predict_epoch
    from haloflow.engine.launch import launch_torchrun
    from haloflow.partition.api import PartitionConfig
    from haloflow.partition.format import load_partition
    from haloflow.partition.pipeline import partition_dataset
    from haloflow.utils.atomic import atomic_write_text
    from haloflow.utils.table import format_table

    ks = [int(k) for k in args.ks.split(",")]
    n = 1 << args.scale
    t0 = time.perf_counter()
    dataset = sbm_dataset(num_nodes=n, avg_degree=args.degree, feature_dim=args.feat, num_classes=16)
    print(f"graph: {n:,} nodes, {dataset.graph.num_edges:,} entries ({time.perf_counter() - t0:.1f} s); "
          f"{CORES} cores here", flush=True)
    model_cfg = _model_config(args, args.feat, dataset.num_classes)
    rows, records = [], []
    base = None
    with tempfile.TemporaryDirectory(prefix="gcn_dist-") as tmp:
        for k in ks:
            parts_dir = Path(tmp) / f"k{k}"
            t0 = time.perf_counter()
            partition_dataset(dataset, PartitionConfig(num_parts=k, method=args.method), parts_dir, progress=False)
            part_s = time.perf_counter() - t0
            loads = [PartLoad.from_part(load_partition(parts_dir, r)) for r in range(k)]
            threads = args.threads or max(1, CORES // k)
            out = Path(tmp) / f"k{k}.json"
            proc = launch_torchrun(k, ["-m", "haloflow.bench.gcn_dist", "--worker", "--partitions", parts_dir,
                                       "--worker-out", out, "--epochs", args.epochs, "--hidden", args.hidden,
                                       "--layers", args.layers, "--device", args.device],
                                   threads_per_rank=threads, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"K={k} failed:\n{proc.stderr[-3000:]}")
            res = json.loads(out.read_text())
            predicted_bytes = halo_bytes_per_epoch(loads, model_cfg)
            rates = measure_rates(dataset.graph, threads, args.hidden)
            rates = replace(rates, other_s=measure_other_rate(dataset, model_cfg, rates, threads))
            oversub = max(1.0, k * threads / CORES)  # K processes sharing fewer cores run proportionally slower
            rates = replace(rates, spmm_s=rates.spmm_s * oversub, gemm_s=rates.gemm_s * oversub,
                            elem_s=rates.elem_s * oversub)
            if k > 1 and res["exchange_alone_s"] > 0:  # bandwidth of the bare exchange, per rank
                worst = max(loads, key=lambda ld: ld.n_send + ld.n_halo)
                rates = replace(rates, byte_s=res["exchange_alone_s"] / halo_bytes_per_epoch([worst], model_cfg))
            pred = predict_epoch(loads, model_cfg, rates)
            base = base or res["epoch_s"]
            overlap = overlap_ratio(res["control_epoch_s"], res["epoch_s"], res["exchange_alone_s"],
                                    res["inner_alone_s"]) if k > 1 else None
            rows.append([k, res["threads_per_rank"], res["control_epoch_s"], res["epoch_s"], base / res["epoch_s"],
                         pred.total_s, res["exchange_alone_s"] if k > 1 else None, res["inner_alone_s"], overlap,
                         res["halo_bytes"], res["halo_bytes"] == predicted_bytes])
            records.append({"k": k, "partition_s": part_s, **res, "halo_bytes_predicted": predicted_bytes,
                            "bytes_match": res["halo_bytes"] == predicted_bytes,
                            "speedup_vs_k1": base / res["epoch_s"], "overlap": overlap,
                            "predicted_epoch_s": pred.total_s, "predicted_compute_s": pred.compute_s,
                            "predicted_comm_s": pred.comm_s, "predicted_exposed_s": pred.exposed_s,
                            "rates": rates.__dict__, "halo_rows": sum(ld.n_halo for ld in loads)})
            print(f"K={k}: control {res['control_epoch_s']:.3f} s, overlapped {res['epoch_s']:.3f} s, "
                  f"exchange alone {res['exchange_alone_s']:.3f} s, inner alone {res['inner_alone_s']:.3f} s",
                  flush=True)
    headers = ["K", "thr/rank", "control s", "overlapped s", "speedup", "model s", "exchange s", "inner s",
               "overlap", "halo bytes", "= predicted"]
    print(format_table(headers, rows, title=f"GCN epoch, {n:,} nodes, {args.layers} layers, hidden {args.hidden}, "
                       f"{args.device}; overlap = (control - overlapped) / min(exchange, inner)"))
    atomic_write_text(args.out, json.dumps({"scale": args.scale, "nodes": n, "entries": dataset.graph.num_edges,
                                            "method": args.method, "model": model_cfg.__dict__, "cores": CORES,
                                            "device": args.device, "runs": records}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
