"""Write a folder all at once: build it under a temporary sibling name, then rename it into place.

::

    parent/
      .out.tmp-1a2b3c/      <- everything is written here first
      out/                  <- appears only when the block finishes without an exception

A rename inside one file system is atomic, so a reader sees either the old folder, the new one, or (while an
old folder is being replaced) neither for an instant — never a half-written one. An exception (or Ctrl-C)
inside the block removes the temporary folder and leaves any existing ``out/`` untouched.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from haloflow.errors import OutputExistsError

__all__ = ["atomic_directory", "atomic_write_text", "check_absent"]

log = logging.getLogger(__name__)


def check_absent(target: str | os.PathLike, overwrite: bool) -> None:
    """Raise ``OutputExistsError`` when ``target`` exists and ``overwrite`` is False.

    ``atomic_directory`` checks this itself; call it first to fail before a long computation, not after.
    """
    if Path(target).exists() and not overwrite:
        raise OutputExistsError(f"{target} already exists; pass overwrite=True (--overwrite) to replace it")


@contextmanager
def atomic_directory(target: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``target``; rename it to ``target`` when the block succeeds.

    Args:
        target: the folder to create. Its parent is created if missing.
        overwrite: replace an existing ``target``; without it an existing ``target`` raises FileExistsError
            before anything is written.

    Raises:
        OutputExistsError: (a ``FileExistsError`` and a ``ConfigError``) ``target`` exists and ``overwrite`` is
            False.
    """
    target = Path(target)
    check_absent(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = target.parent / f".{target.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        if not overwrite:  # created by someone else while we were writing
            shutil.rmtree(tmp, ignore_errors=True)
            check_absent(target, overwrite)
        old = target.parent / f".{target.name}.old-{tag}"
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    log.info("wrote %s", target)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a temporary sibling of ``path``, then rename it over ``path``; returns ``path``.

    A reader sees the old file or the new one, never half of it. The parent folder is created if missing.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write {path}: it is a folder; expected a file name")
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise type(err)(f"cannot write {path}: {err.strerror or err}") from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
