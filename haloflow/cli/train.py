"""`haloflow train MODEL ...`: one sub-command per model, each with its parser in its own module.

::

    haloflow train gcn  --dataset PATH | --partitions DIR [--nproc K] ...     (haloflow/cli/train_gcn.py)
    haloflow train dlrm ...                                                   (haloflow/cli/train_dlrm.py, when present)

A model module provides ``register(subparsers)``, like the top-level commands; a module that is not there yet is
skipped, so adding a model is adding one file and one name to ``_MODELS``.
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["register"]

_MODELS = ["gcn", "dlrm"]  # modules haloflow.cli.train_<name>


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train", help="train a model (single process, or one rank per part under torchrun)",
        description="Train a model. Distributed runs are exact: K ranks compute what one process computes.",
    )
    models = parser.add_subparsers(dest="model", metavar="MODEL")
    for name in _MODELS:
        try:
            module = importlib.import_module(f"haloflow.cli.train_{name}")
        except ModuleNotFoundError as err:
            if err.name == f"haloflow.cli.train_{name}":
                continue
            raise
        module.register(models)
    parser.set_defaults(func=lambda args: _no_model(parser))


def _no_model(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
