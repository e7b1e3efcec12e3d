"""`haloflow export CHECKPOINT --out MODEL`: parse into an `ExportConfig` and call `export_model`.

::

    haloflow export ckpt/ --out model.pt                 the newest checkpoint in ckpt/, written at any K
    haloflow export ckpt/step-00000200 --out model/ --layout folder     one memory-mappable .npy per tensor
"""

from __future__ import annotations

import argparse
import functools

from haloflow.cli.config_args import ConfigArgs, HelpFormatter

__all__ = ["register", "COMMAND", "HELP"]

COMMAND = "export"
HELP = "turn a checkpoint written at any K into one model file a single process loads"


@functools.cache
def _config_args() -> ConfigArgs:
    from haloflow.engine.export import ExportConfig

    return ConfigArgs(ExportConfig)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(COMMAND, help=HELP, description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a checkpoint folder, or a checkpoint dir (its newest checkpoint) (required)")
    _config_args().add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from haloflow.engine.export import export_model

    config = _config_args().build(args, given={"checkpoint": args.checkpoint})
    out = export_model(config)
    print(f"wrote {out}")
    return 0
