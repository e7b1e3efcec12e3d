"""`haloflow inspect DIR`: show a partition folder's meta and per-part table, after verifying its files."""

from __future__ import annotations

import argparse

from haloflow.partition.format import verify_partition
from haloflow.partition.stats import format_stats
from haloflow.utils.help_format import HelpFormatter

__all__ = ["register", "run"]

COMMAND = "inspect"
HELP = "show a partition folder's summary and verify its files"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        COMMAND, help=HELP,
        description="Print DIR/meta.json and the per-part statistics. Every file's size is checked against "
        "meta.json, its CRC-32 too unless --no-verify, and what the arrays mean: bounds, dtypes, ids and labels in "
        "range, and parts that agree on what they send each other.", formatter_class=HelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="partition folder written by `haloflow partition`")
    p.add_argument("--no-verify", action="store_true", help="skip the checksums (sizes are still checked)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    meta = verify_partition(args.dir, checksums=not args.no_verify)
    total_bytes = sum(info.size for info in meta.files.values())
    shown = {"num_parts", "method", "seed"}  # already on the line below
    config = ", ".join(f"{k}={v}" for k, v in meta.config.items() if k not in shown)
    print(f"{args.dir}: format_version {meta.format_version}, data set {meta.name!r}")
    # meta.json does not record whether the graph is symmetric, so the stored count is named for what it is.
    print(f"{meta.num_nodes:,} nodes, {meta.num_edges:,} directed edge entries, {meta.num_parts} parts by "
          f"{meta.method} (seed {meta.seed}{', ' + config if config else ''})")
    print(f"node data: {', '.join(meta.node_data) or 'none'}; classes: {meta.num_classes}")
    print(format_stats(meta.stats))
    check = ("sizes, CRC-32 and contents checked" if not args.no_verify
             else "sizes and contents checked, checksums skipped (--no-verify)")
    print(f"files: {len(meta.files)} ({total_bytes:,} bytes), {check}")
    return 0
