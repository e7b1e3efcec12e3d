"""`haloflow partition INPUT --parts K --out DIR`: partition a graph data set into a partition folder.

Parses the arguments into a `PartitionConfig`, prints the estimate of peak memory and temporary disk
(``partition/estimate.py``, from the input's header or a sample), then calls `read_input` and `partition_dataset`;
prints the graph (undirected edges, with the directed entries stored for them), the per-part table (inner, halo,
halo/inner, edges), the edge cut, the balance, wall time and peak memory.
"""

from __future__ import annotations

import argparse
import signal
import time
from contextlib import contextmanager

from haloflow.cli import name_flags
from haloflow.data.paths import check_output_parent
from haloflow.data.readers import FORMATS, detect_format
from haloflow.data.textscan import is_pipe
from haloflow.errors import ConfigError
from haloflow.partition.api import FENNEL_ORDER_CHOICES, METHODS, PartitionConfig
from haloflow.partition.auto import DEFAULT_TIME_BUDGET
from haloflow.partition.external import DEFAULT_PRESET, EXTERNAL_METHODS, PRESETS, require
from haloflow.partition.fennel import FENNEL_PASSES, FENNEL_STARTS
from haloflow.partition.estimate import estimate_in_memory, estimate_out_of_core
from haloflow.partition.format import check_output_dir
from haloflow.cli.reader_args import READER_FLAGS, add_reader_arguments, reader_options
from haloflow.partition.pipeline import partition_dataset, read_input
from haloflow.utils.memory import parse_bytes
from haloflow.utils.help_format import HelpFormatter

__all__ = ["register", "run"]

COMMAND = "partition"
HELP = "partition a graph into K parts with halos, written as a partition folder"


# PartitionConfig field -> the flag a CLI user typed, so that error messages name the flag.
_FLAGS = {f"PartitionConfig.{field}": flag for field, flag in {
    "num_parts": "--parts", "method": "--method", "balance": "--balance", "imbalance": "--imbalance",
    "seed": "--seed", "fennel_start": "--fennel-start", "fennel_order": "--fennel-order", "passes": "--passes",
    "preset": "--preset", "time_budget": "--time-budget"}.items()}
