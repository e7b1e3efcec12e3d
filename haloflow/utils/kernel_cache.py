"""Whether haloflow's compiled kernels are cached yet: the first run on a machine compiles them (numba,
``cache=True``: about 20 s in all, spread over the first calls), and says so instead of looking hung.

numba keeps a kernel's machine code beside its module (``__pycache__/<module>.<function>-<line>.pyXY.nbi`` and
``.nbc``), or under ``NUMBA_CACHE_DIR`` when that is set or the package folder is read-only (then in the user's
cache folder, which this does not search: such a machine is told once more than needed, never less).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["kernels_cached", "FIRST_RUN_NOTE"]

FIRST_RUN_NOTE = ("first run here: compiling haloflow's kernels (numba; about 20 s in all, cached for the next "
                  "runs)")


def kernels_cached() -> bool:
    """True when any of haloflow's numba kernels has a cache file (so this is not the first run here)."""
    roots = [Path(__file__).resolve().parents[1]]
    if os.environ.get("NUMBA_CACHE_DIR"):
        roots.append(Path(os.environ["NUMBA_CACHE_DIR"]))
    for root in roots:
        if root.is_dir() and next(root.rglob("*.nbi"), None) is not None:
            return True
    return False
