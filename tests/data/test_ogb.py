import gzip

import numpy as np
import pytest

from haloflow.data.ogb import ogb_split_schemes, read_ogb
from haloflow.data.readers import read_dataset
from haloflow.errors import ConfigError, InputFormatError

EDGES = [(0, 1), (1, 2), (3, 2), (4, 0)]
FEATURES = [[0.5, 1, -2], [0, 0.25, 3], [1.5, -1, 0], [2, 2, 2], [-0.75, 0, 1]]
LABELS = ["3", "0", "", "1", "2"]  # node 2 unlabelled (an empty field, as pandas writes NaN)
YEARS = [2001, 2005, 2010, 2010, 1999]
SPLIT = {"train": [0, 1], "valid": [3], "test": [4, 2]}


def write_gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(",".join(str(v) for v in (row if isinstance(row, (list, tuple)) else [row])) + "\n" for row in lines)
    path.write_bytes(gzip.compress(text.encode()))


def make_folder(root, **override):
    """A 5-node OGB node-property folder; ``override`` replaces a file's lines (None: leave the file out)."""
    files = {
        "raw/edge.csv.gz": EDGES,
        "raw/node-feat.csv.gz": FEATURES,
        "raw/node-label.csv.gz": LABELS,
        "raw/node_year.csv.gz": YEARS,
        "raw/num-node-list.csv.gz": [5],
        "raw/num-edge-list.csv.gz": [4],
        **{f"split/time/{k}.csv.gz": v for k, v in SPLIT.items()},
    }
    files.update(override)
    for rel, lines in files.items():
        if lines is not None:
            write_gz(root / rel, lines)
    return root


def test_read_ogb_hand_checked(tmp_path):
    ds = read_ogb(make_folder(tmp_path / "ogbn_tiny"))
    # in-neighbours: 0 <- 4, 1 <- 0, 2 <- {1, 3}
    np.testing.assert_array_equal(ds.graph.indptr, [0, 1, 2, 4, 4, 4])
    np.testing.assert_array_equal(ds.graph.indices, [4, 0, 1, 3])
    assert ds.features.dtype == np.float32
    np.testing.assert_array_equal(ds.features, np.array(FEATURES, dtype=np.float32))
    np.testing.assert_array_equal(ds.labels, [3, 0, -1, 1, 2])
    assert ds.num_classes == 4
    np.testing.assert_array_equal(ds.extra["node_year"], YEARS)
    np.testing.assert_array_equal(np.flatnonzero(ds.train_mask), [0, 1])
    np.testing.assert_array_equal(np.flatnonzero(ds.val_mask), [3])
    np.testing.assert_array_equal(np.flatnonzero(ds.test_mask), [2, 4])
    assert ds.name == "ogbn_tiny"


def test_read_ogb_symmetrize_and_dispatcher(tmp_path):
    folder = make_folder(tmp_path / "d")
    sym = read_ogb(folder, symmetrize=True)
    assert sym.graph.equals(sym.graph.transpose()) and sym.graph.num_edges == 8
    assert read_dataset(folder).graph.equals(read_ogb(folder).graph)
    assert read_dataset(folder, format="ogb", symmetrize=True).graph.num_edges == 8


def test_read_ogb_optional_files(tmp_path):
    folder = make_folder(
        tmp_path / "d", **{"raw/node-feat.csv.gz": None, "raw/node-label.csv.gz": None, "raw/node_year.csv.gz": None}
    )
    for k in SPLIT:
        (folder / "split" / "time" / f"{k}.csv.gz").unlink()
    (folder / "split" / "time").rmdir()
    ds = read_ogb(folder)
    assert ds.features is None and ds.labels is None and ds.train_mask is None and ds.extra == {}


