"""How every ``--help`` of haloflow reads: each option's sentence followed by its default, or ``(required)``.

One formatter for the CLI's own parsers (``haloflow/cli/``) and the benchmarks' (``haloflow/bench/``), so that
``tests/cli/test_help.py`` can hold every command to it.
"""

from __future__ import annotations

import argparse

__all__ = ["HelpFormatter", "show_default"]


def show_default(action: argparse.Action) -> str:
    """How ``--help`` writes an option's default: ``16``, ``0.0005``, ``512,256,64``, ``none``; a flag without
    a value is ``off`` (not given)."""
    value = action.default
    if action.nargs == 0:  # store_true / store_false: the flag itself is the switch
        return "off"
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written, and ``(default: X)`` (or ``(default: X, what X means)``, or ``(required)``)
    after every option's help that does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or "(default:" in text:
            return text
        if action.required:
            return f"{text} (required)"
        means = getattr(action, "means", None)
        shown = (show_default(action) + (f", {means}" if means else "")).replace("%", "%%")  # argparse %-formats
        return f"{text} (default: {shown})"
