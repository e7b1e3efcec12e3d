"""``haloflow bench [NAME [OPTIONS...]]``: list the benchmarks, or run one with its own options."""

from __future__ import annotations

import argparse
import importlib

from haloflow.bench import BENCHMARKS
from haloflow.errors import ConfigError
from haloflow.utils.table import format_table
from haloflow.utils.help_format import HelpFormatter

COMMAND = "bench"
HELP = "run a benchmark (haloflow against a peer in the same run); without NAME, list them"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        COMMAND, help=HELP,
        description="Run one of haloflow's benchmarks: it prints a table and writes JSON under bench-results/. "
        "Options after NAME go to the benchmark: `haloflow bench NAME --help` lists them.",
        epilog="benchmarks: " + ", ".join(BENCHMARKS), formatter_class=HelpFormatter,
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="which benchmark (omit to list them)")
    p.add_argument("options", nargs=argparse.REMAINDER, metavar="OPTIONS", help="the benchmark's own options")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        rows = [[name, b.minutes, b.summary] for name, b in BENCHMARKS.items()]
        print(format_table(["name", "minutes", "measures"], rows, title="haloflow bench NAME [OPTIONS]  (minutes: the "
                           "defaults on 2 quiet cores; beside other work, up to 3x that)"))
        return 0
    bench = BENCHMARKS.get(args.name)
    if bench is None:
        raise ConfigError(f"unknown benchmark {args.name!r}; expected one of {', '.join(BENCHMARKS)}")
    module = importlib.import_module(bench.module)
    return int(module.main(args.options, prog=f"haloflow bench {args.name}") or 0)
