"""`haloflow train dlrm (--data DIR | --synthetic) [--plan PLAN] [--nproc K] ...`: train a DLRM.

Every rank holds its shards of the plan, through the same code whatever K: one process holds them all; with
``--nproc K`` (or under ``torchrun --nproc-per-node K -m haloflow train dlrm ...``) each of K ranks holds its own.
The run is defined by V logical workers (``--logical-workers``, default 4 or a plan's ranks): any K dividing V by a
power of two trains the same floats (``engine/logical.py``). Rank 0 shows progress, writes every JSON record to
``--log-jsonl`` and prints a summary table at the end.
"""

from __future__ import annotations

import argparse
import functools

from haloflow.cli.config_args import ConfigArgs, HelpFormatter
from haloflow.cli.runtime_args import add_launch_arguments, launch_or_train

__all__ = ["register", "config_from_args"]


@functools.cache
def _config_args() -> ConfigArgs:
    from haloflow.engine.dlrm.config import DLRMTrainConfig

    return ConfigArgs(DLRMTrainConfig)


def register(subparsers) -> None:
    """Add ``dlrm`` to the subparsers of ``haloflow train``."""
    p = subparsers.add_parser("dlrm", help="train a DLRM on click logs, tables sharded by a plan",
                              description=__doc__, formatter_class=HelpFormatter)
    inputs = p.add_mutually_exclusive_group(required=True)  # DLRMTrainConfig takes exactly one
    _config_args().add_arguments(p, into={"data": inputs, "synthetic": inputs})
    add_launch_arguments(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    return _config_args().build(args)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # checks the arguments before any process starts
    return launch_or_train(args, config, "dlrm", None if config.plan is None else
                           lambda: (_plan_parts(config.plan), f"plan {config.plan}"),
                           hosted=not config.no_k_invariance)


def _plan_parts(path) -> int:
    from haloflow.partition.planner.plan_io import load_plan

    return load_plan(path).world_size
