import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from haloflow.data.generators import sbm_dataset
from haloflow.data.graph_folder import GraphFolder, read_graph_folder, write_graph_folder
from haloflow.data.readers import detect_format, read_dataset
from haloflow.errors import ConfigError, InputFormatError


def test_round_trip_through_a_folder(tmp_path):
    data = sbm_dataset(num_nodes=300, seed=4)
    folder = write_graph_folder(tmp_path / "sbm", data)
    assert detect_format(folder) == "arrays"
    back = read_dataset(folder)
    assert back.graph.equals(data.graph) and back.name == "sbm" and back.num_classes == data.num_classes
    for name in ("features", "labels", "train_mask", "val_mask", "test_mask"):
        got = getattr(back, name)
        assert got.dtype == getattr(data, name).dtype and np.array_equal(got, getattr(data, name))
    opened = GraphFolder(folder)
    assert opened.nodes.names == ("features", "labels", "train_mask", "val_mask", "test_mask")
    assert opened.nodes.num_classes(max_rows=7) == data.num_classes
    rows = np.concatenate([r for _, r in opened.nodes.iter_rows("features", 64)])
    assert np.array_equal(rows, data.features) and opened.nodes.row_bytes("features") == 4 * data.features.shape[1]


def test_node_count_comes_from_the_node_files(tmp_path):
    folder = tmp_path / "g"
    folder.mkdir()
    pq.write_table(pa.table({"src": [0, 1], "dst": [1, 2]}), folder / "edges.parquet")
    np.save(folder / "labels.npy", np.array([0, 1, 1, 0, 2]))
    assert read_graph_folder(folder).num_nodes == 5  # two isolated nodes that no edge names
    with pytest.raises(ConfigError, match=r"num_nodes = 4 \(--num-nodes\) but the node files .* have 5 rows"):
        read_graph_folder(folder, num_nodes=4)
    np.save(folder / "train_mask.npy", np.ones(4, dtype=bool))
    with pytest.raises(InputFormatError, match=r"node files disagree on the node count: labels 5, train_mask 4"):
        read_graph_folder(folder)
    np.save(folder / "train_mask.npy", np.ones(5, dtype=np.int8))
    with pytest.raises(InputFormatError, match=r"train_mask.npy: holds int8 of shape \(5,\): expected a bool mask"):
        read_graph_folder(folder)


def test_edges_outside_the_node_files_are_named(tmp_path):
    folder = tmp_path / "g"
    folder.mkdir()
    np.save(folder / "edges.npy", np.array([[0, 1], [1, 7]]))
    np.save(folder / "features.npy", np.zeros((3, 2), np.float64))
    with pytest.raises(InputFormatError, match=r"edges.npy: edge 1 is \(1, 7\): expected node ids in \[0, 3\)"):
        read_graph_folder(folder)
