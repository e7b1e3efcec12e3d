"""`haloflow plan-tables --tables kaggle --world-size K --memory-per-rank 2GiB`: plan embedding-table sharding.

Parses the arguments into a `Topology` and an `EmbeddingCostModel`, reads the table specs and calls the
planner; prints the plan as a table with per-rank cost and memory, and writes it as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from haloflow.cli import name_flags
from haloflow.errors import ConfigError
from haloflow.partition.planner.cost_model import EmbeddingCostModel
from haloflow.partition.planner.enumerators import ShardingOptionEnumerator
from haloflow.partition.planner.plan_io import save_plan
from haloflow.partition.planner.planner import EmbeddingShardingPlanner
from haloflow.partition.planner.report import plan_report
from haloflow.partition.planner.specs import load_table_specs, parse_bytes
from haloflow.partition.planner.storage_reservations import FixedFractionReservation
from haloflow.partition.planner.types import DEFAULT_SHARDING_TYPES, ShardingType, Topology
from haloflow.utils.atomic import check_file_replaceable
from haloflow.utils.owned import sharding_plan
from haloflow.utils.help_format import HelpFormatter

__all__ = ["register", "run"]

COMMAND = "plan-tables"
HELP = "plan how embedding tables are sharded over K ranks (data-parallel, table-, row-, column-wise)"


# optimizer state per weight and per row, in weights (row-wise Adagrad: one sum of squares per row)
_OPTIMIZER_SLOTS = {"sgd": (0.0, 0.0), "adagrad": (1.0, 0.0), "rowwise_adagrad": (0.0, 1.0), "adam": (2.0, 0.0)}


def _optimizer_name(text: str) -> str:
    """``rowwise-adagrad`` or ``rowwise_adagrad`` -> ``rowwise_adagrad``, as ``haloflow train dlrm`` spells it."""
    return text.strip().lower().replace("-", "_")

# field name in a ConfigError -> the flag a CLI user typed
_FLAGS = {"world_size": "--world-size", "memory_per_rank": "--memory-per-rank", "batch_size": "--batch-size",
          "lookup_bandwidth": "--lookup-bandwidth", "a2a_bandwidth": "--a2a-bandwidth",
          "allreduce_bandwidth": "--allreduce-bandwidth", "host_bandwidth": "--host-bandwidth",
          "reserved fraction": "--reserve"}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        COMMAND, help=HELP,
        description="Choose per table between replication and table-, row- or column-wise sharding, and place the "
        "shards on K ranks within their memory so that the slowest rank's estimated step cost is as low as "
        "possible. Prints the plan with per-rank cost and memory; --out writes it as JSON.", formatter_class=HelpFormatter,
    )
    p.add_argument("--tables", required=True, metavar="SPEC",
                   help="'kaggle' (the 26 Criteo Kaggle tables), a .json or .csv table file, or a folder written by "
                   "`haloflow preprocess`")
    p.add_argument("--world-size", type=int, required=True, metavar="K", help="number of ranks, >= 1")
    p.add_argument("--memory-per-rank", required=True, metavar="SIZE",
                   help="device memory each rank gives to tables and optimizer state, e.g. 2GiB; or one per rank, "
                   "comma-separated")
    p.add_argument("--batch-size", type=int, default=2048, help="global batch size (default 2048)")
    p.add_argument("--dim", type=int, default=16, help="embedding dim where the tables do not say (default 16)")
    p.add_argument("--optimizer", choices=sorted(_OPTIMIZER_SLOTS), default="sgd", type=_optimizer_name,
                   help="sets the optimizer state kept per weight (default sgd: none; rowwise-adagrad is "
                   "rowwise_adagrad)")
    p.add_argument("--dp-grad", choices=("sparse", "dense"), default="sparse",
                   help="how the engine sums replicated tables' gradients (default sparse)")
    p.add_argument("--lookup-bandwidth", default="1.2TB", metavar="RATE",
                   help="bytes/s of embedding lookups per rank (default 1.2TB)")
    p.add_argument("--a2a-bandwidth", default="25GB", metavar="RATE",
                   help="bytes/s a rank sends plus receives in all-to-alls (default 25GB)")
    p.add_argument("--allreduce-bandwidth", default="25GB", metavar="RATE",
                   help="all-reduce bus bandwidth in bytes/s (default 25GB)")
    p.add_argument("--reserve", type=float, default=0.0, metavar="FRACTION",
                   help="share of each rank's memory kept from the tables (default 0)")
    p.add_argument("--cached", action="store_true",
                   help="allow 'cached' tables: a table in host memory with its hot rows in a device cache, sized "
                   "per table from its miss-ratio curve to what the memory budget leaves (the trainer builds the "
                   "caches the plan records)")
    p.add_argument("--cache-curves", type=int, default=None, metavar="N",
                   help="with --cached and a preprocessed --tables folder: simulate each table's cache on its first N "
                   "train batches of --batch-size (default 100); 0, or other table sources: estimate hit rates from "
                   "the id histogram (uniform ids without one)")
    p.add_argument("--cache-policy", choices=("lru", "lfu"), default=None,
                   help="the policy simulated for the curves (default lru, the trainer's default)")
    p.add_argument("--host-bandwidth", default="25GB", metavar="RATE",
                   help="bytes/s between host memory and the device for cached tables' misses (default 25GB)")
    p.add_argument("--out", metavar="FILE", help="write the plan as JSON (temporary file, then rename); a file "
                   "already there is replaced only if it is a plan (or with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an --out file that is not a haloflow plan")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        memory = [parse_bytes(m, "--memory-per-rank") for m in args.memory_per_rank.split(",")]
        topology = Topology(
            world_size=args.world_size, memory_per_rank=tuple(memory),
            lookup_bandwidth=parse_bytes(args.lookup_bandwidth, "--lookup-bandwidth"),
            a2a_bandwidth=parse_bytes(args.a2a_bandwidth, "--a2a-bandwidth"),
            allreduce_bandwidth=parse_bytes(args.allreduce_bandwidth, "--allreduce-bandwidth"),
            host_bandwidth=parse_bytes(args.host_bandwidth, "--host-bandwidth"),
        )
        per_weight, per_row = _OPTIMIZER_SLOTS[args.optimizer]
        cost_model = EmbeddingCostModel(batch_size=args.batch_size, optimizer_slots=per_weight, row_slots=per_row,
                                        dp_grad=args.dp_grad)
        reservation = FixedFractionReservation(fraction=args.reserve)
        if args.dim < 1:
            raise ConfigError(f"--dim must be >= 1, got {args.dim}")
        for flag, value, most in (("--dim", args.dim, 2**31), ("--batch-size", args.batch_size, 2**40),
                                  ("--world-size", args.world_size, 2**20)):  # past any machine, and numpy's int64
            if value > most:
                raise ConfigError(f"{flag} must be <= {most:,}, got {value:,}")
        for flag, value in (("--cache-curves", args.cache_curves), ("--cache-policy", args.cache_policy)):
            if value is not None and not args.cached:
                raise ConfigError(f"{flag} applies only to cached tables: it needs --cached")
        args.cache_curves = 100 if args.cache_curves is None else args.cache_curves
        args.cache_policy = args.cache_policy or "lru"
        if args.cache_curves < 0:
            raise ConfigError(f"--cache-curves must be >= 0 batches, got {args.cache_curves}")
        check_file_replaceable(args.out, args.overwrite, sharding_plan, "--out")
    except ConfigError as err:
        raise name_flags(err, _FLAGS) from None
    specs = load_table_specs(args.tables, dim=args.dim)
    kinds = DEFAULT_SHARDING_TYPES + ((ShardingType.CACHED,) if args.cached else ())
    if args.cached and args.cache_curves and Path(args.tables).is_dir():
        from haloflow.partition.planner.cache_sizing import folder_traces, with_cache_curves  # numba: when needed

        traces = folder_traces(args.tables, batch_size=args.batch_size, max_batches=args.cache_curves)
        specs = with_cache_curves(specs, traces, policy=args.cache_policy)
    enumerator = ShardingOptionEnumerator(cost_model=cost_model, sharding_types=kinds)
    plan = EmbeddingShardingPlanner(topology, reservation=reservation, enumerator=enumerator).plan(specs)
    print(f"{len(specs)} tables ({args.tables}) on {topology.world_size} ranks, batch {args.batch_size}, "
          f"optimizer {args.optimizer}")
    print(plan_report(plan, specs))
    if args.out:
        print(f"plan written to {save_plan(plan, args.out)}")
    return 0
