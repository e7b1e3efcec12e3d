"""``haloflow bench [NAME [OPTIONS...]]``: list the benchmarks, or run one with its own options."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from haloflow.bench import BENCHMARKS
from haloflow.errors import ConfigError
from haloflow.utils.atomic import atomic_write_text, check_file_replaceable
from haloflow.utils.owned import WRITTEN_BY, bench_results, stamped
from haloflow.utils.table import format_table
from haloflow.utils.help_format import HelpFormatter

COMMAND = "bench"
HELP = "run a benchmark (haloflow against a peer in the same run); without NAME, list them"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        COMMAND, help=HELP,
        description="Run one of haloflow's benchmarks: it prints a table and writes JSON under bench-results/ (an "
        "--out file already there is replaced only if a benchmark wrote it, or with --overwrite). "
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
    options, out, overwrite = _output(args.options)
    check_file_replaceable(out, overwrite, bench_results, "--out")  # before the benchmark's minutes, not after
    module = importlib.import_module(bench.module)
    status = int(module.main(options, prog=f"haloflow bench {args.name}") or 0)
    if status == 0 and out is not None:
        _stamp(Path(out), args.name)
    return status


def _output(options: list[str]) -> tuple[list[str], str | None, bool]:
    """The benchmark's options less ``--overwrite`` (ours, not the benchmark's), its ``--out`` as given (None: the
    benchmark's default under bench-results/), and whether ``--overwrite`` was given."""
    rest, out, overwrite = [], None, False
    for i, word in enumerate(options):
        if word == "--overwrite":
            overwrite = True
            continue
        if word.startswith("--out="):
            out = word.split("=", 1)[1]
        elif word == "--out" and i + 1 < len(options):
            out = options[i + 1]
        rest.append(word)
    return rest, out, overwrite


def _stamp(out: Path, name: str) -> None:
    """Mark the results file as haloflow's (``utils/owned.py``), so that the next run may replace it."""
    if not out.is_file() or out.is_symlink():
        return
    try:
        result = json.loads(out.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return
    if isinstance(result, dict) and WRITTEN_BY not in result:
        atomic_write_text(out, json.dumps(stamped(result, f"bench {name}"), indent=1) + "\n")