_FLAGS.update(READER_FLAGS)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        COMMAND, help=HELP,
        description="Partition a graph data set into K parts (METIS, Fennel, random, KaHIP, Mt-KaHyPar, KaMinPar or "
        "auto), build each part's halo and "
        "send lists, and write DIR/meta.json plus DIR/part-<k>/*.npy. Prints per-part statistics.", formatter_class=HelpFormatter,
    )
    p.add_argument("input", metavar="INPUT", help="graph file (SNAP edge list, PACE .gr, METIS .graph, .npy edges, "
                   ".parquet) or folder (OGB, Planetoid, Parquet files, an arrays folder of .npy edges and node data)")
    p.add_argument("--format", choices=FORMATS, default="auto", help="input format (default: detect)")
    add_reader_arguments(p)
    p.add_argument("--parts", type=int, required=True, metavar="K", help="number of parts, 1 <= K <= nodes")
    p.add_argument(
        "--method", choices=METHODS, default="metis",
        help="partitioner (default: metis). kahip, mtkahypar and kaminpar are optional packages (pip install NAME, "
        "or haloflow[partitioners]) run at --preset with METIS's 3%% imbalance (or a tighter --imbalance); auto runs "
        "METIS, then each library installed, best first (kahip strong, mtkahypar strong, kaminpar strong, eco, "
        "fast), whose predicted time (edges x its rate measured on 2 cores, x the load average per CPU when over 1) still fits in --time-budget x METIS's "
        "time, and keeps the smallest cut, so it never cuts more than METIS (haloflow -v partition logs what it "
        "tried and kept)",
    )
    p.add_argument("--preset", choices=PRESETS, default=DEFAULT_PRESET,
                   help="kahip, mtkahypar, kaminpar: the library's configuration, fast, eco or strong (default: "
                   f"{DEFAULT_PRESET}; KaHIP FAST/ECO/STRONG, Mt-KaHyPar DETERMINISTIC/DEFAULT/DETERMINISTIC_QUALITY, "
                   "KaMinPar fast/eco/strong)")
    p.add_argument("--time-budget", type=float, default=DEFAULT_TIME_BUDGET, metavar="X",
                   help=f"auto only: the libraries may take X times METIS's measured time in all, METIS's own run "
                   f"included (default {DEFAULT_TIME_BUDGET:g})")
    p.add_argument(
        "--balance", default="nodes", metavar="W[,W...]",
        help="weights to balance, comma-separated, any of nodes, edges, train (default: nodes)",
    )
    p.add_argument(
        "--fennel-start", choices=FENNEL_STARTS, default=None,
        help="fennel only: auto (default) runs the streaming and bisection starts, then the multilevel one only "
        "when the bisection cut fewer edges than the stream, and keeps the smallest cut (with --memory-budget: the "
        "stream); stream is plain Fennel (the fastest); multilevel (coarsen, start, refine "
        "level by level; also with --memory-budget) suits road networks and meshes; bisect is a recursive BFS "
        "bisection",
    )
    p.add_argument(
        "--fennel-order", choices=FENNEL_ORDER_CHOICES, default=None,
        help="fennel only: the order vertices are streamed in; auto (default) is BFS in memory and id order with "
        "--memory-budget (which reads the on-disk CSR sequentially)",
    )
    p.add_argument(
        "--passes", type=int, default=None, metavar="N",
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
    g = p.add_argument_group("graphs larger than memory")
    g.add_argument(
        "--memory-budget", default=None, metavar="SIZE",
        help="partition out of core within SIZE of memory for the whole process (e.g. 2GiB, 512MiB): the edges are "
        "read in chunks, bucket-sorted into a CSR on disk and streamed (fennel or random), so memory is O(nodes); the "
        "folder equals the in-memory run's. Inputs: snap, npy, parquet, metis, arrays (default: in memory)",
    )
    g.add_argument("--tmp-dir", default=None, metavar="DIR",
                   help="with --memory-budget: where the temporary files go (default: the folder --out is in); "
                   "they are removed at the end, also on failure or Ctrl-C")
    p.add_argument("--out", required=True, metavar="DIR", help="partition folder to write (must not exist)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing partition folder DIR")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.memory_budget is not None:
        return _run_out_of_core(args)
    if args.tmp_dir is not None:
        raise ConfigError("--tmp-dir is where --memory-budget puts its temporary files; expected --memory-budget too")
    try:
        config = _config(args)
        check_output_parent(args.out)  # fail before reading a large input
        check_output_dir(args.out, args.overwrite)
        print(estimate_in_memory(args.input, _format(args), config.method).line(), flush=True)
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


def _format(args: argparse.Namespace) -> str:
    return detect_format(args.input) if args.format == "auto" and not is_pipe(args.input) else args.format


def _config(args: argparse.Namespace) -> PartitionConfig:
    fennel = {"--fennel-start": args.fennel_start, "--fennel-order": args.fennel_order, "--passes": args.passes}
    given = [flag for flag, value in fennel.items() if value is not None]
    if given and args.method != "fennel":  # ignored by every other method: a mistake, said before any work
        raise ConfigError(f"{given[0]} applies only to --method fennel (this run is --method {args.method})")
    args.fennel_start = args.fennel_start or "auto"
    args.fennel_order = args.fennel_order or "auto"
    args.passes = FENNEL_PASSES if args.passes is None else args.passes
    if args.method in EXTERNAL_METHODS:
        require(args.method)  # a missing optional package is said before a large input is read
    return PartitionConfig(
        num_parts=args.parts, method=args.method, balance=tuple(w.strip() for w in args.balance.split(",")),
        imbalance=args.imbalance, seed=args.seed, fennel_start=args.fennel_start, fennel_order=args.fennel_order,
        passes=args.passes, preset=args.preset, time_budget=args.time_budget,
    )


@contextmanager
def _terminate_as_interrupt():
    """SIGTERM (a scheduler's or ``kill``'s stop) unwinds like Ctrl-C, so the temporary files are removed.

    SIGINT is set too: a shell starts ``cmd &`` with SIGINT ignored, and Python then never installs its Ctrl-C
    handler, so ``kill -INT`` of a background partition would be dropped and the run would carry on to the end.
    """
    def stop(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


def _run_out_of_core(args: argparse.Namespace) -> int:
    from haloflow.data.streamed import open_streamed
    from haloflow.partition.ooc import OutOfCoreConfig, partition_out_of_core

    try:
        try:
            budget = parse_bytes(args.memory_budget)
        except ValueError as err:
            raise ConfigError(f"--memory-budget: {err}") from None
        config = _config(args)
        ooc = OutOfCoreConfig(memory_budget=budget, tmp_dir=args.tmp_dir)
        check_output_parent(args.out)
        check_output_parent(args.tmp_dir, "--tmp-dir")
        check_output_dir(args.out, args.overwrite)
        print(estimate_out_of_core(args.input, _format(args), budget).line(), flush=True)
        source, nodes = open_streamed(args.input, args.format, **reader_options(args))
        with _terminate_as_interrupt():
            summary = partition_out_of_core(source, config, ooc, args.out, nodes=nodes, symmetrize=args.symmetrize,
                                            overwrite=args.overwrite, progress=True)
    except ConfigError as err:
        raise name_flags(err, _FLAGS) from None
    config = summary.meta.config
    print(f"{source.name}: {summary.num_nodes:,} nodes, {summary.num_entries:,} directed entries "
          f"(read {summary.stage_times['count'] + summary.stage_times['bucket sort']:.2f} s, out of core) -> "
          f"{config['num_parts']} parts ({config['method']}, seed {config['seed']})")
    print(summary.report())
    return 0
