"""The flags that start ranks, and the one way ``--nproc K`` starts K ranks.

::

    haloflow train MODEL ... [--nproc K [--max-restarts N] [--nnodes N --node-rank R --rdzv-endpoint HOST:PORT]]

The flags every trainer shares (``--device``, ``--timeout``, ``--log-jsonl``, checkpoints) are ``RuntimeConfig``'s,
generated with the rest of the trainer's config (``config_args.py``). ``--nproc K`` (outside torchrun) runs
``torchrun --standalone --nproc-per-node K -m haloflow ARGS`` where ARGS is the command line as typed, less the
flags that start ranks: every trainer relaunches the same way, and the ranks parse the same flags the user gave.
With ``--nnodes N``, each of N machines runs the same command with its own ``--node-rank``, and the N torchrun
agents meet at node 0's ``--rdzv-endpoint`` (``launch.NodeLayout``).

The launcher ends with one line of its own: a rank's error (exit 2), a rank that died (exit 1), or, after it
forwarded a Ctrl-C or SIGTERM to the job (``launch.JobStopped``), where the run stood (exit 128 + signal).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from haloflow.engine.families import FAMILIES
from haloflow.engine.launch import JobStopped, NodeLayout, launch_torchrun
from haloflow.engine.run_config import expect_hosts as _expect_hosts
from haloflow.engine.run_config import expect_parts as _expect_parts
from haloflow.errors import ConfigError, HaloflowError

__all__ = ["add_launch_arguments", "relaunch_if_asked", "launch_or_train", "folder_parts"]


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that start ranks rather than configure one: the ranks never see them (``--nproc`` and the
    node flags are dropped from their command line, ``--max-restarts`` goes to torchrun)."""
    g = p.add_argument_group("starting ranks")
    nproc = g.add_argument("--nproc", type=int, metavar="K", help="start K local ranks with torchrun (K x --nnodes "
                           "as the input allows: the plan's or the partition's parts; for GCN any number that divides "
                           "the folder's parts with a power of two per rank); leave it out under your own torchrun")
    nproc.means = "this process alone"  # read by config_args.HelpFormatter
    g.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="with --nproc: when a rank dies, restart every rank from the last checkpoint, up to N times")
    g.add_argument("--nnodes", type=int, default=1, metavar="N",
                   help="with --nproc: a job of N machines, each running this command with its own --node-rank")
    g.add_argument("--node-rank", type=int, default=0, metavar="R",
                   help="with --nnodes: this machine's number, 0 .. N-1; node 0 hosts the rendezvous")
    g.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="with --nnodes: node 0's address and a free port there, the same on every node")


def _nodes(args: argparse.Namespace) -> NodeLayout:
    """The machines ``--nnodes``, ``--node-rank`` and ``--rdzv-endpoint`` describe (checked)."""
    nodes = NodeLayout(nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint)
    if nodes != NodeLayout() and args.nproc is None:
        raise ConfigError("--nnodes, --node-rank and --rdzv-endpoint say where the ranks --nproc starts run; give "
                          "--nproc K (the ranks on each machine)", field="nnodes")
    return nodes


def _check_restarts(args: argparse.Namespace, config) -> None:
    if args.max_restarts and args.nproc is None and "WORLD_SIZE" not in os.environ:
        raise ConfigError("--max-restarts restarts the ranks --nproc starts; give --nproc K (under your own "
                          "torchrun, pass --max-restarts to torchrun)")
    if args.max_restarts and config.runtime.checkpoint.dir is None:
        raise ConfigError("--max-restarts needs --checkpoint-dir: a restart continues from the last checkpoint")


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

    from haloflow.engine.torchrun_main import REPORT_ENV

    nodes = _nodes(args)
    world = args.nproc * nodes.nnodes
    with tempfile.TemporaryDirectory(prefix="haloflow-ranks-") as notes:
        env = {ERROR_DIR_ENV: notes, REPORT_ENV: str(Path(notes, "torchrun.json"))}
        try:
            status = launch_torchrun(args.nproc, ["-m", "haloflow", *_without_launch_flags(args.argv)], env=env,
                                     max_restarts=args.max_restarts, report=True, nodes=nodes).returncode
        except JobStopped as stop:
            return _report_stop(Path(notes), f"haloflow {args.command}", stop.signum)
        if status != 0:
            return _report_failure(Path(notes), world, args.max_restarts, status)
    return status


def _notes(notes: Path, what: str, attempt: int) -> dict[int, Path]:
    """The ranks' notes of one kind in one attempt, by rank (``haloflow.cli._tell_the_launcher`` writes them)."""
    return {int(p.stem.rsplit("rank", 1)[1]): p for p in notes.glob(f"{what}-a{attempt}-rank*.txt")}


def _last_attempt(notes: Path) -> int | None:
    attempts = [int(p.stem.split("-a", 1)[1].split("-", 1)[0]) for p in notes.glob("started-a*-rank*.txt")]
    return max(attempts, default=None)


