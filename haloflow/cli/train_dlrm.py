"""`haloflow train dlrm (--data DIR | --synthetic) [--plan PLAN] [--nproc K] ...`: train a DLRM.

One process trains the single-device model; with ``--nproc K`` (or under ``torchrun --nproc-per-node K -m haloflow
train dlrm ...``) every rank holds its shards of the plan. Rank 0 shows progress, writes every JSON record to
``--log-jsonl`` and prints a summary table at the end.
"""

from __future__ import annotations

import argparse

from haloflow.cli.runtime_args import add_runtime_arguments, launch_or_train, runtime_config

__all__ = ["register", "config_from_args"]

FLAGS = {"batch_size": "--batch-size", "max_steps": "--max-steps", "log_every": "--log-every",
         "max_eval_batches": "--max-eval-batches", "synthetic_train": "--synthetic-train",
         "synthetic_val": "--synthetic-val", "dp_grad": "--dp-grad", "cache_ratio": "--cache-ratio"}


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 512,256,64, got {text!r}") from None
    if not widths:
        raise argparse.ArgumentTypeError("expected at least one width")
    return widths


def register(subparsers) -> None:
    """Add ``dlrm`` to the subparsers of ``haloflow train``."""
    from haloflow.engine.dlrm.train import DLRMTrainConfig

    d = DLRMTrainConfig(synthetic=True)  # the defaults, shown in --help
    p = subparsers.add_parser(
        "dlrm", help="train a DLRM on click logs, tables sharded by a plan", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", metavar="DIR", help="folder written by `haloflow preprocess criteo`")
    src.add_argument("--synthetic", action="store_true", help="train on the synthetic Criteo-like click log")
    p.add_argument("--plan", metavar="PLAN", help="sharding plan JSON (`haloflow plan-tables`); default: whole "
                   "tables spread over the ranks")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch (default 128, the Kaggle DLRM's)")
    p.add_argument("--lr", type=float, default=d.lr, help="SGD learning rate (default 0.1)")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--max-eval-batches", type=int, default=None, help="cap on validation batches")
    p.add_argument("--embedding-dim", type=int, default=d.embedding_dim)
    p.add_argument("--bottom-mlp", type=_widths, default=d.bottom_mlp, metavar="W,W,..")
    p.add_argument("--top-mlp", type=_widths, default=d.top_mlp, metavar="W,W,..")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--dp-grad", choices=("sparse", "dense"), default=d.dp_grad,
                   help="how data-parallel tables' gradients are summed (default sparse)")
    p.add_argument("--optimizer", choices=("sgd", "adagrad", "rowwise_adagrad"), default=d.optimizer,
                   help="optimizer of the tables (adagrad and rowwise_adagrad keep their state with the rows; the "
                   "MLPs then use Adagrad); default sgd")
    p.add_argument("--cache-ratio", type=float, default=None, metavar="R",
                   help="keep this fraction of each table's rows in a software cache on the device, the rest in "
                   "host memory (e.g. 0.01; with --nproc/--plan, of each shard's rows); default: whole tables on the "
                   "device (a plan's cached tables get their planned caches either way)")
    p.add_argument("--cache-policy", choices=("lru", "lfu", "frequency"), default=d.cache_policy,
                   help="which rows stay cached (default lru)")
    p.add_argument("--synthetic-scale", type=float, default=d.synthetic_scale, help="Kaggle table sizes times this")
    p.add_argument("--synthetic-max-rows", type=int, default=None, help="cap on a synthetic table's rows")
    p.add_argument("--synthetic-train", type=int, default=d.synthetic_train, help="synthetic training samples")
    p.add_argument("--synthetic-val", type=int, default=d.synthetic_val, help="synthetic validation samples")
    add_runtime_arguments(p, d.runtime)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from haloflow.cli import name_flags
    from haloflow.engine.dlrm.train import DLRMTrainConfig
    from haloflow.errors import ConfigError

    try:
        log_every = args.log_every or 100  # steps per JSON record (and per printed line without a bar)
        return DLRMTrainConfig(
            data=args.data, synthetic=args.synthetic, plan=args.plan, batch_size=args.batch_size, lr=args.lr,
            epochs=args.epochs, max_steps=args.max_steps, log_every=log_every,
            max_eval_batches=args.max_eval_batches, embedding_dim=args.embedding_dim, bottom_mlp=args.bottom_mlp,
            top_mlp=args.top_mlp, seed=args.seed, dp_grad=args.dp_grad, optimizer=args.optimizer,
            cache_ratio=args.cache_ratio, cache_policy=args.cache_policy,
            synthetic_scale=args.synthetic_scale, synthetic_max_rows=args.synthetic_max_rows,
            synthetic_train=args.synthetic_train, synthetic_val=args.synthetic_val,
            runtime=runtime_config(args, DLRMTrainConfig(synthetic=True).runtime),
        )
    except ConfigError as err:
        raise name_flags(err, FLAGS) from None


def run(args: argparse.Namespace) -> int:
    from haloflow.engine.dlrm.train import train_dlrm

    config = config_from_args(args)  # checks the arguments before any process starts
    return launch_or_train(args, config, train_dlrm, None if config.plan is None else
                           lambda: (_plan_parts(config.plan), f"plan {config.plan}"))


def _plan_parts(path) -> int:
    from haloflow.partition.planner.plan_io import load_plan

    return load_plan(path).world_size
