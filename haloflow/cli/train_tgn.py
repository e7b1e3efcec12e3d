"""`haloflow train tgn --events FILE [--partitions DIR] [--nproc K] ...`: train a memory-based temporal GNN.

::

    haloflow train tgn --events ../shared/data/temporal/jodie_wikipedia_edges.csv --epochs 1
    haloflow partition EVENTS.csv --parts 4 --out runs/wiki-4        # node memory owned by part
    haloflow train tgn --events EVENTS.csv --partitions runs/wiki-4 --nproc 2
    haloflow train tgn --events EVENTS.csv --nproc 2 --resume CKPT   # at 1, 2 or 4 ranks: the same bits

Every batch is cut into V logical workers' slices (--logical-workers V: the partition folder's parts, else 4),
each computed on its own and summed in one order fixed by V, so that any --nproc K dividing V trains the same
model bit for bit (float32 included, the test AP too) and resumes at another such K bitwise. The price is the
per-slice cost of V / K smaller batches per rank (V = 4 on 2 cores: 1.9-2.2x the step time at K = 1, 1.2x at K = 2);
--no-k-invariance runs V = K.

The stream is split 70/15/15 by time; 10% of the nodes are held out of training for the inductive test. At the
end: AP and AUC on validation and test with one fixed negative per event (transductive, and inductive on events
with a held-out node), and MRR against fixed negatives.
"""

from __future__ import annotations

import argparse
import functools

from haloflow.cli.config_args import ConfigArgs, HelpFormatter
from haloflow.cli.runtime_args import add_launch_arguments, folder_parts, launch_or_train

__all__ = ["register", "config_from_args"]


@functools.cache
def _config_args() -> ConfigArgs:
    from haloflow.engine.tgn.config import TGNTrainConfig

    return ConfigArgs(TGNTrainConfig)


def register(subparsers) -> None:
    p = subparsers.add_parser("tgn", help="memory-based temporal GNN (TGN) on an event stream",
                              description=__doc__, formatter_class=HelpFormatter)
    _config_args().add_arguments(p)
    add_launch_arguments(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    return _config_args().build(args)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.nproc is not None and args.nproc >= 1 and args.nnodes >= 1:  # V against K before any rank starts
        parts = None if config.partitions is None else folder_parts(config.partitions)()[0]
        config.logical_workers_for(args.nproc * args.nnodes, parts)
    return launch_or_train(args, config, "tgn")
