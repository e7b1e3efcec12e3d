"""`haloflow partition INPUT --parts K --out DIR`: partition a graph data set into a partition folder.

Parses the arguments into a `PartitionConfig` and calls `read_input` and `partition_dataset`; prints the
graph (undirected edges, with the directed entries stored for them), the per-part table (inner, halo, halo/inner,
edges), the edge cut, the balance, wall time and peak memory.
"""

from __future__ import annotations

import argparse
import time

from haloflow.cli import name_flags
from haloflow.data.paths import check_output_parent
from haloflow.data.readers import FORMATS
from haloflow.errors import ConfigError
from haloflow.partition.api import FENNEL_ORDER_CHOICES, METHODS, PartitionConfig
from haloflow.partition.fennel import FENNEL_PASSES, FENNEL_STARTS
from haloflow.partition.format import check_output_dir
from haloflow.cli.reader_args import READER_FLAGS, add_reader_arguments, reader_options
from haloflow.partition.pipeline import partition_dataset, read_input

__all__ = ["register", "run"]

# PartitionConfig field -> the flag a CLI user typed, so that error messages name the flag.
_FLAGS = {f"PartitionConfig.{field}": flag for field, flag in {
    "num_parts": "--parts", "method": "--method", "balance": "--balance", "imbalance": "--imbalance",
    "seed": "--seed", "fennel_start": "--fennel-start", "fennel_order": "--fennel-order", "passes": "--passes"}.items()}
_FLAGS.update(READER_FLAGS)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "partition",
        help="partition a graph into K parts with halos, written as a partition folder",
        description="Partition a graph data set into K parts (METIS, Fennel or random), build each part's halo and "
        "send lists, and write DIR/meta.json plus DIR/part-<k>/*.npy. Prints per-part statistics.",
    )
    p.add_argument("input", metavar="INPUT", help="graph file (SNAP edge list, PACE .gr) or folder (OGB, Planetoid)")
    p.add_argument("--format", choices=FORMATS, default="auto", help="input format (default: detect)")
    add_reader_arguments(p)
    p.add_argument("--parts", type=int, required=True, metavar="K", help="number of parts, 1 <= K <= nodes")
    p.add_argument("--method", choices=METHODS, default="metis", help="partitioner (default: metis)")
    p.add_argument(
        "--balance", default="nodes", metavar="W[,W...]",
        help="weights to balance, comma-separated, any of nodes, edges, train (default: nodes)",
    )
    p.add_argument(
        "--fennel-start", choices=FENNEL_STARTS, default="auto",
        help="fennel only: auto (default) runs the streaming start and a recursive BFS bisection and keeps the "
        "smaller cut; stream is plain Fennel (half the time); bisect suits road networks and meshes",
    )
    p.add_argument(
        "--fennel-order", choices=FENNEL_ORDER_CHOICES, default="auto",
        help="fennel only: the order vertices are streamed in; auto (default) is BFS in memory and id order with "
        "--memory-budget (which reads the on-disk CSR sequentially)",
    )
    p.add_argument(
        "--passes", type=int, default=FENNEL_PASSES, metavar="N",
        help=f"fennel only: streaming passes, the later ones re-placing each vertex knowing the previous pass's parts "
        f"(default {FENNEL_PASSES}; 1 = plain Fennel)",
    )
    p.add_argument("--imbalance", type=float, default=1.05, help="largest part / mean part, per weight (default 1.05)")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same partition")
    p.add_argument(
        "--symmetrize", action=argparse.BooleanOptionalAction, default=True,
        help="add every reverse edge before partitioning (default: on, because GCN training expects an undirected "
        "graph; --no-symmetrize keeps a directed graph exactly as read)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="partition folder to write (must not exist)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing partition folder DIR")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = PartitionConfig(
            num_parts=args.parts, method=args.method, balance=tuple(w.strip() for w in args.balance.split(",")),
            imbalance=args.imbalance, seed=args.seed, fennel_start=args.fennel_start, fennel_order=args.fennel_order,
            passes=args.passes,
        )
        check_output_parent(args.out)  # fail before reading a large input
        check_output_dir(args.out, args.overwrite)
        t = time.perf_counter()
        dataset = read_input(args.input, format=args.format, symmetrize=args.symmetrize, **reader_options(args))
        read_s = time.perf_counter() - t
        summary = partition_dataset(dataset, config, args.out, overwrite=args.overwrite, progress=True)
    except ConfigError as err:
        raise name_flags(err, _FLAGS) from None
    print(f"{dataset.name}: {dataset.num_nodes:,} nodes, {dataset.graph.describe_edges()} (read in {read_s:.2f} s) "
          f"-> {config.num_parts} parts ({config.method}, seed {config.seed})")
    print(summary.report())
    return 0
