"""`haloflow train MODEL ...`: one sub-command per model, each with its parser in its own module.

::

    haloflow train gcn  --dataset PATH | --partitions DIR [--nproc K] ...     (haloflow/cli/train_gcn.py)
    haloflow train dlrm ...                                                   (haloflow/cli/train_dlrm.py)
    haloflow train tgn  --events FILE [--partitions DIR] [--nproc K] ...      (haloflow/cli/train_tgn.py)

A model module provides ``register(subparsers)``, like the top-level commands; the families come from the one
registry, ``haloflow/engine/families.py``.
"""

from __future__ import annotations

import argparse

from haloflow.cli import register_modules
from haloflow.engine.families import FAMILIES
from haloflow.utils.help_format import HelpFormatter

__all__ = ["register"]

COMMAND = "train"
HELP = "train a model (single process, or several ranks under torchrun)"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        COMMAND, help=HELP,
        description="Train a model. Distributed runs are exact: K ranks compute what one process computes.", formatter_class=HelpFormatter,
    )
    register_modules(parser.add_subparsers(dest="model", metavar="MODEL"), [e.cli_module for e in FAMILIES.values()])
    parser.set_defaults(func=lambda args: _no_model(parser))


def _no_model(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
