"""Outputs written all at once, and what an output path named on the command line may be.

A folder (``atomic_directory``) or a file (``atomic_output``) is built under a temporary sibling name, then
renamed into place::

    parent/
      .out.tmp-1a2b3c/      <- everything is written here first
      out/                  <- appears only when the block finishes without an exception

A rename inside one file system is atomic, so a reader sees either the old output, the new one, or (while an
old folder is being replaced) neither for an instant — never a half-written one. An exception (or Ctrl-C)
inside the block removes the temporary and leaves any existing ``out`` untouched.

Only what haloflow writes is ever renamed over or removed. What each kind of path gets::

    the path is                       a file output                    a folder output (overwrite=True)
    ------------------------------    -----------------------------    -----------------------------------
    absent, or a regular file         temporary, then renamed          refused if a file
    a link to a file (or dangling)    the file it names, the same way; the link stays a link
    a FIFO, a character device,       written through: opened and      refused
      /proc/self/fd/N, /dev/stdout    written, never renamed
    a folder                          refused                          replaced only if empty or ours (the
                                                                       caller's ``ours`` knows its metadata)
    a link to a folder                refused                          the folder it names, as above

A full file system (``ENOSPC``, or a short write while under 1 MiB is free) becomes one ``OutputError`` naming
the path ("cannot write out: no space left on device"), and the temporary is removed.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from haloflow.errors import ConfigError, HaloflowError, OutputError, OutputExistsError

__all__ = ["atomic_directory", "atomic_output", "atomic_write_text", "check_absent", "check_replaceable",
           "check_file_replaceable", "owned_suffix", "process_alive", "remove_stale",
           "open_stream", "full_disk_error", "reporting_full_disk"]

log = logging.getLogger(__name__)

_FULL = (errno.ENOSPC, errno.EDQUOT)
_NEARLY_FULL = 1 << 20  # bytes free under which a short write without an errno counts as a full disk
# Links there name a process's open descriptors; the path they resolve to is not a name to rename over.
_DESCRIPTOR_DIRS = ("/proc/", "/dev/fd/")


# ------------------------------------------------------------------------------------------------ a full disk
def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def full_disk_error(err: BaseException, path: str | os.PathLike, probe: str | os.PathLike | None = None
                    ) -> OutputError | None:
    """An ``OutputError`` naming ``path`` when ``err`` came from a full file system, else None.

    Full means an ``ENOSPC`` / ``EDQUOT`` anywhere in ``err``'s chain (torch's writer raises ``RuntimeError:
    unexpected pos`` over the ``OSError`` of the Python file it writes to), or an ``OSError`` without an errno
    (numpy's short write, "N requested and M written") while the file system of ``probe`` (default ``path``)
    has under 1 MiB free.
    """
    if isinstance(err, HaloflowError) or not isinstance(err, Exception):
        return None
    seen, e = set(), err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL:
            return OutputError(path, os.strerror(e.errno).lower(), errno=e.errno)
        e = e.__cause__ or e.__context__
    if isinstance(err, OSError) and err.errno is None:
        free = _free_bytes(Path(probe if probe is not None else path))
        if free is not None and free < _NEARLY_FULL:
            return OutputError(path, f"no space left on device ({free:,} bytes free)", errno=errno.ENOSPC)
    return None


@contextmanager
def reporting_full_disk(path: str | os.PathLike, probe: str | os.PathLike | None = None) -> Iterator[None]:
    """Re-raise an exception of the block that ``full_disk_error`` recognises as that ``OutputError``."""
    try:
        yield
    except Exception as err:
        full = full_disk_error(err, path, probe)
        if full is None:
            raise
        raise full from err


# ------------------------------------------------------------------------------------------------ what a path is
def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a file"


def _through_descriptor(path: Path) -> bool:
    """Does ``path`` or a link it passes through name an open descriptor (``/proc/self/fd/1``, ``/dev/stdout``)?"""
    p = Path(os.path.abspath(path))
    for _ in range(40):  # the kernel's own limit on links followed
        if str(p).startswith(_DESCRIPTOR_DIRS):
            return True
        if not p.is_symlink():
            return False
        p = Path(os.path.abspath(p.parent / os.readlink(p)))
    return False


def _file_target(path: Path) -> tuple[bool, Path]:
    """(``stream``, the file to write) for a file output: a stream is written through, a file is replaced by a
    rename at the real path (through any links)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:  # absent, or a link to nothing yet
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"cannot write {path}: it is a folder; expected a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
            return True, path
        raise ConfigError(f"cannot write {path}: it is {_kind(st.st_mode)}; expected a file, a FIFO or a "
                          "character device")
    if _through_descriptor(path):
        return True, path
    return False, Path(os.path.realpath(path)) if path.is_symlink() else path


def _folder_target(target: Path) -> Path:
    """The folder a folder output writes: ``target``, or the folder a link at ``target`` names."""
    return Path(os.path.realpath(target)) if target.is_symlink() else target


def check_absent(target: str | os.PathLike, overwrite: bool) -> None:
    """Raise ``OutputExistsError`` when ``target`` exists and ``overwrite`` is False."""
    if Path(target).exists() and not overwrite:
        raise OutputExistsError(f"{target} already exists; pass overwrite=True (--overwrite) to replace it")


def check_replaceable(target: str | os.PathLike, overwrite: bool, ours: Callable[[Path], bool] | None = None,
                      what: str = "folder") -> None:
    """Raise unless ``atomic_directory`` may write ``target``: it is absent, or ``overwrite`` is given and it is an
    empty folder or one that ``ours`` recognises (its metadata file). Call it first to fail before a long
    computation, not after.

    Raises:
        OutputExistsError: ``target`` exists and ``overwrite`` is False.
        ConfigError: ``target`` is a file, a device, or a folder that is not ``ours``: never replaced.
    """
    target = Path(target)
    real = _folder_target(target)
    if not os.path.lexists(real):
        return
    check_absent(target, overwrite)
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"refusing to replace {target}: it is {_kind(st.st_mode)}, not a {what}; choose another "
                          "--out")
    if any(real.iterdir()) and not (ours is not None and ours(real)):
        raise ConfigError(f"refusing to replace {target}: it is not a {what} written by haloflow (its metadata file "
                          "is missing or another program's); choose another --out")


