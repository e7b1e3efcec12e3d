"""Flags every trainer shares, and the one way ``--nproc K`` starts K ranks.

::

    haloflow train MODEL ... [--nproc K] [--device auto|cpu|cuda] [--timeout S] [--log-jsonl FILE]
                             [--log-every N] [--no-progress]

``--nproc K`` (outside torchrun) runs ``torchrun --standalone --nproc-per-node K -m haloflow ARGS`` where ARGS
is the command line as typed, less ``--nproc``: every trainer relaunches the same way, and the ranks parse the
same flags the user gave.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from haloflow.engine.launch import launch_torchrun
from haloflow.engine.runtime import DEVICES, RuntimeConfig, expect_parts as _expect_parts
from haloflow.errors import ConfigError, HaloflowError

__all__ = ["add_runtime_arguments", "runtime_config", "relaunch_if_asked", "launch_or_train", "folder_parts", "RUNTIME_FLAGS"]

# config field -> the flag that sets it (for error messages that name what the user typed)
RUNTIME_FLAGS = {"device": "--device", "timeout_s": "--timeout", "log_jsonl": "--log-jsonl",
                 "log_every": "--log-every", "nproc": "--nproc"}


def add_runtime_arguments(p: argparse.ArgumentParser, defaults: RuntimeConfig) -> None:
    g = p.add_argument_group("running")
    g.add_argument("--nproc", type=int, metavar="K", help="start K local ranks with torchrun (K = the partition's "
                   "or the plan's parts); leave it out under your own torchrun")
    g.add_argument("--device", choices=DEVICES, default=defaults.device,
                   help=f"where each rank computes (default {defaults.device}: CUDA when present; rank r uses "
                   "GPU LOCAL_RANK)")
    g.add_argument("--timeout", dest="timeout_s", type=float, default=defaults.timeout_s, metavar="S",
                   help=f"seconds a rank waits for a silent peer before failing (default {defaults.timeout_s:g})")
    g.add_argument("--log-jsonl", metavar="FILE", help="rank 0 writes one JSON object per epoch / logging step")
    g.add_argument("--log-every", type=int, default=0, metavar="N",
                   help="without a progress bar, print a line every N epochs or steps (default: ~10 lines)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def runtime_config(args: argparse.Namespace, defaults: RuntimeConfig) -> RuntimeConfig:
    try:
        return RuntimeConfig(device=args.device, timeout_s=args.timeout_s, log_jsonl=args.log_jsonl,
                             progress=not args.no_progress, log_every=args.log_every)
    except ConfigError as err:
        flag = RUNTIME_FLAGS.get(err.field or "")
        raise ConfigError(f"{flag}: {err}" if flag else str(err), field=err.field) from None


def relaunch_if_asked(args: argparse.Namespace) -> int | None:
    """With ``--nproc K`` outside torchrun: run K ranks of the same command and return their exit status.
    Otherwise None: the caller trains in this process (alone, or as one of torchrun's ranks)."""
    if args.nproc is None:
        return None
    if args.nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {args.nproc}", field="nproc")
    if "WORLD_SIZE" in os.environ:
        if int(os.environ["WORLD_SIZE"]) != args.nproc:
            raise ConfigError(f"--nproc {args.nproc} under torchrun with WORLD_SIZE={os.environ['WORLD_SIZE']}; "
                              "under torchrun, leave --nproc out", field="nproc")
        return None  # a rank started by our own relaunch (or a matching torchrun): train here
    from haloflow.cli import ERROR_DIR_ENV

    with tempfile.TemporaryDirectory(prefix="haloflow-ranks-") as errors:
        status = launch_torchrun(args.nproc, ["-m", "haloflow", *_without_nproc(args.argv)],
                                 env={ERROR_DIR_ENV: errors}).returncode
        failed = sorted(Path(errors).glob("rank*.txt"), key=lambda p: int(p.stem[4:]))
        if status != 0 and failed:  # a user's mistake found by a rank: its one line, and exit 2
            first = failed[0]
            raise RankError(f"rank {first.stem[4:]} of {args.nproc}: {first.read_text()}")
    return status


def launch_or_train(args: argparse.Namespace, config, train, parts: Callable[[], tuple[int, str]] | None = None) -> int:
    """What every ``haloflow train MODEL`` does after parsing: with ``--nproc K``, check K against what ``parts``
    says the input was made for (before any process starts) and relaunch; otherwise ``train(config)`` here and
    print its summary table on rank 0."""
    if args.nproc is not None and parts is not None:
        k, source = parts()
        _expect_parts(k, args.nproc, source)
    status = relaunch_if_asked(args)
    if status is not None:
        return status
    result = train(config)
    if result.rank == 0:
        print(result.summary())
    return 0


def folder_parts(folder: str) -> Callable[[], tuple[int, str]]:
    """``parts`` for ``launch_or_train``: the part count a partition folder's meta.json records."""

    def parts() -> tuple[int, str]:
        from haloflow.partition.format import load_meta

        return load_meta(folder).num_parts, str(folder)

    return parts


class RankError(HaloflowError):
    """A rank stopped on a user's mistake (its own message, with the rank that found it)."""


def _without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out
