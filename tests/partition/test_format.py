import json

import numpy as np
import pytest

from haloflow.errors import ConfigError, PartitionFormatError
from haloflow.partition.format import (
    NODE_DATA,
    PART_ARRAYS,
    PartitionMeta,
    load_meta,
    load_new_to_orig,
    load_partition,
    part_loads,
    reset_part_loads,
    save_partitioned,
    verify_partition,
)
from haloflow.partition.halo import build_parts
from haloflow.partition.stats import partition_stats
from tests.partition.part_oracle import check_parts, relabelling_from_parts, small_dataset

K = 3


@pytest.fixture(scope="module")
def setup():
    ds = small_dataset(seed=11)
    rel = relabelling_from_parts(np.random.default_rng(11).integers(0, K, ds.num_nodes), K)
    meta = PartitionMeta(
        method="random", seed=11, num_parts=K, num_nodes=ds.num_nodes, num_edges=ds.graph.num_edges,
        bounds=tuple(rel.book.bounds.tolist()), stats=partition_stats(ds.graph, rel, train_mask=ds.train_mask),
        node_data=NODE_DATA, num_classes=ds.num_classes, name=ds.name, config={"imbalance": 1.05},
    )
    return ds, rel, meta


def _save(tmp_path, setup, **kw):
    ds, rel, meta = setup
    out = tmp_path / "parts"
    return out, save_partitioned(out, build_parts(ds.graph, rel, ds), meta, new_to_orig=rel.new_to_orig, **kw)


def test_round_trip(tmp_path, setup):
    ds, rel, _ = setup
    out, written = _save(tmp_path, setup)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts"]  # no temporary folder left
    meta = load_meta(out)
    assert meta.to_json() == written.to_json()
    assert (meta.method, meta.seed, meta.num_parts, meta.num_classes, meta.name) == ("random", 11, K, 4, "small")
    assert meta.edge_cut == pytest.approx(written.stats.edge_cut) and meta.config == {"imbalance": 1.05}
    assert len(meta.files) == 1 + K * (len(PART_ARRAYS) + len(NODE_DATA))
    raw = json.loads((out / "meta.json").read_text())
    assert raw["balance"] == pytest.approx(written.stats.balance) and raw["files"]["part-0/indptr.npy"]["crc32"] > 0
    parts = [load_partition(out, k, meta=meta) for k in range(K)]
    assert isinstance(parts[0].indices, np.memmap)
    check_parts(ds.graph, parts, np.asarray(load_new_to_orig(out)), ds)
    in_memory = load_partition(out, 1, mmap=False)
    assert not isinstance(in_memory.indices, np.memmap)
    ref = next(p for i, p in enumerate(build_parts(ds.graph, rel, ds)) if i == 1)
    for name in PART_ARRAYS + NODE_DATA:
        got, want = getattr(in_memory, name), getattr(ref, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert verify_partition(out).num_parts == K


def test_existing_folder_needs_overwrite(tmp_path, setup):
    out, _ = _save(tmp_path, setup)
    with pytest.raises(ConfigError, match=r"parts already exists; pass overwrite=True \(--overwrite\)"):
        _save(tmp_path, setup)
    (out / "marker").write_text("x")
    _save(tmp_path, setup, overwrite=True)
    assert not (out / "marker").exists() and load_meta(out).num_parts == K
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    ds, rel, meta = setup
    with pytest.raises(ConfigError, match=r"refusing to replace .*notes: it is not a partition folder"):
        save_partitioned(other, build_parts(ds.graph, rel, ds), meta, new_to_orig=rel.new_to_orig, overwrite=True)
    assert (other / "keep.txt").exists()


def test_failure_midway_leaves_nothing(tmp_path, setup):
    ds, rel, meta = setup

    def parts_then_crash():
        gen = build_parts(ds.graph, rel, ds)
        yield next(gen)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        save_partitioned(tmp_path / "parts", parts_then_crash(), meta, new_to_orig=rel.new_to_orig)
    with pytest.raises(ConfigError, match=r"got 2 parts, expected meta.num_parts = 3"):
        parts = list(build_parts(ds.graph, rel, ds))[:2]
        save_partitioned(tmp_path / "parts", parts, meta, new_to_orig=rel.new_to_orig)
    with pytest.raises(ConfigError, match=r"part number 0 has part_id 1"):
        parts = list(build_parts(ds.graph, rel, ds))[1:]
        save_partitioned(tmp_path / "parts", parts, meta, new_to_orig=rel.new_to_orig)
    assert list(tmp_path.iterdir()) == []


def test_load_errors_name_file_found_and_expected(tmp_path, setup):
    with pytest.raises(PartitionFormatError, match=r"partition folder .*nowhere does not exist"):
        load_meta(tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    with pytest.raises(PartitionFormatError, match=r"partition folder .*file is a file, not a folder"):
        load_meta(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PartitionFormatError, match=r"empty/meta.json is missing"):
        load_partition(tmp_path / "empty", 0)
    out, _ = _save(tmp_path, setup)
    with pytest.raises(PartitionFormatError, match=r"part 3 is out of range: it has parts 0..2"):
        load_partition(out, 3)

    # Truncated: the size check catches it even without checksums.
    target = out / "part-1" / "indices.npy"
    data = target.read_bytes()
    target.write_bytes(data[:-8])
    with pytest.raises(PartitionFormatError, match=rf"part-1/indices.npy is truncated or altered: {len(data) - 8} "
                                                   rf"bytes, expected {len(data)}"):
        load_partition(out, 1, verify=False)
    # Altered, same size: the checksum sees it; without checksums, the id it made out of range is seen.
    target.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(PartitionFormatError, match=r"part-1/indices.npy: indices\[\d+\] = -\d+ is out of range"):
        load_partition(out, 1, verify=False)
    with pytest.raises(PartitionFormatError, match=r"part-1/indices.npy is corrupt: CRC-32 0x[0-9a-f]{8}, expected"):
        load_partition(out, 1)
    with pytest.raises(PartitionFormatError, match=r"indices.npy is corrupt"):
        verify_partition(out)
    target.write_bytes(data)

    (out / "part-2" / "labels.npy").unlink()
    with pytest.raises(PartitionFormatError, match=r"part-2/labels.npy is missing \(listed in meta.json\)"):
        load_partition(out, 2)

    meta = json.loads((out / "meta.json").read_text())
    meta["format_version"] = 99
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionFormatError, match=r"meta.json: format_version is 99, expected 1"):
        load_partition(out, 0)
    del meta["format_version"]
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionFormatError, match=r"format_version is None, expected 1"):
        load_meta(out)
    meta["format_version"] = 1
    del meta["bounds"]
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionFormatError, match=r"meta.json: missing field 'bounds'"):
        load_meta(out)
    (out / "meta.json").write_text("{not json")
    with pytest.raises(PartitionFormatError, match=r"meta.json: not valid JSON at line 1"):
        load_meta(out)


