"""`haloflow train gcn`: parse the arguments into a `GCNTrainConfig` and call `train_gcn`.

::

    haloflow train gcn --dataset PATH                           single process
    torchrun --nproc-per-node K -m haloflow train gcn --partitions DIR    one rank per part
    haloflow train gcn --partitions DIR --nproc K               the same, with torchrun started for you
"""

from __future__ import annotations

import argparse
import logging
import os

from haloflow.engine.dist import launch_torchrun
from haloflow.errors import ConfigError

__all__ = ["register", "config_from_args", "rank_argv"]

log = logging.getLogger(__name__)

# (flag, dest, type) of every option forwarded unchanged to the ranks when --nproc starts torchrun
_OPTIONS = [
    ("--dataset", "dataset", str), ("--partitions", "partitions", str), ("--format", "dataset_format", str),
    ("--epochs", "epochs", int), ("--lr", "lr", float), ("--weight-decay", "weight_decay", float),
    ("--optimizer", "optimizer", str), ("--hidden", "hidden_dim", int), ("--layers", "num_layers", int),
    ("--dropout", "dropout", float), ("--conv", "conv", str), ("--seed", "seed", int),
    ("--staleness", "staleness", int), ("--halo-keep", "halo_keep", float), ("--timeout", "timeout_s", float),
    ("--kernel", "kernel", str), ("--log-jsonl", "log_jsonl", str), ("--save", "save", str),
]
_FLAGS = [("--no-precompute", "no_precompute"), ("--no-progress", "no_progress"),
          ("--no-normalize", "no_normalize"), ("--directed", "directed")]


def register(subparsers: argparse._SubParsersAction) -> None:
    from haloflow.engine.train_gcn import GCNTrainConfig

    d = GCNTrainConfig(dataset="-")  # the defaults, shown in --help
    p = subparsers.add_parser(
        "gcn", help="full-batch GCN / GraphSAGE", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", metavar="PATH", help="a data set (SNAP, PACE, OGB folder, Planetoid folder)")
    src.add_argument("--partitions", metavar="DIR", help="a partition folder from `haloflow partition`")
    p.add_argument("--nproc", type=int, metavar="K", help="start torchrun with K ranks (K = parts of DIR)")
    p.add_argument("--format", dest="dataset_format", default=d.dataset_format, help="format of --dataset")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="on layer 0's weights")
    p.add_argument("--optimizer", default=d.optimizer, help="adam or sgd")
    p.add_argument("--hidden", dest="hidden_dim", type=int, default=d.hidden_dim)
    p.add_argument("--layers", dest="num_layers", type=int, default=d.num_layers)
    p.add_argument("--dropout", type=float, default=d.dropout)
    p.add_argument("--conv", default=d.conv, help="gcn or sage")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--staleness", type=int, default=d.staleness, help="1: use the previous epoch's halos (PipeGCN)")
    p.add_argument("--halo-keep", type=float, default=d.halo_keep, help="< 1: sample halo rows (BNS-GCN)")
    p.add_argument("--timeout", dest="timeout_s", type=float, default=d.timeout_s,
                   help="seconds a rank waits for a silent peer before failing")
    p.add_argument("--kernel", default=d.kernel, help="SpMM kernel: numba or torch")
    p.add_argument("--log-jsonl", metavar="FILE", help="one JSON line per epoch (rank 0)")
    p.add_argument("--save", metavar="FILE", help="save the final model state (rank 0)")
    p.add_argument("--no-precompute", action="store_true", help="aggregate layer 0's input every epoch")
    p.add_argument("--no-normalize", action="store_true", help="keep the features as they are (no row sums of 1)")
    p.add_argument("--directed", action="store_true", help="with --dataset: do not symmetrise the graph")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from haloflow.engine.train_gcn import GCNTrainConfig

    kwargs = {dest: getattr(args, dest) for _, dest, _ in _OPTIONS}
    return GCNTrainConfig(**kwargs, precompute_first=not args.no_precompute, progress=not args.no_progress,
                          normalize_features=not args.no_normalize, symmetrize=not args.directed)


def rank_argv(args: argparse.Namespace) -> list[str]:
    """``-m haloflow train gcn ...`` with every option forwarded: what each rank runs under torchrun."""
    argv = ["-m", "haloflow"] + (["-v"] if getattr(args, "verbose", False) else []) + ["train", "gcn"]
    for flag, dest, _ in _OPTIONS:
        value = getattr(args, dest)
        if value is not None:
            argv += [flag, str(value)]
    return argv + [flag for flag, dest in _FLAGS if getattr(args, dest)]


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # validate here, before starting any process
    if args.nproc is not None:
        if args.nproc < 1:
            raise ConfigError(f"--nproc must be >= 1, got {args.nproc}")
        if args.partitions is None:
            raise ConfigError("--nproc needs --partitions DIR (one rank per part); --dataset runs in one process")
        if "WORLD_SIZE" in os.environ:
            raise ConfigError("--nproc starts torchrun itself; under torchrun, leave --nproc out")
        return launch_torchrun(args.nproc, rank_argv(args)).returncode

    from haloflow.engine.train_gcn import train_gcn

    result = train_gcn(config)
    if result.rank == 0:
        f = result.final
        print(f"epoch {f.epoch + 1}: loss {f.loss:.4f}  train {f.train_acc:.4f}  val {f.val_acc:.4f}  "
              f"test {f.test_acc:.4f}  ({result.world_size} rank{'s' if result.world_size > 1 else ''})")
    return 0
