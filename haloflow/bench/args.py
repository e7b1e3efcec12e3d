"""Argument types every benchmark's parser shares, so that a bad value is refused by argparse before anything is
generated, partitioned or written (one usage line and ``error: argument --nodes: ...``, exit 2)::

    --nodes 0       at_least(1)     "must be >= 1, got 0"
    --ks abc        k_list            "expected comma-separated positive integers, got 'abc'"
    --ks 1,,2       k_list            "... an empty item"
    --budget abc    byte_size       "expected a size such as 512MiB or 2GiB, got 'abc'"
"""

from __future__ import annotations

import argparse

__all__ = ["at_least", "k_list", "k_list_or_none", "byte_size", "names"]

_INT64 = 2**63 - 1


def at_least(low: int, high: int = _INT64):
    """An int type for argparse: ``low <= value <= high``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {value}" if high < _INT64 else
                                             f"must be >= {low}, got {value}")
        return value

    parse.__name__ = "int"
    return parse


def k_list(text: str) -> str:
    """Comma-separated positive rank counts (``1,2,4``); returned as typed, for the code that splits it."""
    items = text.split(",")
    if any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r} (an empty item)")
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
        if not 1 <= value <= 4096:
            raise argparse.ArgumentTypeError(f"each K must be in [1, 4096], got {value}")
    return text


def k_list_or_none(text: str) -> str:
    """``k_list``, or ``''`` for none."""
    return text if text == "" else k_list(text)


def byte_size(text: str) -> str:
    """A size such as ``512MiB`` (checked here, parsed where used); returned as typed."""
    from haloflow.utils.memory import parse_bytes

    try:
        parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def names(known):
    """Comma-separated names, each one of ``known``."""
    def parse(text: str) -> str:
        items = text.split(",")
        bad = [item for item in items if item not in known]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad))}; expected a comma-separated "
                                             f"subset of {', '.join(known)}")
        return text

    return parse