def check_file_replaceable(path: str | os.PathLike | None, overwrite: bool, ours: Callable[[Path], bool],
                           flag: str) -> None:
    """Raise unless a file output may replace what is at ``path``: nothing, an empty file, a regular file that
    ``ours`` recognises as haloflow's (``utils/owned.py``), or anything with ``overwrite``. A link, a FIFO or a
    device is not checked here: it is written through as before (module docstring). Call it before the work.

    Raises:
        OutputExistsError: a regular file is there that haloflow did not write, and ``overwrite`` is False.
    """
    if path is None or overwrite:
        return
    path = Path(path)
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return
    try:
        mine = ours(path)
    except OSError:  # unreadable: not known to be ours
        mine = False
    if not mine:
        raise OutputExistsError(f"{flag} {path}: a file is already there that haloflow did not write; pass "
                                "--overwrite to replace it, or choose another path")


# ------------------------------------------------------------------------------------------------ leftovers
def owned_suffix() -> str:
    """``<pid>-<random>``: the end of a temporary's name, so that a later run can tell whose it is."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: not gone, not a zombie (killed, not yet reaped); someone else's counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:  # a process killed but not yet reaped by its parent (a zombie) is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def remove_stale(parent: Path, prefix: str) -> list[Path]:
    """Remove ``parent/<prefix><pid>-<random>`` entries whose process is gone (a run killed with SIGKILL, or a
    machine that lost power, cannot clean up after itself), and say so. Entries of a running process stay, and so
    does anything whose name does not carry a pid."""
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        pid = entry.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or process_alive(int(pid)):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        log.warning("removed %s, left by an earlier run that was killed (pid %s)", entry, pid)
        removed.append(entry)
    return removed


# ------------------------------------------------------------------------------------------------ writing
@contextmanager
def atomic_directory(target: str | os.PathLike, *, overwrite: bool = False,
                     ours: Callable[[Path], bool] | None = None, what: str = "folder") -> Iterator[Path]:
    """Yield an empty temporary folder beside ``target``; rename it to ``target`` when the block succeeds.

    Args:
        target: the folder to create (through a link at ``target``: the folder it names). Its parent is created
            if missing.
        overwrite: replace an existing ``target`` — only an empty folder or one ``ours`` recognises.
        ours: tells a folder of this kind by its metadata file (e.g. a partition folder's meta.json).
        what: the kind of folder, for messages ("partition folder").

    Raises:
        OutputExistsError: (a ``FileExistsError`` and a ``ConfigError``) ``target`` exists and ``overwrite`` is
            False.
        ConfigError: ``target`` is not a folder haloflow may replace (``check_replaceable``).
        OutputError: the file system is full; the temporary folder is gone.
    """
    target = Path(target)
    check_replaceable(target, overwrite, ours, what)
    real = _folder_target(target)
    tmp = real.parent / f".{real.name}.tmp-{owned_suffix()}"
    with reporting_full_disk(target, real.parent):
        real.parent.mkdir(parents=True, exist_ok=True)
        for kind in ("tmp", "old"):  # a killed run's half-written or half-replaced folder
            remove_stale(real.parent, f".{real.name}.{kind}-")
        tmp.mkdir()
    try:
        yield tmp
        with reporting_full_disk(target, tmp):
            _rename_into_place(tmp, target, real, overwrite, ours, what)
    except BaseException as err:
        full = full_disk_error(err, target, tmp)  # asked before the temporary's space is given back
        shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from err
        raise
    log.info("wrote %s", target)


def _rename_into_place(tmp: Path, target: Path, real: Path, overwrite: bool, ours, what: str) -> None:
    if not os.path.lexists(real):
        os.replace(tmp, real)
        return
    check_replaceable(target, overwrite, ours, what)  # again: it may have appeared while we were writing
    old = real.parent / f".{real.name}.old-{tmp.name.split('.tmp-', 1)[1]}"
    os.replace(real, old)
    os.replace(tmp, real)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Yield a file opened for writing whose contents become ``path`` when the block succeeds.

    A regular file (or a link to one) is written to a temporary sibling of the real file and renamed over it; a
    FIFO, a character device or a descriptor's link (``/proc/self/fd/1``) is opened and written through. The
    parent folder is created if missing.

    Raises:
        IsADirectoryError: ``path`` is a folder.
        ConfigError: ``path`` is a block device or a socket.
        OutputError: the file system is full (the temporary is removed).
    """
    path = Path(path)
    stream, real = _file_target(path)
    if stream:
        with reporting_full_disk(path), open(path, mode) as f:
            yield f
        return
    tmp = real.with_name(f".{real.name}.tmp-{owned_suffix()}")
    remove_stale(real.parent, f".{real.name}.tmp-")
    try:
        with reporting_full_disk(path, real.parent):
            real.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, mode) as f:
                yield f
            os.replace(tmp, real)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, HaloflowError):
            raise
        raise type(err)(f"cannot write {path}: {err.strerror or err}") from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` as ``atomic_output`` does (a reader sees the old file or the new one, never half
    of it; a FIFO or a device is written through); returns ``path``."""
    with atomic_output(path) as f:
        f.write(text)
    return Path(path)


def open_stream(path: str | os.PathLike, *, append: bool = False) -> IO:
    """Open ``path`` for lines written as they come (a log that ``tail -f`` follows), line-buffered.

    A regular file (or a link to one) is truncated (``append``: added to), a FIFO or a character device is written
    through; nothing is renamed, so what was written stays if the process dies. Write with
    ``reporting_full_disk(path)`` around.
    """
    path = Path(path)
    stream, real = _file_target(path)
    with reporting_full_disk(path):
        if not stream:
            real.parent.mkdir(parents=True, exist_ok=True)
        return open(path if stream else real, "a" if append and not stream else "w", buffering=1)


def is_regular_target(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a regular file (or a link to one, or nothing yet): what can be read back and
    rewritten, unlike a FIFO or a device."""
    return not _file_target(Path(path))[0]
