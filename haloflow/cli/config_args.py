"""The trainers' flags, generated from their config dataclasses' field declarations (``utils/config_flags.py``).

One walk over the config's fields, nested configs included, gives every flag its place; the same walk builds
the config back from the parsed namespace, inner configs first::

    GCNTrainConfig                          argparse: flag -> dest (the field's path)     --help group
      hidden_dim  option(16, "--hidden")    --hidden HIDDEN       -> "hidden_dim"              options
      halo        nested(HaloConfig, "halo exchange", follow={"seed": "seed"})
        staleness option(0)                 --staleness STALENESS -> "halo.staleness"          halo exchange
        seed      hidden(0)                 (none: follows --seed)
      runtime     nested(RuntimeConfig, "running")
        checkpoint  nested(CheckpointConfig, "checkpoints and recovery")
          every   option(0, "--checkpoint-every")  --checkpoint-every N -> "runtime.checkpoint.every"

A ``ConfigError`` carries the field it is about; the config that raised it is known while it is built, so the
field's path gives its flag and the message becomes ``--hidden: hidden_dim must be >= 1, got 0``. A value of the
wrong type never gets that far: argparse names the flag itself. Every option's ``--help`` line ends with its
default (``HelpFormatter``).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from haloflow.errors import ConfigError
from haloflow.utils.config_flags import Follows, Hidden, Nested, Option, cli_meta
from haloflow.utils.help_format import HelpFormatter, show_default

__all__ = ["ConfigArgs", "HelpFormatter", "int_list", "show_default"]


def int64(text: str) -> int:
    """An int flag: any int a 64-bit signed integer holds (what torch, numpy and the OS take); past that, argparse's
    ``invalid int64 value`` before any work, not an OverflowError deep in a run."""
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{text} is outside the 64-bit integer range")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """``"512,256,64"`` -> ``(512, 256, 64)``: the parser of ``tuple[int, ...]`` fields."""
    try:
        values = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 512,256,64, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one integer, got {text!r}")
    return values


@dataclasses.dataclass(frozen=True)
class _Field:
    path: str  # "runtime.checkpoint.every": the argparse dest of an option
    name: str
    meta: Option | Nested | Follows | Hidden
    hint: Any  # the field's type, resolved
    default: Any  # its value in the default config (dataclasses.MISSING: required)


class ConfigArgs:
    """The flags of config class ``cls`` and the way back from parsed arguments to a ``cls``.

    ::

        args = ConfigArgs(GCNTrainConfig)
        args.add_arguments(parser)                 # at start-up
        config = args.build(parser.parse_args())   # a GCNTrainConfig, or ConfigError naming the flag
    """

    def __init__(self, cls: type):
        self.cls = cls
        self._fields: dict[str, _Field] = {}
        self._follow: dict[str, str] = {}  # path -> the path whose flag sets it
        self._walk(cls, "", None)
        for target, source in self._follow.items():
            if source not in self._fields or not isinstance(self._fields[source].meta, Option):
                raise TypeError(f"{cls.__name__}.{target} follows {source!r}, which is not a field with a flag")
        flags = [self.flag(p) for p, f in self._fields.items() if isinstance(f.meta, Option)]
        if len(set(flags)) != len(flags):
            raise TypeError(f"{cls.__name__}: a flag is declared twice: {sorted(flags)}")

    def _walk(self, cls: type, prefix: str, instance: Any) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            path, meta = prefix + f.name, cli_meta(f)
            if meta is None:
                raise TypeError(f"{self.cls.__name__}.{path} declares no flag: give it option(...), nested(...), "
                                "follows(...) or hidden(...) (haloflow/utils/config_flags.py)")
            if instance is not None:
                default = getattr(instance, f.name)
            elif f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = dataclasses.MISSING
            self._fields[path] = _Field(path, f.name, meta, hints[f.name], default)
            if isinstance(meta, Follows):
                self._follow[path] = prefix + meta.source
            elif isinstance(meta, Nested):
                self._follow.update({f"{path}.{inner}": prefix + outer for inner, outer in meta.follow.items()})
                self._walk(hints[f.name], path + ".", default)

    # ---------------------------------------------------------------------------------------------- reading
    def flag(self, path: str) -> str | None:
        """The flag that sets the field at ``path`` (``"halo.seed"`` -> ``"--seed"``); None for a hidden field."""
        if path in self._follow:
            return self.flag(self._follow[path])
        f = self._fields.get(path)
        if f is None or not isinstance(f.meta, Option):
            return None
        return f.meta.flag or "--" + f.name.replace("_", "-")

    @property
    def flags(self) -> dict[str, str]:
        """Every field the command line sets, by path, and its flag."""
        return {p: flag for p in self._fields if (flag := self.flag(p)) is not None}

    @property
    def hidden(self) -> dict[str, str]:
        """Every field the command line leaves alone, by path, and where its value comes from instead."""
        return {p: f.meta.why for p, f in self._fields.items() if isinstance(f.meta, Hidden) and p not in self._follow}

    # ---------------------------------------------------------------------------------------------- argparse
    def add_arguments(self, parser: argparse.ArgumentParser, *,
                      into: dict[str, Any] | None = None) -> dict[str, argparse._ArgumentGroup]:
        """Add every option to ``parser``: a nested config's in a group named by its ``nested(title=...)``, and
        the fields named in ``into`` (path -> group) there instead (``--dataset`` and ``--partitions`` in one
        mutually exclusive group). Returns the groups by title."""
        into, groups = dict(into or {}), {}
        containers: dict[str, Any] = {"": parser}  # path prefix -> where its options go
        for path, f in self._fields.items():
            prefix = path.rpartition(".")[0]
            where = containers[prefix]
            if isinstance(f.meta, Nested):
                if f.meta.title not in groups:
                    groups[f.meta.title] = parser.add_argument_group(f.meta.title)
                containers[path] = groups[f.meta.title]
            elif isinstance(f.meta, Option):
                self._add_option(into.pop(path, where), f)
        if into:
            raise TypeError(f"into names fields without a flag: {sorted(into)}")
        return groups

    def _add_option(self, where, f: _Field) -> None:
        meta, flag = f.meta, self.flag(f.path)
        kwargs: dict[str, Any] = {"dest": f.path, "help": meta.help}
        if _kinds(f.hint) == [bool]:
            if meta.negate:
                kwargs.update(action="store_false", default=True)
            elif f.default is False:
                kwargs.update(action="store_true", default=False)
            else:
                raise TypeError(f"{self.cls.__name__}.{f.path} defaults to True: give it negate=True and a --no- flag")
        else:
            kwargs.update(type=meta.parse or _parser_for(f.hint, f.path), metavar=meta.metavar, choices=meta.choices)
            if meta.metavar is None and meta.choices is None:
                kwargs["metavar"] = flag.lstrip("-").upper().replace("-", "_")
            if f.default is dataclasses.MISSING:
                kwargs["required"] = True
            else:
                kwargs["default"] = f.default
        action = where.add_argument(flag, **kwargs)
        action.means = meta.means  # read by HelpFormatter

    def build(self, args: argparse.Namespace, given: dict[str, Any] | None = None):
        """The config from the parsed ``args``; ``given`` (path -> value) sets hidden fields the CLI computes
        (GCN's ``reader_options``). A ``ConfigError`` about a field with a flag is raised again naming the flag."""
        return self._build(self.cls, "", args, dict(given or {}))

    def _build(self, cls: type, prefix: str, args: argparse.Namespace, given: dict[str, Any]):
        kwargs = {}
        for f in dataclasses.fields(cls):
            path = prefix + f.name
            entry = self._fields[path]
            if path in given:
                kwargs[f.name] = given[path]
            elif isinstance(entry.meta, Nested):
                kwargs[f.name] = self._build(entry.hint, path + ".", args, given)  # raises naming its own flag
            elif path in self._follow:
                source = self._follow[path]
                value = getattr(args, source)
                kwargs[f.name] = entry.default if value == self._fields[source].default else value
            elif isinstance(entry.meta, Option):
                kwargs[f.name] = getattr(args, path)
            elif entry.default is not dataclasses.MISSING:
                kwargs[f.name] = entry.default
        try:
            return cls(**kwargs)
        except ConfigError as err:
            flag = self.flag(prefix + err.field) if err.field else None
            if flag is None or str(err).startswith(flag):
                raise
            raise ConfigError(f"{flag}: {err}", field=err.field) from None


def _kinds(hint) -> list:
    """The types a field may hold, None left out (``str | Path | None`` -> ``[str, Path]``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(hint) if a is not type(None)]
    return [hint]


def _parser_for(hint, path: str):
    kinds = _kinds(hint)
    if str in kinds:  # str | Path: the text as typed, as a Python caller would pass it
        return str
    if len(kinds) == 1:
        kind = kinds[0]
        if kind is int:
            return int64
        if kind in (float, Path):
            return kind
        if typing.get_origin(kind) is tuple and typing.get_args(kind) == (int, ...):
            return int_list
    raise TypeError(f"{path}: no parser for {hint}; give option(parse=...)")
