"""The `haloflow` command line.

Each subcommand lives in its own module here with a ``register(subparsers)`` function that adds its parser and
sets ``func`` to a callable taking the parsed namespace. The CLI only parses arguments into config dataclasses
and calls the Python API; a user's mistake (``HaloflowError``, a missing file) becomes one line on stderr and
exit status 2, never a traceback. A reader that closes the pipe early (``| head -1``) ends the command quietly
with status 141, as it ends ``yes`` or ``cat``.

Only the subcommand the command line names gets its whole parser; the others are one-line entries (``COMMAND``
and ``HELP``, module constants) for ``haloflow --help``. Building every parser would import the trainers' configs
and with them torch, about 230 MiB of RSS and a second of start-up that ``haloflow partition`` never needs (its own
imports stop at NumPy, numba and pyarrow: about 100 MiB before it reads a byte).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import signal
import sys
from pathlib import Path
from collections.abc import Callable

from haloflow import host
from haloflow.errors import ConfigError, HaloflowError, RunFailed

__all__ = ["main", "build_parser", "register_modules", "run_command", "name_flags"]

# What a user's mistake raises: our own errors and the OS's complaints about the paths they gave.
_USER_ERRORS = (HaloflowError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)

# The commands whose first run on a machine compiles numba kernels: said on stderr when it is a terminal (a person
# waits; a pipe or a test reading stderr gets its one-line contract), see utils/kernel_cache.py.
_COMPILING = ("partition", "train", "predict", "bench", "demo")

# Subcommand modules, in the order `--help` lists them.
_COMMANDS = ["partition", "inspect", "plan_tables", "preprocess", "train", "export", "predict", "plot", "bench", "demo"]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI's parser; with ``command`` (a subcommand's name, or ``""`` for none), only that subcommand's
    parser is whole and the others are one-line entries (see the module docstring)."""
    from haloflow.engine.families import titles

    parser = argparse.ArgumentParser(
        prog="haloflow",
        description=f"Partition graphs and embedding tables, and train {titles()} models exactly across processes.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    register_modules(parser.add_subparsers(dest="command", metavar="COMMAND"), _COMMANDS, only=command)
    return parser


def register_modules(subparsers, modules: list[str], *, only: str | None = None) -> None:
    """Import ``haloflow.cli.<module>`` for each name and let it add its parser (``register(subparsers)``); with
    ``only``, the other modules add an entry of their ``COMMAND`` and ``HELP`` alone."""
    for name in modules:
        module = importlib.import_module(f"haloflow.cli.{name}")
        if only is None or module.COMMAND == only:
            module.register(subparsers)
        else:
            subparsers.add_parser(module.COMMAND, help=module.HELP)


def _named_command(argv: list[str]) -> str:
    """The subcommand ``argv`` names: its first word that is not a flag (the top level's one flag, ``-v``, takes
    no value), or ``""``."""
    return next((word for word in argv if not word.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    host.apply()  # first, before any subcommand imports torch: its OpenMP runtime reads the wait policy as it loads
    try:
        status = _main(argv)
        sys.stdout.flush()  # what a pipe's buffer still holds goes now, inside the try, not at the exit
    except BrokenPipeError:
        return _reader_gone()
    return status


def _reader_gone() -> int:
    """Our stdout's reader left (``haloflow ... | head -1``): stop quietly with 141 = 128 + SIGPIPE, the status
    the shell shows for ``yes | head -1``, whose ``yes`` dies of SIGPIPE without a word. Python ignores SIGPIPE
    (so that sockets raise instead of killing it), hence the BrokenPipeError this turns back into that. stdout
    now points at /dev/null, so that the interpreter's last flush at exit finds no broken pipe to complain of."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # stdout is no file (a test's capture): no flush to fear
        pass
    return 128 + signal.SIGPIPE


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_named_command(argv))
    args = parser.parse_args(argv)
    args.argv = argv  # as typed: what `--nproc K` hands each rank (less --nproc)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command in _COMPILING and os.environ.get("RANK", "0") == "0" and sys.stderr.isatty():
        from haloflow.utils.kernel_cache import FIRST_RUN_NOTE, kernels_cached

        if not kernels_cached():
            print(f"haloflow: {FIRST_RUN_NOTE}", file=sys.stderr)
    return run_command(f"haloflow {args.command}", args.func, args)


def name_flags(err: ConfigError, flags: dict[str, str]) -> ConfigError:
    """The same error with each config field named in its message (a key of ``flags``) replaced by the flag the
    user typed (its value), so that ``PartitionConfig.num_parts must be ...`` reads ``--parts must be ...``.

    For ``partition`` and ``plan-tables``; the trainers' flags come from their configs' field declarations, which
    name the flag without rewriting the message (``config_args.py``)."""
    msg = str(err)
    for field, flag in flags.items():
        msg = msg.replace(field, flag)
    return ConfigError(msg, field=err.field)


ERROR_DIR_ENV = "HALOFLOW_ERROR_DIR"  # set by `--nproc`'s launcher: ranks leave their one-line error there


def _tell_the_launcher(what: str, text: str = "") -> None:
    """Under haloflow's own launcher, leave a note where it reads them after torchrun ends: ``started``,
    ``error`` (the one-line message), ``failed`` (a run that failed: its line), ``interrupted`` (where Ctrl-C
    stopped the run), ``done`` or ``stopped`` (by torchrun's SIGTERM), per attempt and rank. A rank that started and left neither ``done`` nor ``stopped`` died
    without a word (SIGKILL, a crash)."""
    folder, rank = os.environ.get(ERROR_DIR_ENV), os.environ.get("RANK")
    if folder and rank is not None:
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        try:
            Path(folder, f"{what}-a{int(attempt)}-rank{int(rank)}.txt").write_text(text or str(os.getpid()))
        except (OSError, ValueError):
            pass  # the rank's own line on stderr still says it


def _on_sigterm(signum, frame) -> None:
    """torchrun stops the other ranks with SIGTERM when one fails: note it, then die of it as before."""
    _tell_the_launcher("stopped")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _user_error(prog: str, message: str, *, note: str = "error", status: int = 2) -> int:
    if not os.environ.get(ERROR_DIR_ENV):  # under `--nproc`, the launcher prints the first rank's line once
        print(f"{prog}: error: {message}", file=sys.stderr)
    _tell_the_launcher(note, message)
    return status


def run_command(prog: str, func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Call ``func(args)``; a user's mistake becomes ``prog: error: ...`` on stderr and exit status 2."""
    if os.environ.get(ERROR_DIR_ENV) and os.environ.get("RANK") is not None:
        from haloflow.engine.launch import die_with_parent

        _tell_the_launcher("started")
        signal.signal(signal.SIGTERM, _on_sigterm)
        die_with_parent()  # torchrun's agent gone (kill -9): SIGTERM, as if it had stopped this rank
    try:
        result = func(args)
    except RunFailed as err:  # not the user's input: the run itself failed (a NaN loss), so 1, not 2
        return _user_error(prog, str(err), note="failed", status=1)
    except _USER_ERRORS as err:
        return _user_error(prog, str(err))
    except OSError as err:  # a full disk that no writer named: still one line, not a traceback
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        return _user_error(prog, f"cannot write {err.filename or 'an output'}: {os.strerror(err.errno).lower()}")
    except KeyboardInterrupt as err:  # the trainer's Interrupted says where the run stood
        message = str(err) or "interrupted"
        if os.environ.get(ERROR_DIR_ENV):  # under `--nproc`, the launcher prints one rank's line once
            _tell_the_launcher("interrupted", message)
        else:
            print(f"{prog}: {message}", file=sys.stderr)
        return 130
    finally:
        _tell_the_launcher("done")
    return int(result or 0)