def test_part_loads_count_each_part_of_each_folder(tmp_path, setup):
    out, _ = _save(tmp_path, setup)
    other = tmp_path / "other"
    out.rename(other)
    out, _ = _save(tmp_path, setup)
    reset_part_loads()
    load_meta(out)
    load_new_to_orig(out)
    assert part_loads(out) == {}  # neither loads a part
    for folder, k in [(out, 1), (out, 1), (str(out) + "/", 0), (other, 2)]:  # the same folder however spelt
        load_partition(folder, k)
    assert part_loads(out) == {0: 1, 1: 2} and part_loads(other) == {2: 1}
    with pytest.raises(PartitionFormatError):
        load_partition(out, K)  # a failed load loads nothing
    assert part_loads(out) == {0: 1, 1: 2}
    reset_part_loads()
    assert part_loads(out) == {} and part_loads(other) == {}


def test_id_map_must_be_a_listed_permutation(tmp_path, setup):
    out, _ = _save(tmp_path, setup)
    path = out / "new_to_orig.npy"
    good = np.load(path)
    bad = good.copy()
    bad[1] = bad[0]
    np.save(path, bad)  # same size: only the checksum and the meaning differ
    with pytest.raises(PartitionFormatError, match=rf"new_to_orig.npy: original id {bad[0]} appears 2 times: "
                                                   r"expected a permutation of 0..\d+"):
        load_new_to_orig(out, verify=False)
    with pytest.raises(PartitionFormatError, match=r"new_to_orig.npy is corrupt"):
        verify_partition(out)
    with pytest.raises(PartitionFormatError, match=r"appears 2 times"):
        verify_partition(out, checksums=False)
    bad[1] = -1
    np.save(path, bad)
    with pytest.raises(PartitionFormatError, match=r"new_to_orig\[1\] = -1 is out of range: expected original ids"):
        load_new_to_orig(out, verify=False)
    np.save(path, good)
    meta = json.loads((out / "meta.json").read_text())
    del meta["files"]["new_to_orig.npy"]
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionFormatError, match=r"meta.json lists no new_to_orig.npy \(the map from new to "
                                                   r"original node ids\): partition the graph again"):
        load_new_to_orig(out)


@pytest.mark.parametrize("field, value", [("num_classes", float("inf")), ("num_parts", 2**63), ("bounds", [0]),
                                          ("files", [1]), ("stats", {"num_nodes": float("nan")})])
def test_meta_fields_of_the_wrong_type_are_a_format_error(tmp_path, setup, field, value):
    out, _ = _save(tmp_path, setup)
    meta = json.loads((out / "meta.json").read_text())
    meta[field] = value
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PartitionFormatError, match=r"meta.json: "):
        verify_partition(out)
