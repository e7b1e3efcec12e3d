"""`haloflow train gcn`: parse the arguments into a `GCNTrainConfig` and call `train_gcn`.

::

    haloflow train gcn --dataset PATH                           single process
    haloflow train gcn --partitions DIR --nproc K               one rank per part, torchrun started for you
    torchrun --nproc-per-node K -m haloflow train gcn --partitions DIR    the same, under your own torchrun
"""

from __future__ import annotations

import argparse
import logging

from haloflow.cli.reader_args import READER_FLAGS, add_reader_arguments, reader_options
from haloflow.cli.runtime_args import add_runtime_arguments, folder_parts, launch_or_train, runtime_config

__all__ = ["register", "config_from_args"]

log = logging.getLogger(__name__)

# config field -> flag, for error messages
FLAGS = {"hidden_dim": "--hidden", "num_layers": "--layers", "dataset_format": "--format",
         "weight_decay": "--weight-decay", "halo_keep": "--halo-keep", "bucket_bytes": "--bucket-bytes",
         "dataset": "--dataset", "partitions": "--partitions", **READER_FLAGS}


def register(subparsers: argparse._SubParsersAction) -> None:
    from haloflow.engine.gcn.train import GCNTrainConfig

    d = GCNTrainConfig(dataset="-")  # the defaults, shown in --help
    p = subparsers.add_parser(
        "gcn", help="full-batch GCN / GraphSAGE", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", metavar="PATH", help="a data set (SNAP, PACE, OGB folder, Planetoid folder)")
    src.add_argument("--partitions", metavar="DIR", help="a partition folder from `haloflow partition`")
    p.add_argument("--format", dest="dataset_format", default=d.dataset_format, help="format of --dataset")
    add_reader_arguments(p)
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="on layer 0's weights")
    p.add_argument("--optimizer", default=d.optimizer, help="adam or sgd")
    p.add_argument("--hidden", dest="hidden_dim", type=int, default=d.hidden_dim)
    p.add_argument("--layers", dest="num_layers", type=int, default=d.num_layers)
    p.add_argument("--dropout", type=float, default=d.dropout)
    p.add_argument("--conv", default=d.conv, help="gcn or sage")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--kernel", default=d.kernel, help="SpMM kernel on CPU: numba or torch")
    p.add_argument("--no-precompute", action="store_true",
                   help="Kipf's layer 0 (dropout on X, A X every epoch) instead of A X once with dropout on A X")
    p.add_argument("--no-normalize", action="store_true", help="keep the features as they are (no row sums of 1)")
    p.add_argument("--directed", action="store_true", help="with --dataset: do not symmetrise the graph")
    p.add_argument("--save", metavar="FILE", help="save the final model state (rank 0)")
    h = p.add_argument_group("halo exchange")
    h.add_argument("--staleness", type=int, default=d.halo.staleness, help="1: use the previous epoch's halos (PipeGCN)")
    h.add_argument("--halo-keep", type=float, default=d.halo.halo_keep, help="< 1: sample halo rows (BNS-GCN)")
    h.add_argument("--bucket-bytes", type=int, default=d.grad_sync.bucket_bytes,
                   help="largest weight-gradient bucket")
    add_runtime_arguments(p, d.runtime)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from haloflow.cli import name_flags
    from haloflow.engine.gcn.parallelize import HaloConfig
    from haloflow.engine.gcn.train import GCNTrainConfig
    from haloflow.engine.grad_sync import GradSyncConfig
    from haloflow.errors import ConfigError

    try:
        return GCNTrainConfig(
            dataset=args.dataset, partitions=args.partitions, dataset_format=args.dataset_format,
            reader_options=tuple(reader_options(args).items()),
            symmetrize=not args.directed, normalize_features=not args.no_normalize, hidden_dim=args.hidden_dim,
            num_layers=args.num_layers, dropout=args.dropout, conv=args.conv, seed=args.seed,
            precompute_first=not args.no_precompute, kernel=args.kernel, epochs=args.epochs, lr=args.lr,
            weight_decay=args.weight_decay, optimizer=args.optimizer, save=args.save,
            halo=HaloConfig(staleness=args.staleness, halo_keep=args.halo_keep, seed=args.seed),
            grad_sync=GradSyncConfig(bucket_bytes=args.bucket_bytes),
            runtime=runtime_config(args, GCNTrainConfig(dataset="-").runtime),
        )
    except ConfigError as err:
        raise name_flags(err, FLAGS) from None


def run(args: argparse.Namespace) -> int:
    from haloflow.engine.gcn.train import train_gcn
    from haloflow.errors import ConfigError

    config = config_from_args(args)  # validate here, before starting any process
    if args.nproc is not None and args.partitions is None:
        raise ConfigError("--nproc needs --partitions DIR (one rank per part); --dataset runs in one process")
    return launch_or_train(args, config, train_gcn, folder_parts(args.partitions))
