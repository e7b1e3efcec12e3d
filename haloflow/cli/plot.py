"""`haloflow plot LOG.jsonl [LOG.jsonl ...] [--out PNG]`: parse into a `PlotConfig` and call `plot_logs`.

::

    haloflow plot runs/cora-2.jsonl                          loss and accuracy of a GCN run -> runs/cora-2.png
    haloflow plot a.jsonl b.jsonl --out both.png             two runs in one figure
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from haloflow.cli.config_args import ConfigArgs, HelpFormatter

__all__ = ["register", "COMMAND", "HELP"]

COMMAND = "plot"
HELP = "draw the loss and metric curves of runs from their --log-jsonl files into a PNG"


@functools.cache
def _config_args() -> ConfigArgs:
    from haloflow.engine.plot import PlotConfig

    return ConfigArgs(PlotConfig)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(COMMAND, help=HELP, description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("logs", metavar="LOG", nargs="+", type=Path,
                   help="a JSON log written by `haloflow train ... --log-jsonl` (one or more; required)")
    _config_args().add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from haloflow.engine.plot import plot_logs

    out = plot_logs(_config_args().build(args, given={"logs": tuple(args.logs)}))
    print(f"wrote {out}")
    return 0
