import contextlib
import os
import stat

import numpy as np
import pytest

from haloflow.errors import ConfigError, OutputError
from haloflow.utils.atomic import (atomic_directory, atomic_output, atomic_write_text, open_stream,
                                  reporting_full_disk)
from tests.conftest import fill_disk, reading_fifo


def _ours(folder):
    return (folder / "ours.json").is_file()


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_folder_appears_only_at_the_end(tmp_path):
    target = tmp_path / "sub" / "out"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("1")
        assert not target.exists() and tmp.parent == target.parent
    assert (target / "a.txt").read_text() == "1"
    assert _names(target.parent) == ["out"]


def test_exception_leaves_nothing_and_keeps_old(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "ours.json").write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_directory(target, overwrite=True, ours=_ours) as tmp:
            (tmp / "new.txt").write_text("new")
            raise RuntimeError("boom")
    assert _names(tmp_path) == ["out"]
    assert _names(target) == ["ours.json"]


def test_existing_target_needs_overwrite(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(FileExistsError, match="out already exists"):
        with atomic_directory(target):
            pass
    with atomic_directory(target, overwrite=True) as tmp:  # an empty folder may be replaced
        (tmp / "ours.json").write_text("new")
    with atomic_directory(target, overwrite=True, ours=_ours) as tmp:  # and one of ours
        (tmp / "new.txt").write_text("new")
    assert _names(target) == ["new.txt"]
    assert _names(tmp_path) == ["out"]


def test_overwrite_never_replaces_what_is_not_ours(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("x")
    with pytest.raises(ConfigError, match="refusing to replace .*notes: it is not a table folder written by haloflow"):
        with atomic_directory(notes, overwrite=True, ours=_ours, what="table folder"):
            pytest.fail("the block must not run")
    (tmp_path / "file.txt").write_text("keep")
    os.mkfifo(tmp_path / "fifo")
    for path, kind in ((tmp_path / "file.txt", "a file"), (tmp_path / "fifo", "a FIFO")):
        with pytest.raises(ConfigError, match=f"refusing to replace .*: it is {kind}, not a folder"):
            with atomic_directory(path, overwrite=True, ours=_ours):
                pass
    assert (notes / "mine.txt").read_text() == "x" and (tmp_path / "file.txt").read_text() == "keep"
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert _names(tmp_path) == ["fifo", "file.txt", "notes"]


def test_a_link_to_a_folder_is_written_through(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "ours.json").write_text("old")
    link = tmp_path / "link"
    link.symlink_to(real)
    with atomic_directory(link, overwrite=True, ours=_ours) as tmp:
        (tmp / "ours.json").write_text("new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (real / "ours.json").read_text() == "new" and _names(tmp_path) == ["link", "real"]


def test_write_text_replaces_whole_file(tmp_path):
    path = tmp_path / "sub" / "a.json"
    assert atomic_write_text(path, "old") == path
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert _names(path.parent) == ["a.json"]
    with pytest.raises(IsADirectoryError, match="sub: it is a folder"):
        atomic_write_text(tmp_path / "sub", "x")


def test_write_text_through_a_link_keeps_the_link(tmp_path):
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("old")
    link, dangling = tmp_path / "link.txt", tmp_path / "dangling.txt"
    link.symlink_to(theirs)
    dangling.symlink_to(tmp_path / "later.txt")
    atomic_write_text(link, "new")
    atomic_write_text(dangling, "made")
    assert link.is_symlink() and theirs.read_text() == "new"
    assert dangling.is_symlink() and (tmp_path / "later.txt").read_text() == "made"
    assert _names(tmp_path) == ["dangling.txt", "later.txt", "link.txt", "theirs.txt"]


def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "fifo"
    with reading_fifo(fifo) as got:
        with atomic_output(fifo, "wb") as f:
            f.write(b"line 1\n")
    assert got == [b"line 1\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode) and _names(tmp_path) == ["fifo"]


def test_devices_are_written_through_and_a_full_one_is_one_error(device_nodes):
    atomic_write_text(device_nodes["null"], "gone\n")
    with pytest.raises(OutputError, match=r"cannot write .*dev-full: no space left on device"):
        atomic_write_text(device_nodes["full"], "x" * 10_000)
    log = open_stream(device_nodes["full"])
    with pytest.raises(OutputError, match="no space left on device"), reporting_full_disk(device_nodes["full"]):
        log.write("a line\n")  # line-buffered: written, and refused, now
    with contextlib.suppress(OSError):
        log.close()
    for path in device_nodes.values():
        assert stat.S_ISCHR(os.lstat(path).st_mode)


def test_open_stream_truncates_a_file_and_keeps_what_was_written(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("an old run\n")
    f = open_stream(path)
    f.write("first\n")
    assert path.read_text() == "first\n"  # line-buffered: there before the file is closed
    f.close()


def test_a_full_disk_is_one_error_naming_the_path_and_leaves_no_temporary(small_tmpfs):
    fill_disk(small_tmpfs, leave=200_000)
    with pytest.raises(OutputError, match=r"cannot write .*plan\.json: no space left on device") as err:
        atomic_write_text(small_tmpfs / "plan.json", "x" * 400_000)
    assert isinstance(err.value, OSError) and err.value.errno is not None
    with pytest.raises(OutputError, match=r"cannot write .*parts: no space left on device"):
        with atomic_directory(small_tmpfs / "parts") as tmp:
            np.save(tmp / "a.npy", np.zeros(100_000))  # a short write: numpy's OSError has no errno
    assert _names(small_tmpfs) == ["filler"]
