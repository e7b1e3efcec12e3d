"""`haloflow demo`: the whole flow on a generated graph, in one command.

    1. generate a planted-partition graph (labels = blocks, noisy class-centroid features)
    2. partition it into 1 part and into K parts (METIS by default), with halos, on disk
    3. train a 2-layer GCN on one process, then on K processes (torchrun, gloo)
    4. print both runs side by side: the distributed run computes what the single process computes

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
    p.add_argument("--nproc", type=int, default=2, metavar="K", help="processes of the distributed run (default 2)")
    p.add_argument("--method", choices=METHODS, default="metis", help="partitioner (default metis)")
    p.add_argument("--epochs", type=int, default=100, help="training epochs (default 100)")
    p.add_argument("--hidden", type=int, default=64, help="hidden width (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the partition and the weights")
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="working folder (default runs/demo)")
    p.set_defaults(func=run)


def _train(parts_dir: Path, nproc: int, args: argparse.Namespace, log: Path) -> tuple[dict, dict, float]:
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
    return epochs[-1], summary, secs


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
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; expected a folder (created if missing)")
    sbm = _check(args)  # every setting, before anything is generated or written
    out.mkdir(parents=True, exist_ok=True)
    dataset = sbm_dataset(sbm)
    print(f"[1/3] generated {dataset.name}: {dataset.num_nodes:,} nodes, {dataset.graph.num_edges:,} edges, "
          f"{dataset.features.shape[1]} features, {dataset.num_classes} classes")

    print(f"[2/3] partitioning into 1 and {args.nproc} parts ({args.method})")
    dirs = {}
    for k in sorted({1, args.nproc}):
        dirs[k] = out / f"parts-{k}"
        summary = partition_dataset(dataset, PartitionConfig(num_parts=k, method=args.method, seed=args.seed),
                                    dirs[k], overwrite=True, progress=False)
        if k > 1:
            print(summary.report())

    print(f"[3/3] training a 2-layer GCN for {args.epochs} epochs on 1 process, then on {args.nproc}")
    results = {k: _train(dirs[k], k, args, out / f"train-{k}.jsonl") for k in dirs}
    rows = [[f"{k} x {s['threads_per_rank']}", f"{r['loss']:.6f}", f"{r['train_acc']:.4f}", f"{r['val_acc']:.4f}",
             f"{r['test_acc']:.4f}", f"{s['startup_s']:.1f}", f"{1000 * s['train_s'] / max(s['units_trained'], 1):.0f}", f"{secs:.1f}"]
            for k, (r, s, secs) in results.items()]
    print(format_table(["ranks x threads", "final loss", "train acc", "val acc", "test acc", "start-up s",
                        "ms / epoch", "wall s"], rows))
    print(f"this machine has {os.cpu_count()} cores: K ranks share them (threads per rank = cores / K), so K ranks "
          "here are no faster than one - the start-up (processes, group, loading) and the halo exchange are extra; "
          "on K machines or GPUs each rank has its own.")
    if len(results) > 1:
        (a, _, _), (b, _, _) = results[1], results[args.nproc]
        diff = abs(a["loss"] - b["loss"])
        n_test = int(dataset.test_mask.sum())
        flips = round(abs(a["test_acc"] - b["test_acc"]) * n_test)
        # float32 sums in another order move the loss in its 5th-6th digit; a node whose two best logits are
        # within rounding may flip its prediction, so a handful of flipped test nodes is still the same model.
        same = diff <= 1e-4 * max(1.0, abs(a["loss"])) and flips <= max(2, n_test // 2000)
        print(f"distributed vs single process: |loss difference| = {diff:.1e}, test predictions that differ: "
              f"{flips} of {n_test:,} -> {'the same model, to float32 rounding' if same else 'MISMATCH'}")
        return 0 if same else 1
    return 0
