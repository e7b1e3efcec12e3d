"""Paths: where the real data sets live (``$HALOFLOW_DATA``, else ``../shared/data`` beside the project root), and
the check that an output folder a user names can be created at all."""

from __future__ import annotations

import os
from pathlib import Path

from haloflow.errors import ConfigError

__all__ = ["data_root", "check_output_parent"]


def data_root() -> Path:
    """The folder of real data sets (it may not exist; callers skip or raise with a reason)."""
    env = os.environ.get("HALOFLOW_DATA")
    if env:
        return Path(env)
    candidates = [Path.cwd() / ".." / "shared" / "data", Path(__file__).resolve().parents[2] / ".." / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    return candidates[-1]


def check_output_parent(path: str | os.PathLike | None, flag: str = "--out") -> None:
    """Raise ``ConfigError`` when the nearest existing folder above ``path`` is a file, so ``path`` can never be
    created (``--out notes.txt/parts``). Call it before any work; creating the folder would fail only at the end.
    ``flag`` names the option in the message; a None ``path`` (the option not given) passes.
    """
    if path is None:
        return
    path = Path(path)
    for parent in path.parents:  # nearest first
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"cannot create {path}: {parent} is a file, expected a folder (choose another "
                                  f"{flag})")
            return
