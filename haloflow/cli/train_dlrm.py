"""`haloflow train dlrm (--data DIR | --synthetic) [--plan PLAN] [--nproc K] ...`: train a DLRM.

One process trains the single-device model; under torchrun (``torchrun --nproc-per-node K -m haloflow train
dlrm ...``, or ``--nproc K`` which launches that itself) every rank holds its shards of the plan. Rank 0 prints
one JSON record per line on stdout (training windows, then the validation logloss and AUC).

``python -m haloflow.cli.train_dlrm ...`` runs the same command without the ``train`` dispatcher (what
``--nproc`` launches).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from haloflow.engine.dist import launch_torchrun, shutdown
from haloflow.engine.train_dlrm import DLRMTrainConfig, train_dlrm

__all__ = ["register", "add_arguments", "run", "config_from_args"]


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 512,256,64, got {text!r}") from None
    if not widths:
        raise argparse.ArgumentTypeError("expected at least one width")
    return widths


# (flag, dest) of every option passed on to the ranks when --nproc launches torchrun.
_PASS_ON = [
    ("--data", "data"), ("--plan", "plan"), ("--batch-size", "batch_size"), ("--lr", "lr"), ("--epochs", "epochs"),
    ("--max-steps", "max_steps"), ("--log-every", "log_every"), ("--max-eval-batches", "max_eval_batches"),
    ("--embedding-dim", "embedding_dim"), ("--bottom-mlp", "bottom_mlp"), ("--top-mlp", "top_mlp"),
    ("--seed", "seed"), ("--dp-grad", "dp_grad"), ("--metrics", "metrics"), ("--synthetic-scale", "synthetic_scale"),
    ("--synthetic-max-rows", "synthetic_max_rows"), ("--synthetic-train", "synthetic_train"),
    ("--synthetic-val", "synthetic_val"), ("--timeout", "timeout"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", metavar="DIR", help="folder written by `haloflow preprocess criteo`")
    src.add_argument("--synthetic", action="store_true", help="train on the synthetic Criteo-like click log")
    p.add_argument("--plan", metavar="PLAN", help="sharding plan JSON (`haloflow plan-tables`); default: whole "
                   "tables spread over the ranks")
    p.add_argument("--nproc", type=int, default=None, metavar="K", help="launch K local ranks with torchrun")
    p.add_argument("--batch-size", type=int, default=128, help="global batch (default 128, the Kaggle DLRM's)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--log-every", type=int, default=100, help="steps per JSON training record")
    p.add_argument("--max-eval-batches", type=int, default=None, help="cap on validation batches")
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--bottom-mlp", type=_widths, default=(512, 256, 64), metavar="W,W,..")
    p.add_argument("--top-mlp", type=_widths, default=(512, 256), metavar="W,W,..")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dp-grad", choices=("sparse", "dense"), default="sparse",
                   help="how data-parallel tables' gradients are summed (default sparse)")
    p.add_argument("--metrics", metavar="PATH", help="also write the JSON records to this file")
    p.add_argument("--synthetic-scale", type=float, default=1e-3, help="Kaggle table sizes times this")
    p.add_argument("--synthetic-max-rows", type=int, default=None, help="cap on a synthetic table's rows")
    p.add_argument("--synthetic-train", type=int, default=65_536, help="synthetic training samples")
    p.add_argument("--synthetic-val", type=int, default=8_192, help="synthetic validation samples")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a collective may wait for a peer")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def register(subparsers) -> None:
    """Add ``dlrm`` to the subparsers of ``haloflow train``."""
    p = subparsers.add_parser(
        "dlrm", help="train a DLRM on click logs, tables sharded by a plan",
        description="Train DLRM (SGD) on a preprocessed Criteo folder or the synthetic log; with torchrun or "
        "--nproc K the tables are sharded over K ranks by --plan. Prints JSON records on stdout.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> DLRMTrainConfig:
    return DLRMTrainConfig(
        data=args.data, synthetic=args.synthetic, plan=args.plan, batch_size=args.batch_size, lr=args.lr,
        epochs=args.epochs, max_steps=args.max_steps, log_every=args.log_every,
        max_eval_batches=args.max_eval_batches, embedding_dim=args.embedding_dim, bottom_mlp=args.bottom_mlp,
        top_mlp=args.top_mlp, seed=args.seed, dp_grad=args.dp_grad, metrics_path=args.metrics,
        synthetic_scale=args.synthetic_scale, synthetic_max_rows=args.synthetic_max_rows,
        synthetic_train=args.synthetic_train, synthetic_val=args.synthetic_val, progress=not args.no_progress,
        timeout_s=args.timeout,
    )


def _launch(args: argparse.Namespace) -> int:
    argv = ["--synthetic"] if args.synthetic else []
    for flag, dest in _PASS_ON:
        value = getattr(args, dest)
        if value is not None and not (dest == "data" and args.synthetic):
            argv += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    if args.no_progress:
        argv.append("--no-progress")
    return launch_torchrun(args.nproc, ["-m", "haloflow.cli.train_dlrm", *argv]).returncode


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # checks the arguments before any process starts
    if args.nproc is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return _launch(args)

    def show(record: dict) -> None:
        print(json.dumps(record), flush=True)

    try:
        train_dlrm(config, on_record=show)
    finally:
        shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m haloflow.cli.train_dlrm``: the command alone, errors as one line and exit 2."""
    from haloflow.cli import run_command

    parser = argparse.ArgumentParser(prog="haloflow train dlrm")
    add_arguments(parser)
    return run_command(parser.prog, run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
