"""The sweep over the folder formats: OGB node-property folders, Planetoid sets, partition folders (what
``haloflow inspect`` and training load) and preprocessed click folders (what ``train dlrm`` and ``plan-tables``
load). Each example copies a small valid folder, breaks one file -- its bytes (``mutate``), its JSON values
(``mutate_json``), or one array re-saved with a bad value and its size and CRC-32 re-recorded so that only the
meaning checks can see it -- and reads it in this process."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from haloflow.data.criteo_loader import ClickLoader, ClickLoaderConfig
from haloflow.data.readers import read_dataset
from haloflow.partition.format import load_partition, verify_partition
from haloflow.partition.planner.specs import load_table_specs
from haloflow.utils.checksum import crc32_file
from tests.sweep.mutate import BAD_NUMBERS, SWEEP, check_clean, mutate, mutate_json

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """One valid folder of each kind, built once; every example works on a copy."""
    from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
    from haloflow.partition.api import PartitionConfig
    from haloflow.partition.pipeline import partition_dataset
    from tests.data.test_ogb import make_folder
    from tests.data.test_planetoid import make_planetoid
    from tests.engine.scripts.common import small_dataset

    root = tmp_path_factory.mktemp("sweep_seeds")
    make_folder(root / "ogb")
    make_planetoid(root / "planetoid", np.random.default_rng(0), name="cora")
    dataset = small_dataset(num_nodes=40, num_edges=120, feat_dim=3, num_classes=3, seed=1)
    for k in (1, 3):
        partition_dataset(dataset, PartitionConfig(num_parts=k, method="random"), root / f"parts{k}", progress=False)
    ClickLogGenerator(ClickLogConfig(scale=1e-4, max_rows=20)).write_parquet(
        root / "clicks", {"train": 40, "val": 16, "test": 16}, row_group_size=16)
    return root


def _copy(seeds: Path, kind: str, tmp: str) -> Path:
    out = Path(tmp) / kind
    shutil.copytree(seeds / kind, out)
    return out


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


@settings(max_examples=60, **SWEEP)
@given(st.data())
def test_ogb_folders(seeds, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _copy(seeds, "ogb", tmp)
        target = data.draw(st.sampled_from(_files(folder)))
        how = data.draw(st.sampled_from(["text", "text", "bytes", "remove"]))
        if how == "remove":
            target.unlink()
        elif how == "bytes":
            target.write_bytes(mutate(data, target.read_bytes(), compress=False))
        else:  # edit the CSV inside the gzip
            target.write_bytes(gzip.compress(mutate(data, gzip.decompress(target.read_bytes()), compress=False)))
        check_clean("OGB folder", lambda: read_dataset(folder), str(folder))


def _bad_pickle_object(data):
    import scipy.sparse as sp

    return data.draw(st.sampled_from([
        {"a": [1]}, {0: ["x"]}, {0: [-5]}, {0: [10**12]}, [1, 2], np.zeros((3,)), np.zeros((0, 0)),
        sp.csr_matrix((2, 7)), np.full((5, 3), np.nan, dtype=np.float32), "text", None, {1.5: [2]},
    ]))


@settings(max_examples=100, **SWEEP)
@given(st.data())
def test_planetoid_sets(seeds, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _copy(seeds, "planetoid", tmp)
        target = data.draw(st.sampled_from(_files(folder)))
        how = data.draw(st.sampled_from(["bytes", "bytes", "object", "remove"]))
        if how == "remove":
            target.unlink()
        elif how == "object" and not target.name.endswith("test.index"):
            target.write_bytes(pickle.dumps(_bad_pickle_object(data), protocol=2))
        else:
            target.write_bytes(mutate(data, target.read_bytes(), compress=False))
        check_clean("Planetoid folder", lambda: read_dataset(folder), str(folder))


def _rerecord(folder: Path, meta: dict, rel: str) -> None:
    """Record a rewritten array in meta.json as the writer would, so that size and CRC-32 agree with it."""
    path = folder / rel
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception:  # not an .npy any more: record only what a checksum can say
        meta["files"][rel].update(size=path.stat().st_size, crc32=crc32_file(path))
        return
    meta["files"][rel].update(size=path.stat().st_size, dtype=arr.dtype.str, shape=list(arr.shape),
                              crc32=crc32_file(path))


@settings(max_examples=250, **SWEEP)
@given(st.data())
def test_partition_folders(seeds, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _copy(seeds, data.draw(st.sampled_from(["parts1", "parts3"])), tmp)
        meta_path = folder / "meta.json"
        meta = json.loads(meta_path.read_text())
        how = data.draw(st.sampled_from(["meta", "meta", "array", "array", "bytes", "bytes+record", "remove"]))
        if how == "meta":
            meta = mutate_json(data, meta)
        else:
            rel = data.draw(st.sampled_from(sorted(meta["files"])))
            path = folder / rel
            if how == "remove":
                path.unlink()
            elif how.startswith("bytes"):
                path.write_bytes(mutate(data, path.read_bytes(), compress=False))
                if how == "bytes+record":
                    _rerecord(folder, meta, rel)
            else:  # one element of the array set to a bad value, or the array cast to another dtype
                arr = np.load(path)
                if arr.size and data.draw(st.booleans()):
                    flat = arr.reshape(-1).copy()
                    value = data.draw(st.sampled_from([-2, -1, 1, 2**40, 10**18, np.nan, np.inf]))
                    flat[data.draw(st.integers(0, flat.size - 1))] = value if arr.dtype.kind == "f" else (
                        int(value) if np.isfinite(value) else -7)
                    arr = flat.reshape(arr.shape)
                else:
                    arr = arr.astype(data.draw(st.sampled_from([np.int32, np.float64, np.uint8, np.int64])))
                np.save(path, arr)
                _rerecord(folder, meta, rel)
        meta_path.write_text(json.dumps(meta))

        def load_every_part():
            verify_partition(folder)
            for k in range(int(meta.get("num_parts", 1)) if isinstance(meta.get("num_parts"), int) else 1):
                load_partition(folder, k)

        check_clean("partition folder (inspect, load)", load_every_part, str(folder))


@settings(max_examples=120, **SWEEP)
@given(st.data())
def test_click_folders(seeds, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _copy(seeds, "clicks", tmp)
        how = data.draw(st.sampled_from(["meta", "meta", "bytes", "remove"]))
        if how == "meta":
            meta = json.loads((folder / "metadata.json").read_text())
            (folder / "metadata.json").write_text(json.dumps(mutate_json(data, meta)))
        else:
            target = data.draw(st.sampled_from(_files(folder)))
            if how == "remove":
                target.unlink()
            else:
                target.write_bytes(mutate(data, target.read_bytes(), compress=False))
        split = data.draw(st.sampled_from(["train", "val"]))

        def stream():
            for _ in ClickLoader(folder, ClickLoaderConfig(batch_size=7, split=split)):
                pass

        check_clean("click folder (loader)", stream, str(folder))
        check_clean("click folder (plan-tables --tables DIR)", lambda: load_table_specs(folder), str(folder))
