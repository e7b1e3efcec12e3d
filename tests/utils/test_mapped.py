import numpy as np
import pytest

import haloflow.utils.mapped as mapped
from haloflow.errors import InputFormatError
from haloflow.utils.mapped import MappedNpy, NpyWriter, write_npy


@pytest.mark.parametrize("arr", [np.arange(10), np.zeros((3, 4), np.float32), np.array([True, False]),
                                 np.zeros(0, np.int64), np.zeros((0, 5), np.float32), np.array(5),
                                 np.arange(12).reshape(3, 4).T])
def test_write_npy_writes_np_save_bytes(tmp_path, arr, monkeypatch):
    monkeypatch.setattr(mapped, "_WRITE_SLICE", 16)  # many slices
    np.save(tmp_path / "a.npy", np.ascontiguousarray(arr))
    write_npy(tmp_path / "b.npy", arr)
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()


def _rss_file_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    pytest.skip("no RssFile in /proc/self/status")


def test_a_mapped_array_is_copied_without_staying_resident(tmp_path):
    big = np.arange(1 << 24, dtype=np.int64)  # 128 MiB
    np.save(tmp_path / "big.npy", big)
    del big
    with MappedNpy(tmp_path / "big.npy") as m:
        before = _rss_file_kib()
        write_npy(tmp_path / "copy.npy", m.array)
        assert _rss_file_kib() - before < 80 * 1024  # well under the 128 MiB the copy read
        np.testing.assert_array_equal(m.rows(1000, 1003), [1000, 1001, 1002])
    assert (tmp_path / "copy.npy").read_bytes() == (tmp_path / "big.npy").read_bytes()


def test_npy_writer_of_unknown_length_and_mapped_reads(tmp_path):
    with NpyWriter(tmp_path / "w.npy", np.int32, (None, 2)) as w:
        w.write(np.arange(10).reshape(5, 2))
        w.write(np.arange(4).reshape(2, 2))
    got = np.load(tmp_path / "w.npy")
    assert got.shape == (7, 2) and got.dtype == np.int32 and got[-1].tolist() == [2, 3]
    with MappedNpy(tmp_path / "w.npy") as m:
        assert m.rows(5, 7).tolist() == [[0, 1], [2, 3]] and m.columns(1, 2)[:, 0].tolist() == [1, 3, 5, 7, 9, 1, 3]
    with pytest.raises(ValueError, match=r"2 of 3 rows written"):
        with NpyWriter(tmp_path / "x.npy", np.float32, (3,)) as w:
            w.write(np.ones(2))
    assert not (tmp_path / "x.npy").exists()  # an incomplete file is removed
    (tmp_path / "cut.npy").write_bytes((tmp_path / "w.npy").read_bytes()[:-4])
    with pytest.raises(InputFormatError, match=r"cut.npy: is truncated"):
        MappedNpy(tmp_path / "cut.npy")
