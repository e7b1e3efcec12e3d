import json

import numpy as np
import pytest
import torch

from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.data.criteo_loader import ClickLoader, ClickLoaderConfig, ClickParquetWriter
from haloflow.data.jagged import JaggedBatch
from haloflow.errors import ConfigError, PartitionFormatError
from haloflow.utils.atomic import atomic_directory

SIZES = (5, 3, 11)


def _write_rows(folder, rng, n, multi_hot=False, row_group_size=7):
    """n rows written in uneven appends; returns (labels, dense, bags per row) as written."""
    labels = rng.integers(0, 2, n).astype(np.int8)
    dense = rng.random((n, 4)).astype(np.float32)
    bags = [[list(rng.integers(0, s, rng.integers(0 if multi_hot else 1, 4 if multi_hot else 2))) for s in SIZES]
            for _ in range(n)]  # fmt: skip
    with atomic_directory(folder) as tmp:
        w = ClickParquetWriter(tmp, table_sizes=SIZES, num_dense=4, row_group_size=row_group_size, multi_hot=multi_hot)
        for lo, hi in ((0, 3), (3, 20), (20, n)):
            if multi_hot:
                sparse = JaggedBatch.from_lists([[bags[i][t] for i in range(lo, hi)] for t in range(len(SIZES))])
            else:
                sparse = np.array([[b[0] for b in bags[i]] for i in range(lo, hi)])
            w.append("train", labels[lo:hi], dense[lo:hi], sparse)
        w.close({"test": True})
    return labels, dense, bags


def _read_all(loader):
    out = list(loader)
    labels = torch.cat([b.labels for b in out])
    dense = torch.cat([b.dense for b in out])
    bags = [row for b in out for row in zip(*b.sparse.to_lists())]  # per row: one bag per feature
    return out, labels, dense, [list(r) for r in bags]


@pytest.mark.parametrize("multi_hot", [False, True])
def test_round_trip_across_row_groups(tmp_path, rng, multi_hot):
    labels, dense, bags = _write_rows(tmp_path / "d", rng, 31, multi_hot=multi_hot)
    meta = json.loads((tmp_path / "d" / "metadata.json").read_text())
    assert meta["splits"]["train"] == {"file": "train.parquet", "rows": 31, "row_groups": 5}  # 4 x 7 + 3
    loader = ClickLoader(tmp_path / "d", ClickLoaderConfig(batch_size=5))
    batches, got_labels, got_dense, got_bags = _read_all(loader)
    assert [b.batch_size for b in batches] == [5] * 6 + [1] and len(loader) == 7
    assert got_labels.tolist() == labels.astype(np.float32).tolist()
    assert torch.equal(got_dense, torch.from_numpy(dense))
    assert got_bags == [[[int(i) for i in bag] for bag in row] for row in bags]
    counts = np.load(tmp_path / "d" / "id_counts.npz")
    for t, size in enumerate(SIZES):
        want = np.bincount([i for row in bags for i in row[t]], minlength=size)
        assert counts[f"C{t + 1}"].tolist() == want.tolist()


def test_drop_last_and_shuffle_by_seed(tmp_path, rng):
    labels, dense, _ = _write_rows(tmp_path / "d", rng, 31)
    cfg = dict(batch_size=4, shuffle=True, seed=3, drop_last=True)
    loader = ClickLoader(tmp_path / "d", ClickLoaderConfig(**cfg))
    batches, _, got_dense, _ = _read_all(loader)
    assert [b.batch_size for b in batches] == [4] * 7 and len(loader) == 7
    order = loader.row_group_order()
    assert sorted(order) == list(range(5)) and order != list(range(5))
    groups = np.split(dense, [7, 14, 21, 28])  # rows of each row group
    expected = np.concatenate([groups[g] for g in order])[:28]
    assert torch.equal(got_dense, torch.from_numpy(expected))
    again = ClickLoader(tmp_path / "d", ClickLoaderConfig(**cfg))
    assert again.row_group_order() == order
    again.set_epoch(1)
    assert sorted(again.row_group_order()) == list(range(5)) and again.row_group_order() != order


def test_stopping_early_releases_the_background_thread(tmp_path, rng):
    _write_rows(tmp_path / "d", rng, 31)
    loader = ClickLoader(tmp_path / "d", ClickLoaderConfig(batch_size=1, prefetch=1))
    it = iter(loader)
    first = next(it)
    it.close()  # runs the generator's cleanup: stop event, join
    assert first.batch_size == 1
    assert sum(b.batch_size for b in loader) == 31  # a fresh epoch still sees everything


def test_generator_parquet_round_trip(tmp_path):
    gen = ClickLogGenerator(ClickLogConfig(scale=1e-4, seed=5))
    meta = gen.write_parquet(tmp_path / "syn", {"train": 300, "val": 50, "test": 20}, row_group_size=64)
    assert meta["table_sizes"] == list(gen.sizes)
    loader = ClickLoader(tmp_path / "syn", ClickLoaderConfig(batch_size=32, split="val"))
    _, labels, dense, _ = _read_all(loader)
    want = gen.samples(300, 50)  # val follows train in the stream
    assert torch.equal(labels, want.labels) and torch.equal(dense, want.dense)
    got_ids = torch.cat([b.sparse.values.view(len(gen.sizes), -1) for b in loader], dim=1)
    assert torch.equal(got_ids, want.sparse.values.view(len(gen.sizes), -1))


def test_errors(tmp_path, rng):
    with pytest.raises(PartitionFormatError, match="no metadata.json"):
        ClickLoader(tmp_path, ClickLoaderConfig(batch_size=4))
    with pytest.raises(ConfigError, match="split must be one of train, val, test"):
        ClickLoaderConfig(batch_size=4, split="valid")
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        ClickLoaderConfig(batch_size=0)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "metadata.json").write_text(json.dumps({"format": "other", "version": 9}))
    with pytest.raises(PartitionFormatError, match="format 'other' version 9, expected 'haloflow-clicks'"):
        ClickLoader(tmp_path / "x", ClickLoaderConfig(batch_size=4))


def test_damaged_or_edited_folders_are_one_error_naming_the_file(tmp_path):
    out = tmp_path / "syn"
    ClickLogGenerator(ClickLogConfig(scale=1e-4, max_rows=20)).write_parquet(out, {"train": 40, "val": 8, "test": 8},
                                                                             row_group_size=16)
    data = (out / "train.parquet").read_bytes()
    (out / "train.parquet").write_bytes(data[:-20] + bytes([data[-20] ^ 1]) + data[-19:])  # in the footer
    with pytest.raises(PartitionFormatError, match=r"train.parquet is corrupt: CRC-32"):
        ClickLoader(out, ClickLoaderConfig(batch_size=4))
    (out / "train.parquet").write_bytes(data)
    meta = json.loads((out / "metadata.json").read_text())
    for field, value, message in [("num_dense", 10**12, r"but metadata.json's num_dense = 1000000000000"),
                                  ("table_sizes", [2] * 26, r"column C\d+ holds id \d+, but metadata.json's "
                                                            r"table_sizes\[\d+\] = 2"),
                                  ("table_sizes", "26", r"table_sizes is 26, expected a non-empty list")]:
        (out / "metadata.json").write_text(json.dumps({**meta, field: value}))
        with pytest.raises(PartitionFormatError, match=message):
            ClickLoader(out, ClickLoaderConfig(batch_size=4))
