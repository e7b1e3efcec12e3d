"""`haloflow demo`: the whole flow on a generated graph, in one command.

    1. generate a planted-partition graph (labels = blocks, noisy class-centroid features)
    2. partition it into K parts (METIS by default), with halos, on disk
    3. train a 2-layer GCN on that folder on one process (hosting all K parts), then on K processes (torchrun, gloo)
    4. print both runs side by side: the distributed run computes what the single process computes, bit for bit
       (every epoch's loss equal: a run is defined by the folder's parts, not by the processes)

Everything is written under ``--out`` (default ``runs/demo``); nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from haloflow.cli import name_flags
from haloflow.data.generators import SBMConfig, sbm_dataset
from haloflow.errors import ConfigError
from haloflow.partition.api import METHODS, PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from haloflow.utils.table import format_table
from haloflow.utils.help_format import HelpFormatter

__all__ = ["register", "run"]

COMMAND = "demo"
HELP = "generate a graph, partition it and train a GCN on 1 and on K processes"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        COMMAND, help=HELP,
        description=__doc__, formatter_class=HelpFormatter,
    )
    p.add_argument("--nodes", type=int, default=20_000, help="nodes of the generated graph (default 20,000)")
    p.add_argument("--classes", type=int, default=8, help="blocks = classes (default 8)")
    p.add_argument("--nproc", type=int, default=2, metavar="K", help="processes of the distributed run, a power of two: one process hosts all "
                   "K parts (default 2)")
    p.add_argument("--method", choices=METHODS, default="metis", help="partitioner (default metis)")
    p.add_argument("--epochs", type=int, default=100, help="training epochs (default 100)")
    p.add_argument("--hidden", type=int, default=64, help="hidden width (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the partition and the weights")
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="working folder (default runs/demo)")
    p.set_defaults(func=run)


def _train(parts_dir: Path, nproc: int, args: argparse.Namespace, log: Path) -> tuple[list[dict], dict, float]:
    from haloflow.cli import main as cli_main

    argv = ["train", "gcn", "--partitions", str(parts_dir), "--epochs", str(args.epochs), "--hidden",
            str(args.hidden), "--seed", str(args.seed), "--log-jsonl", str(log),
            "--no-normalize"]  # the generated features are centred Gaussians: row-sum normalisation would break them
    if nproc > 1:
        argv += ["--nproc", str(nproc)]
    t0 = time.perf_counter()
    code = cli_main(argv)
    secs = time.perf_counter() - t0
    if code != 0:
        raise ConfigError(f"training on {nproc} process(es) failed with exit status {code}; see the output above")
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    summary = next(r for r in records if r["kind"] == "summary")
    return epochs, summary, secs


def _check(args: argparse.Namespace) -> SBMConfig:
    """The graph's, the partitions' and the training's configs built from the flags (each checks itself), so that a
    bad value is refused before a graph is generated or a folder written; returns the graph's."""
    from haloflow.engine.gcn.config import GCNTrainConfig

    try:
        sbm = SBMConfig(num_nodes=args.nodes, num_classes=args.classes, seed=args.seed)
        for k in sorted({1, args.nproc}):
            PartitionConfig(num_parts=k, method=args.method, seed=args.seed)
        GCNTrainConfig(dataset="demo", epochs=args.epochs, hidden_dim=args.hidden, seed=args.seed)
    except ConfigError as err:
        names = {"num_nodes": "--nodes", "num_classes": "--classes", "PartitionConfig.num_parts": "--nproc",
                 "PartitionConfig.seed": "--seed", "hidden_dim": "--hidden", "epochs": "--epochs"}
        raise name_flags(err, names) from None
    if args.nproc > args.nodes:
        raise ConfigError(f"--nproc {args.nproc} is more parts than --nodes {args.nodes}")
    return sbm


def run(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {args.nproc}")
    if args.nproc & (args.nproc - 1):
        raise ConfigError(f"--nproc must be a power of two (one process hosts all K parts, a power of two per "
                          f"process), got {args.nproc}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; expected a folder (created if missing)")
    sbm = _check(args)  # every setting, before anything is generated or written
    out.mkdir(parents=True, exist_ok=True)
    dataset = sbm_dataset(sbm)
    print(f"[1/3] generated {dataset.name}: {dataset.num_nodes:,} nodes, {dataset.graph.num_edges:,} edges, "
          f"{dataset.features.shape[1]} features, {dataset.num_classes} classes")

    print(f"[2/3] partitioning into {args.nproc} parts ({args.method})")
    parts = out / f"parts-{args.nproc}"
    summary = partition_dataset(dataset, PartitionConfig(num_parts=args.nproc, method=args.method, seed=args.seed),
                                parts, overwrite=True, progress=False)
    if args.nproc > 1:
        print(summary.report())

    print(f"[3/3] training a 2-layer GCN for {args.epochs} epochs on 1 process, then on {args.nproc}")
    results = {k: _train(parts, k, args, out / f"train-{k}.jsonl") for k in sorted({1, args.nproc})}
    rows = [[f"{k} x {s['threads_per_rank']}", f"{r[-1]['loss']:.6f}", f"{r[-1]['train_acc']:.4f}",
             f"{r[-1]['val_acc']:.4f}", f"{r[-1]['test_acc']:.4f}", f"{s['startup_s']:.1f}",
             f"{1000 * s['train_s'] / max(s['units_trained'], 1):.0f}", f"{secs:.1f}"]
            for k, (r, s, secs) in results.items()]
    print(format_table(["ranks x threads", "final loss", "train acc", "val acc", "test acc", "start-up s",
                        "ms / epoch", "wall s"], rows))
    print(f"this machine has {os.cpu_count()} cores: K ranks share them (threads per rank = cores / K), so K ranks "
          "here are no faster than one - the start-up (processes, group, loading) and the halo exchange are extra; "
          "on K machines or GPUs each rank has its own.")
    if len(results) > 1:
        (a, _, _), (b, _, _) = results[1], results[args.nproc]
        differ = sum(x["loss"] != y["loss"] for x, y in zip(a, b))
        same = differ == 0 and len(a) == len(b) and a[-1]["test_acc"] == b[-1]["test_acc"]
        print(f"{args.nproc} processes vs 1: epochs whose loss differs: {differ} of {len(a)} -> "
              f"{'the same model, bit for bit' if same else 'MISMATCH'}")
        return 0 if same else 1
    return 0
