"""Every command's ``--help``: each option has a sentence of help and says its default (or that it is required)."""

import argparse
import re

import pytest

from haloflow.bench import BENCHMARKS
from haloflow.cli import build_parser


def _parsers(parser: argparse.ArgumentParser, prog: str = "haloflow"):
    """(command line, parser) of every command and subcommand, depth first."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def _commands() -> list[str]:
    top = build_parser()
    names = []
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            names += list(action.choices)
    return names


def _check(prog: str, p: argparse.ArgumentParser, capsys) -> list[str]:
    missing = []
    with pytest.raises(SystemExit):
        p.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "%%" not in text, f"{prog} --help prints '%%'"
    for action in p._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "-h" in action.option_strings:
            continue
        flag = max(action.option_strings, key=len)
        rendered = p._get_formatter()._format_action(action)  # what --help prints for it
        words = re.sub(r"\s+", " ", rendered.split(flag, 1)[1] if flag in rendered else rendered)
        said = words.split("(default:")[0].split("(required)")[0]
        if len(re.findall(r"[a-zA-Z]{2,}", said)) < 2:
            missing.append(f"{prog} {flag}: no help sentence")
        if "(default:" not in rendered and "(required)" not in rendered:
            missing.append(f"{prog} {flag}: no default")
        assert flag in text
    return missing


@pytest.mark.parametrize("command", _commands())
def test_every_option_has_a_sentence_and_its_default(command, capsys):
    parser = build_parser(command)  # the command's whole parser (the others are one-line entries)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    missing = [m for prog, p in _parsers(sub, f"haloflow {command}") for m in _check(prog, p, capsys)]
    assert not missing, "\n".join(missing)


def _bench_parser(module):
    """The parser a benchmark's ``main`` builds (caught as it parses ``--help``)."""
    seen = []
    real = argparse.ArgumentParser.parse_args

    def catch(self, args=None, namespace=None):
        seen.append(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = catch
    try:
        with pytest.raises(SystemExit):
            module.main(["--help"], prog="x")
    finally:
        argparse.ArgumentParser.parse_args = real
    return seen[0]


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_option_has_a_sentence_and_its_default(name, capsys):
    import importlib

    parser = _bench_parser(importlib.import_module(BENCHMARKS[name].module))
    missing = _check(f"haloflow bench {name}", parser, capsys)
    assert not missing, "\n".join(missing)
