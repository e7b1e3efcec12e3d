"""`haloflow train tgn --events FILE [--partitions DIR] [--nproc K] ...`: train a memory-based temporal GNN.

::

    haloflow train tgn --events ../shared/data/temporal/jodie_wikipedia_edges.csv --epochs 1
    haloflow partition EVENTS.csv --parts 2 --out runs/wiki-2        # node memory owned by part
    haloflow train tgn --events EVENTS.csv --partitions runs/wiki-2 --nproc 2

The stream is split 70/15/15 by time; 10% of the nodes are held out of training for the inductive test. At the
end: AP and AUC on validation and test with one fixed negative per event (transductive, and inductive on events
with a held-out node), and MRR against fixed negatives.
"""

from __future__ import annotations

import argparse

from haloflow.cli.runtime_args import add_runtime_arguments, folder_parts, launch_or_train, runtime_config

__all__ = ["register", "config_from_args"]

FLAGS = {"batch_size": "--batch-size", "memory_dim": "--memory-dim", "time_dim": "--time-dim",
         "embedding_dim": "--embedding-dim", "num_neighbors": "--neighbors", "max_train_batches": "--max-batches",
         "mrr_negatives": "--mrr-negatives"}


def register(subparsers) -> None:
    from haloflow.engine.tgn.train import TGNTrainConfig

    d = TGNTrainConfig(events="-")
    p = subparsers.add_parser("tgn", help="memory-based temporal GNN (TGN) on an event stream",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", required=True, metavar="FILE",
                   help="JODIE CSV (u,i,ts,label[,features]) or SNAP temporal edge list (src dst time)")
    p.add_argument("--partitions", metavar="DIR", help="`haloflow partition` folder of the same stream: node "
                   "memory lives with its part (default: contiguous blocks of node ids)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"events per batch (default {d.batch_size})")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr:g})")
    p.add_argument("--memory-dim", type=int, default=d.memory_dim)
    p.add_argument("--time-dim", type=int, default=d.time_dim)
    p.add_argument("--embedding-dim", type=int, default=d.embedding_dim)
    p.add_argument("--neighbors", dest="num_neighbors", type=int, default=d.num_neighbors,
                   help="most recent neighbours attended to (default 10)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-batches", dest="max_train_batches", type=int, default=None,
                   help="stop each epoch after this many batches")
    p.add_argument("--no-eval", action="store_true", help="skip the validation and test passes")
    p.add_argument("--mrr-negatives", type=int, default=d.mrr_negatives,
                   help=f"fixed negatives per test event for the MRR (default {d.mrr_negatives}; 0: none)")
    add_runtime_arguments(p, d.runtime)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from haloflow.cli import name_flags
    from haloflow.engine.tgn.train import TGNTrainConfig
    from haloflow.errors import ConfigError

    try:
        return TGNTrainConfig(
            events=args.events, partitions=args.partitions, batch_size=args.batch_size, epochs=args.epochs,
            lr=args.lr, memory_dim=args.memory_dim, time_dim=args.time_dim, embedding_dim=args.embedding_dim,
            num_neighbors=args.num_neighbors, seed=args.seed, max_train_batches=args.max_train_batches,
            eval=not args.no_eval, mrr_negatives=args.mrr_negatives,
            runtime=runtime_config(args, TGNTrainConfig(events="-").runtime),
        )
    except ConfigError as err:
        raise name_flags(err, FLAGS) from None


def run(args: argparse.Namespace) -> int:
    from haloflow.engine.tgn.train import train_tgn

    config = config_from_args(args)
    parts = None if args.partitions is None else folder_parts(args.partitions)
    return launch_or_train(args, config, train_tgn, parts)
