"""Where the real data sets live: ``$HALOFLOW_DATA``, else ``../shared/data`` beside the project root."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_root"]


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
