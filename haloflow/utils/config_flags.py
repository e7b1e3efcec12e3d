"""How a config field appears on the command line, declared once, beside the field.

A config dataclass says what each field is to a person typing a command; ``haloflow/cli/config_args.py`` reads
these declarations and builds the argparse arguments and, from the parsed namespace, the config::

    @dataclass(frozen=True, kw_only=True)
    class RuntimeConfig:
        timeout_s: float = option(120.0, "--timeout", metavar="S", help="seconds a rank waits for a silent peer")
        progress: bool = option(True, "--no-progress", negate=True, help="no progress bar")
        checkpoint: CheckpointConfig = nested(CheckpointConfig, "checkpoints and recovery")

    field kind        on the command line                        built from
    option(...)       one flag (--timeout S, --no-progress)      the flag's value
    nested(...)       an argument group of the inner config's    the inner config, built first
    follows(...)      nothing of its own                         another field's flag (--seed -> halo.seed)
    hidden(...)       nothing: set only from Python               its default (or what the CLI passes in)

Every field of a config the CLI builds carries one of the four, so that a new field cannot go missing from the
command line unnoticed. Only the dataclasses import this module; it knows nothing of argparse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import MISSING
from typing import Any

__all__ = ["Option", "Nested", "Follows", "Hidden", "option", "nested", "follows", "hidden", "cli_meta"]

_KEY = "haloflow.cli"  # the key of a field's metadata that holds its declaration


@dataclasses.dataclass(frozen=True)
class Option:
    """One flag. ``flag`` None: ``--`` and the field's name with dashes (``batch_size`` -> ``--batch-size``).

    ``negate``: a bool field that defaults to True and that the flag turns off (``symmetrize`` <-> ``--directed``).
    ``parse``: turns the typed text into the value (default: from the field's type: int, float, str, Path, or
    comma-separated ints for ``tuple[int, ...]``). ``means``: what the default does, when its value alone does not
    say (``0`` -> "about ten lines a run"); ``--help`` shows it after the default.
    """

    flag: str | None
    help: str
    metavar: str | None = None
    choices: Sequence[str] | None = None
    negate: bool = False
    parse: Callable[[str], Any] | None = None
    means: str | None = None


@dataclasses.dataclass(frozen=True)
class Nested:
    """A config inside this one, its flags in an argument group ``title``. ``follow`` maps an inner field to a
    field of the outer config whose flag sets it too (GCN's ``{"seed": "seed"}``: ``--seed`` seeds the halo
    sampling as well as the weights)."""

    title: str
    follow: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Follows:
    """No flag of its own: the value of ``source``'s flag (a dotted path from this config, e.g.
    ``"runtime.log_every"``). The flag left at, or set to, the source's default leaves this field at its own
    default (DLRM: ``--log-every`` 0 means a line about every tenth of the run, but a JSON record every 100 steps)."""

    source: str


@dataclasses.dataclass(frozen=True)
class Hidden:
    """Not on the command line; ``why`` says where the value comes from instead."""

    why: str


def _field(default, default_factory, meta) -> Any:
    kwargs: dict[str, Any] = {"metadata": {_KEY: meta}}
    if default is not MISSING:
        kwargs["default"] = default
    if default_factory is not MISSING:
        kwargs["default_factory"] = default_factory
    return dataclasses.field(**kwargs)


def option(default=MISSING, flag: str | None = None, *, help: str, metavar: str | None = None,
           choices: Sequence[str] | None = None, negate: bool = False, parse: Callable[[str], Any] | None = None,
           means: str | None = None, default_factory=MISSING) -> Any:
    """A field with its flag (no default: the flag is required)."""
    if negate and default is not True:
        raise TypeError(f"negate=True is for bool fields that default to True, not {default!r}")
    return _field(default, default_factory, Option(flag, help, metavar, tuple(choices) if choices else None,
                                                   negate, parse, means))


def nested(factory: Callable[[], Any], title: str, *, follow: dict[str, str] | None = None) -> Any:
    """A nested config (built by ``factory`` when not given), its flags grouped under ``title``."""
    return _field(MISSING, factory, Nested(title, dict(follow or {})))


def follows(default, source: str) -> Any:
    """A field set by another field's flag (see ``Follows``)."""
    return _field(default, MISSING, Follows(source))


def hidden(default=MISSING, *, why: str, default_factory=MISSING) -> Any:
    """A field the command line does not set (see ``Hidden``)."""
    return _field(default, default_factory, Hidden(why))


def cli_meta(f: dataclasses.Field) -> Option | Nested | Follows | Hidden | None:
    """What ``f`` declared (None: nothing, which the CLI generator refuses)."""
    return f.metadata.get(_KEY)