def _report_stop(notes: Path, prog: str, signum: int) -> int:
    """After the launcher passed SIGINT or SIGTERM on and the job ended: one line, and exit 128 + signal. Ctrl-C
    repeats what the lowest rank said (``interrupted at epoch E; last checkpoint: DIR``); SIGTERM ends the ranks
    at once (``haloflow.cli._on_sigterm``), so it says only that."""
    last = _last_attempt(notes)
    said = _notes(notes, "interrupted", last) if last is not None else {}
    if signum == signal.SIGINT:
        line = said[min(said)].read_text() if said else "interrupted"
    else:
        line = f"stopped by {signal.Signals(signum).name}"
    print(f"{prog}: {line}", file=sys.stderr)
    return 128 + signum


def _report_failure(notes: Path, nproc: int, max_restarts: int, status: int) -> int:
    """After torchrun failed: name the rank that died without a word (exit 1), or repeat the first rank's one-line
    error (a user's mistake: exit 2). ``nproc``: the ranks of the whole job. The ranks' notes come from
    ``haloflow.cli._tell_the_launcher``."""
    last = _last_attempt(notes)
    if last is None:
        return status
    started, done, stopped, errors = (_notes(notes, w, last) for w in ("started", "done", "stopped", "error"))
    failed = _notes(notes, "failed", last)
    if failed:  # a run that failed (a NaN loss): every rank stopped at the same unit; its line, and exit 1
        r = min(failed)
        print(f"haloflow: error: {failed[r].read_text()}", file=sys.stderr)
        return 1
    dead = sorted(set(started) - set(done) - set(stopped))
    try:
        report = json.loads((notes / "torchrun.json").read_text())
    except (OSError, ValueError):
        report = {}
    signals = {int(r): f.get("signal") for r, f in report.get("failures", {}).items()}
    first = report.get("first")
    if first in dead:  # torchrun's root cause first
        dead = [first] + [r for r in dead if r != first]
    restarts = f" after {last} restart{'s' if last != 1 else ''}" if max_restarts else ""
    if dead:
        how = {r: f"killed by {signals[r]}" if signals.get(r) else "killed by a signal or a crash" for r in dead}
        who = ", ".join(f"rank {r} (pid {started[r].read_text().strip()}, {how[r]})" for r in dead)
        seen = ""
        if errors:
            r = min(errors)
            seen = f"; rank {r} saw: {errors[r].read_text()}"
        print(f"haloflow: error: {who} of {nproc} died without a message (kill -9, the out-of-memory killer or a "
              f"crash){restarts}; the other ranks were stopped{seen}", file=sys.stderr)
        return 1
    if errors:  # a user's mistake found by a rank: its one line, and exit 2
        r = min(errors)
        raise RankError(f"rank {r} of {nproc}: {errors[r].read_text()}")
    return status


def launch_or_train(args: argparse.Namespace, config, family: str,
                    parts: Callable[[], tuple[int, str]] | None = None, *, hosted: bool = False) -> int:
    """What every ``haloflow train MODEL`` does after parsing: with ``--nproc K``, check K against what ``parts``
    says the input was made for (before any process starts) and relaunch; otherwise train ``family`` (a name in
    ``engine/families.py``) here and print its summary table on rank 0. The trainer and torch are imported only
    then: a launcher checks and relaunches without them. ``hosted``: the input's parts are V logical ranks that
    any K dividing them by a power of two hosts (``engine/logical.py``), not one per process."""
    _check_restarts(args, config)
    nodes = _nodes(args)
    if args.nproc is not None and parts is not None:
        k, source = parts()
        (_expect_hosts if hosted else _expect_parts)(k, args.nproc * nodes.nnodes, source)
    status = relaunch_if_asked(args)
    if status is not None:
        return status
    result = _entry_point(family)(config)
    if result.rank == 0:
        print(result.summary())
        from haloflow.cli.outputs_written import outputs_written

        if written := outputs_written(config):  # where the JSON log, the checkpoints and --save went
            print(written)
    return 0


def _entry_point(family: str) -> Callable:
    import haloflow.engine  # its lazy names include every family's train_<name> (families.lazy_names)

    return getattr(haloflow.engine, FAMILIES[family].entry_point)


def folder_parts(folder: str) -> Callable[[], tuple[int, str]]:
    """``parts`` for ``launch_or_train``: the part count a partition folder's meta.json records."""

    def parts() -> tuple[int, str]:
        from haloflow.partition.format import load_meta

        return load_meta(folder).num_parts, str(folder)

    return parts


class RankError(HaloflowError):
    """A rank stopped on a user's mistake (its own message, with the rank that found it)."""


# The flags the ranks must not see: the launcher's alone (--max-restarts stays: the ranks check it too).
_LAUNCH_FLAGS = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint")


def _without_launch_flags(argv: list[str]) -> list[str]:
    """``argv`` less the launch flags and their values, also as argparse's abbreviations (``--npr 2``,
    ``--nnod=2``): the parser already accepted the command line, so a word that begins one launch flag's name
    was read as that flag (one that began another option's name too would have been refused as ambiguous)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name, eq, _ = a.partition("=")
        if len(name) > 2 and name.startswith("--") and any(flag.startswith(name) for flag in _LAUNCH_FLAGS):
            skip = not eq
        else:
            out.append(a)
    return out
