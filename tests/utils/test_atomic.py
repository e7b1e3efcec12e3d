import pytest

from haloflow.utils.atomic import atomic_directory, atomic_write_text


def test_folder_appears_only_at_the_end(tmp_path):
    target = tmp_path / "sub" / "out"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("1")
        assert not target.exists() and tmp.parent == target.parent
    assert (target / "a.txt").read_text() == "1"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out"]


def test_exception_leaves_nothing_and_keeps_old(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_directory(target, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]


def test_existing_target_needs_overwrite(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(FileExistsError, match="out already exists"):
        with atomic_directory(target):
            pass
    with atomic_directory(target, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_write_text_replaces_whole_file(tmp_path):
    path = tmp_path / "sub" / "a.json"
    assert atomic_write_text(path, "old") == path
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.json"]
    with pytest.raises(IsADirectoryError, match="sub: it is a folder"):
        atomic_write_text(tmp_path / "sub", "x")
