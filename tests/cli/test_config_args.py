"""`haloflow train MODEL`'s flags, generated from the family's config (cli/config_args.py), for every family in
engine/families.py: every field reachable, every default shown, the defaults parsed back to the dataclass's own,
and a bad value answered with a line naming its flag."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import typing

import pytest

from haloflow.cli import build_parser, main
from haloflow.cli.config_args import ConfigArgs
from haloflow.engine.families import FAMILIES
from haloflow.utils.config_flags import Nested, cli_meta

FAMILY_NAMES = sorted(FAMILIES)

# A few bad values per family: (argv after the input, the flag the error line must start with).
BAD = {
    "gcn": [(["--hidden", "0"], "--hidden: hidden_dim must be >= 1, got 0"),
            (["--halo-keep", "2"], "--halo-keep: halo_keep must be in (0, 1], got 2.0"),
            (["--bucket-bytes", "0"], "--bucket-bytes: bucket_bytes must be > 0, got 0"),
            (["--staleness", "1"], "--staleness applies only to --partitions"),
            (["--checkpoint-every", "-1"], "--checkpoint-every: checkpoint every must be >= 0, got -1")],
    "dlrm": [(["--cache-ratio", "2"], "--cache-ratio: cache_ratio must be in (0, 1], got 2.0"),
             (["--log-every", "-1"], "--log-every: log_every must be >= 0, got -1"),
             (["--timeout", "0"], "--timeout: timeout_s must be a finite number > 0, got 0.0"),
             (["--checkpoint-keep", "0"], "--checkpoint-keep: checkpoint keep must be >= 1, got 0")],
    "tgn": [(["--neighbors", "0"], "--neighbors: num_neighbors must be >= 1, got 0"),
            (["--max-batches", "0"], "--max-batches: max_train_batches must be >= 1, got 0"),
            (["--mrr-negatives", "-1"], "--mrr-negatives: mrr_negatives must be >= 0, got -1"),
            (["--fail-at", "0"], "--fail-at: fail at must be >= 1, got 0")],
}


def _config_class(name: str) -> type:
    entry = FAMILIES[name]
    return getattr(importlib.import_module(entry.config_module), entry.config)


def _subparser(name: str) -> argparse.ArgumentParser:
    """The family's parser, as `haloflow train` registers it."""
    subparsers = argparse.ArgumentParser(prog="haloflow train").add_subparsers()
    importlib.import_module(f"haloflow.cli.{FAMILIES[name].cli_module}").register(subparsers)
    return subparsers.choices[name]


def _leaf_paths(cls: type, prefix: str = "") -> list[str]:
    """Every field of ``cls`` that is not itself a nested config, by dotted path."""
    hints, out = typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        if isinstance(cli_meta(f), Nested):
            out += _leaf_paths(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def _minimal_input(parser: argparse.ArgumentParser) -> list[str]:
    """The one input a run needs: each required flag, or the first of each required group, with "-"."""
    required = [a for a in parser._actions if a.required and a.option_strings]
    required += [g._group_actions[0] for g in parser._mutually_exclusive_groups if g.required]
    return [arg for a in required for arg in ([a.option_strings[0]] if a.nargs == 0 else [a.option_strings[0], "-"])]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_every_field_has_a_flag_or_is_marked_hidden(name):
    cls = _config_class(name)
    config_args = ConfigArgs(cls)
    leaves = _leaf_paths(cls)
    assert sorted(leaves) == sorted([*config_args.flags, *config_args.hidden])
    assert all(why for why in config_args.hidden.values())  # each hidden field says where its value comes from
    options = {s for a in _subparser(name)._actions for s in a.option_strings}
    assert set(config_args.flags.values()) <= options


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_help_shows_every_default(name):
    parser = _subparser(name)
    text = parser.format_help()
    entries, current = [], None  # one entry per option: its line and the help lines under it
    for line in text.splitlines():
        if line.startswith("  -"):
            current = [line]
            entries.append(current)
        elif current is not None and line.startswith("    "):
            current.append(line)
        else:
            current = None
    entries = [" ".join(" ".join(e).split()) for e in entries if not e[0].lstrip().startswith("-h, --help")]
    assert len(entries) == len([a for a in parser._actions if a.option_strings and a.dest != "help"])
    for entry in entries:
        assert "(default: " in entry or "(required)" in entry, entry


def test_defaults_shown_are_the_dataclass_defaults():
    text = " ".join(_subparser("dlrm").format_help().split())
    assert "(default: 300)" in text and "(default: 512,256,64)" in text and "(default: none, no cap)" in text
    gcn = " ".join(_subparser("gcn").format_help().split())
    assert "width of the hidden layers (default: 16)" in gcn and "(default: 0.0005)" in gcn
    assert "(default: 120)" in gcn  # DLRM's runtime has its own timeout


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_defaults_parse_back_to_the_dataclass_defaults(name):
    cls = _config_class(name)
    parser = _subparser(name)
    argv = _minimal_input(parser)
    args = build_parser().parse_args(["train", name, *argv])
    config = importlib.import_module(f"haloflow.cli.{FAMILIES[name].cli_module}").config_from_args(args)
    inputs = {a.dest: getattr(args, a.dest) for a in parser._actions if a.option_strings and a.option_strings[0] in
              argv}
    assert config == cls(**inputs)


def test_one_flag_sets_the_fields_that_follow_it(tmp_path):
    from haloflow.cli.train_dlrm import config_from_args as dlrm_config
    from haloflow.cli.train_gcn import config_from_args as gcn_config

    def parse(*argv):
        return build_parser().parse_args(["train", *argv])

    c = gcn_config(parse("gcn", "--dataset", "-", "--seed", "7", "--directed", "--no-progress", "--one-based"))
    assert (c.seed, c.halo.seed, c.symmetrize, c.runtime.progress) == (7, 7, False, False)
    assert c.reader_options == (("one_based", True),)
    for given, expected in [([], (100, 0)), (["--log-every", "0"], (100, 0)), (["--log-every", "5"], (5, 5))]:
        c = dlrm_config(parse("dlrm", "--synthetic", *given))  # a JSON record every 100 steps unless told
        assert (c.log_every, c.runtime.log_every) == expected


@pytest.mark.parametrize("name, argv, message", [(n, a, m) for n in FAMILY_NAMES for a, m in BAD[n]])
def test_a_bad_value_names_its_flag(name, argv, message, capsys, tmp_path):
    assert set(BAD) == set(FAMILIES)  # a new family adds its bad values here
    args = [*_minimal_input(_subparser(name)), *(a.format(tmp=tmp_path) for a in argv), "--no-progress"]
    assert main(["train", name, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"haloflow train: error: {message}"), err


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_a_value_of_the_wrong_type_is_argparses_error_naming_the_flag(name, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["train", name, *_minimal_input(_subparser(name)), "--timeout", "soon"])
    assert exit.value.code == 2
    assert "argument --timeout: invalid float value: 'soon'" in capsys.readouterr().err.splitlines()[-1]


def test_a_field_without_a_declaration_is_refused():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Bare:
        width: int = 3

    with pytest.raises(TypeError, match="Bare.width declares no flag"):
        ConfigArgs(Bare)
