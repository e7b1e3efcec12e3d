"""`haloflow train gcn`: parse the arguments into a `GCNTrainConfig` and call `train_gcn`.

::

    haloflow train gcn --dataset PATH                           single process
    haloflow train gcn --partitions DIR [--nproc K]             V / K parts per rank, torchrun started for you
    torchrun --nproc-per-node K -m haloflow train gcn --partitions DIR    the same, under your own torchrun

A run is defined by V, the partition folder's parts: any K that divides V with a power of two per rank (V = 4:
K = 1, 2 or 4) trains the same model bit for bit, every logged loss equal; so does --resume at another such K.
Each part computes on its own, whichever rank hosts it. A --dataset run is V = 1.
"""

from __future__ import annotations

import argparse
import functools

from haloflow.cli.config_args import ConfigArgs, HelpFormatter
from haloflow.cli.reader_args import add_reader_arguments, reader_options
from haloflow.cli.runtime_args import add_launch_arguments, folder_parts, launch_or_train

__all__ = ["register", "config_from_args"]


@functools.cache
def _config_args() -> ConfigArgs:
    from haloflow.engine.gcn.config import GCNTrainConfig

    return ConfigArgs(GCNTrainConfig)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("gcn", help="full-batch GCN / GraphSAGE", description=__doc__,
                              formatter_class=HelpFormatter)
    inputs = p.add_mutually_exclusive_group(required=True)  # GCNTrainConfig takes exactly one
    _config_args().add_arguments(p, into={"dataset": inputs, "partitions": inputs})
    add_reader_arguments(p)
    add_launch_arguments(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    return _config_args().build(args, given={"reader_options": tuple(reader_options(args).items())})


def run(args: argparse.Namespace) -> int:
    from haloflow.errors import ConfigError

    config = config_from_args(args)  # validate here, before starting any process
    if args.nproc is not None and config.partitions is None:
        raise ConfigError("--nproc needs --partitions DIR (V / K parts per rank); --dataset runs in one process")

    # V / K parts per rank: K checked against the folder's V before any rank starts
    return launch_or_train(args, config, "gcn", folder_parts(config.partitions), hosted=True)
