"""`haloflow predict {gcn,dlrm,tgn} --model MODEL ... --out FILE`: parse into the family's predict config and call
its ``predict_<family>``.

::

    haloflow predict gcn  --model model.pt --dataset DATA --out nodes.parquet          every node's class
    haloflow predict gcn  --model ckpt/ --partitions parts/ --nproc 2 --out nodes.csv  V / K parts per rank
    haloflow predict dlrm --model model.pt --data DIR --out clicks.parquet             a probability per row
    haloflow predict tgn  --model model.pt --events wiki.csv --out events.parquet      a score per event

``--model`` takes what ``haloflow export`` wrote or a checkpoint itself. With labels in the input, the trainer's
metric is printed (accuracy; log-loss and AUC; AP and AUC), equal to the trainer's own evaluation of the model.
"""

from __future__ import annotations

import argparse
import functools

from haloflow.cli.config_args import ConfigArgs, HelpFormatter
from haloflow.cli.reader_args import add_reader_arguments, reader_options
from haloflow.engine.families import FAMILIES

__all__ = ["register", "COMMAND", "HELP"]

COMMAND = "predict"
HELP = "score new data with a trained model (an export or a checkpoint), at one process or K"

_HELPS = {"gcn": "every node's class and class probabilities", "dlrm": "a click probability per row",
          "tgn": "a link score per event, the memory following the stream"}


@functools.cache
def _config_args(family: str) -> ConfigArgs:
    import importlib

    entry = FAMILIES[family]
    return ConfigArgs(getattr(importlib.import_module(entry.predict_module), entry.predict_config))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(COMMAND, help=HELP, description=__doc__, formatter_class=HelpFormatter)
    models = parser.add_subparsers(dest="model_family", metavar="MODEL")
    for name in FAMILIES:
        p = models.add_parser(name, help=_HELPS.get(name, f"score with a trained {FAMILIES[name].title} model"),
                              description=__doc__, formatter_class=HelpFormatter)
        into = {}
        if name == "gcn":
            inputs = p.add_mutually_exclusive_group(required=True)
            into = {"dataset": inputs, "partitions": inputs}
        elif name == "dlrm":
            inputs = p.add_mutually_exclusive_group(required=True)
            into = {"data": inputs, "synthetic": inputs}
        _config_args(name).add_arguments(p, into=into)
        if name == "gcn":
            add_reader_arguments(p)
        g = p.add_argument_group("starting ranks")
        nproc = g.add_argument("--nproc", type=int, metavar="K", help="start K local ranks with torchrun (GCN: "
                               "the partition's parts); leave it out under your own torchrun")
        nproc.means = "this process alone"
        p.set_defaults(func=functools.partial(run, name), max_restarts=0, nnodes=1, node_rank=0,
                       rdzv_endpoint=None)
    parser.set_defaults(func=lambda args: _no_model(parser))


def _no_model(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run(family: str, args: argparse.Namespace) -> int:
    import importlib

    from haloflow.cli.runtime_args import relaunch_if_asked
    from haloflow.errors import ConfigError

    given = {"reader_options": tuple(reader_options(args).items())} if family == "gcn" else {}
    config = _config_args(family).build(args, given=given)  # checks the arguments before any process starts
    if family == "gcn" and args.nproc is not None and config.partitions is None:
        raise ConfigError("--nproc needs --partitions DIR (V / K parts per rank); --dataset runs in one process")
    if family == "gcn" and args.nproc is not None and args.nproc >= 1:  # before any rank starts
        from haloflow.engine.run_config import expect_hosts
        from haloflow.partition.format import load_meta

        expect_hosts(load_meta(config.partitions).num_parts, args.nproc, str(config.partitions))
    status = relaunch_if_asked(args)
    if status is not None:
        return status
    entry = FAMILIES[family]
    result = getattr(importlib.import_module(entry.predict_module), entry.predict_entry_point)(config)
    if result.rank == 0:
        print(result.summary())
    return 0