def test_read_ogb_split_choice(tmp_path):
    folder = make_folder(tmp_path / "d", **{"split/a/train.csv.gz": [4], "split/a/valid.csv.gz": [3],
                                            "split/a/test.csv.gz": [0]})
    assert ogb_split_schemes(folder) == ["a", "time"]
    with pytest.raises(ConfigError, match=r"several schemes \['a', 'time'\]: pass split= to choose one"):
        read_ogb(folder)
    with pytest.raises(ConfigError, match=r"split 'nope' not found .* expected one of \['a', 'time'\]"):
        read_ogb(folder, split="nope")
    np.testing.assert_array_equal(np.flatnonzero(read_ogb(folder, split="a").train_mask), [4])


@pytest.mark.parametrize(
    "override, file, line, match",
    [
        ({"raw/num-edge-list.csv.gz": [5]}, "edge.csv.gz", None, "4 edges, but num-edge-list.csv.gz says 5"),
        ({"raw/edge.csv.gz": [(0, 1), (1, 2), (3, 5), (4, 0)]}, "edge.csv.gz", 3,
         r"node id 5 is out of range: expected node ids in \[0, 5\)"),
        ({"raw/edge.csv.gz": [(0, 1), ("1", "x"), (3, 2), (4, 0)]}, "edge.csv.gz", 2, "non-integer token 'x'"),
        ({"raw/edge.csv.gz": [(0, 1, 7), (1, 2), (3, 2), (4, 0)]}, "edge.csv.gz", 1,
         r"expected 2 fields \(src,dst\) .* found 3"),
        ({"raw/node-feat.csv.gz": FEATURES[:4]}, "node-feat.csv.gz", None,
         "4 rows, but num-node-list.csv.gz says 5 nodes"),
        ({"raw/node-feat.csv.gz": FEATURES[:2] + [["1", "abc", "0"]] + FEATURES[3:]}, "node-feat.csv.gz", 3,
         "non-numeric field 'abc': expected a number"),
        ({"raw/node-feat.csv.gz": [FEATURES[0], [1, 2]] + FEATURES[2:]}, "node-feat.csv.gz", 2,
         r"expected 3 comma-separated numbers \(as on line 1\), found 2"),
        ({"raw/node-label.csv.gz": ["1", "2", "1.5", "0", "0"]}, "node-label.csv.gz", 3,
         "label 1.5 is not a class id: expected an integer >= 0"),
        ({"raw/node-label.csv.gz": [(1, 0)] * 5}, "node-label.csv.gz", None, "expected one label column, found 2"),
        ({"raw/num-node-list.csv.gz": [5, 3]}, "num-node-list.csv.gz", None, "expected one line .* found 2"),
        ({"raw/num-node-list.csv.gz": [9_999_999_999]}, "num-node-list.csv.gz", None,
         r"9,999,999,999 nodes for 4 edges .* expected at most 2E \+ 1,024 = 1,032"),
        ({"split/time/test.csv.gz": [4, 9]}, "test.csv.gz", 2, "node id 9 is out of range"),
        ({"raw/node_year.csv.gz": YEARS[:3]}, "node_year.csv.gz", None, "3 rows, but num-node-list.csv.gz says 5"),
    ],
)
def test_read_ogb_errors_name_the_file(tmp_path, override, file, line, match):
    folder = make_folder(tmp_path / "d", **override)
    with pytest.raises(InputFormatError, match=match) as info:
        read_ogb(folder)
    assert info.value.path.endswith(file)
    assert info.value.line == line


def test_read_ogb_truncated_features(tmp_path):
    folder = make_folder(tmp_path / "d", **{"raw/node-feat.csv.gz": [[i / 7, i, -i] for i in range(5)]})
    feat = folder / "raw" / "node-feat.csv.gz"
    feat.write_bytes(feat.read_bytes()[:-12])  # the gzip trailer and some data cut off
    with pytest.raises(InputFormatError, match="node-feat.csv.gz: truncated or corrupt compressed data"):
        read_ogb(folder)


def test_read_ogb_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not an OGB folder"):
        read_ogb(tmp_path)
    folder = make_folder(tmp_path / "d", **{"raw/num-node-list.csv.gz": None})
    with pytest.raises(FileNotFoundError, match="num-node-list.csv.gz is missing"):
        read_ogb(folder)
