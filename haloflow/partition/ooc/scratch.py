"""`ScratchSpace`: the temporary files of one out-of-core run, in one folder that is removed however the run ends.

::

    TMP_DIR/.haloflow-ooc-<pid>-<random>/   (TMP_DIR = --tmp-dir, default the folder --out goes in)
      bucket-<b>.bin       pass 2: edge keys, one file per range of rows        removed as each is sorted
      csr/indptr.npy  csr/indices.npy   pass 2's CSR (original ids)             removed at the end
      part-<k>/edges.npy rows.npy halo.npy send.npy <node data>.npy  pass 4     removed as each part is written

The folder goes on success, on an exception, and on Ctrl-C (KeyboardInterrupt unwinds through ``__exit__``); a
run killed with SIGKILL cannot remove it, so the next run in the same TMP_DIR removes every such folder whose
process is gone, and says so.
`note` records the folder's size at the points where it is largest, so the run can report its peak disk use.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from haloflow.utils.atomic import remove_stale

__all__ = ["ScratchSpace"]

_PREFIX = ".haloflow-ooc-"  # then the owning process's id: a later run removes the folder once that process is gone

log = logging.getLogger(__name__)


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:  # removed while we looked
                pass
    return total


class ScratchSpace:
    """A temporary folder under ``parent`` (see the module docstring); use it as a context manager."""

    def __init__(self, parent: str | os.PathLike):
        self.parent = Path(parent)
        self.root: Path | None = None
        self.peak_bytes = 0

    def __enter__(self) -> "ScratchSpace":
        self.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(self.parent, _PREFIX)  # a killed run's (SIGKILL: no __exit__ ran), said on stderr
        self.root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=self.parent))
        log.info("temporary files in %s", self.root)
        return self

    def path(self, *parts: str) -> Path:
        """A path inside the folder (its parent folders made)."""
        p = self.root.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def folder(self, *parts: str) -> Path:
        """A folder inside the scratch folder, made if missing."""
        p = self.root.joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def note(self) -> int:
        """The folder's size now; keeps the largest seen in ``peak_bytes``."""
        size = _tree_bytes(self.root) if self.root is not None else 0
        self.peak_bytes = max(self.peak_bytes, size)
        return size

    def __exit__(self, *exc) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            log.info("removed the temporary files (at most %d bytes)", self.peak_bytes)
            self.root = None
