import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from haloflow.data.binary_edges import NpyEdges, ParquetEdges, read_npy_edges, read_parquet_edges, write_npy_edges
from haloflow.data.graph import CSRGraph
from haloflow.data.readers import detect_format, read_dataset
from haloflow.errors import InputFormatError

EDGES = np.array([[0, 1], [2, 1], [1, 2], [0, 2], [3, 2], [0, 1], [2, 2]])  # a repeat and a self-loop


def _expected(num_nodes=None):
    return CSRGraph.from_edges(EDGES[:, 0], EDGES[:, 1], num_nodes)


@pytest.mark.parametrize("layout", ["rows", "columns", "fortran"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16])
def test_npy_layouts_read_as_the_same_directed_graph(tmp_path, layout, dtype):
    arr = {"rows": EDGES, "columns": EDGES.T.copy(), "fortran": np.asfortranarray(EDGES)}[layout].astype(dtype)
    np.save(tmp_path / "e.npy", arr)
    graph = read_npy_edges(tmp_path / "e.npy")
    assert graph.equals(_expected()) and graph.num_edges == 7  # repeats and self-loops kept, as a SNAP list
    for step in (1, 2, 3, 100):
        chunks = list(NpyEdges(tmp_path / "e.npy").chunks(step))
        assert all(s.dtype == np.int64 and s.shape[0] <= step for s, _ in chunks)
        got = np.stack([np.concatenate([s for s, _ in chunks]), np.concatenate([d for _, d in chunks])], 1)
        np.testing.assert_array_equal(got, EDGES)


def test_npy_errors_name_the_file_and_the_edge(tmp_path):
    bad = EDGES.copy()
    bad[4, 1] = -3
    np.save(tmp_path / "neg.npy", bad)
    with pytest.raises(InputFormatError, match=r"neg.npy: edge 4 is \(3, -3\): expected node ids >= 0"):
        read_npy_edges(tmp_path / "neg.npy")
    np.save(tmp_path / "float.npy", EDGES.astype(np.float32))
    with pytest.raises(InputFormatError, match=r"float.npy: holds float32 values: expected integer node ids"):
        read_npy_edges(tmp_path / "float.npy")
    np.save(tmp_path / "shape.npy", np.zeros((4, 3), np.int64))
    with pytest.raises(InputFormatError, match=r"has shape \(4, 3\): expected \(E, 2\) or \(2, E\)"):
        read_npy_edges(tmp_path / "shape.npy")
    with pytest.raises(InputFormatError, match=r"edge 1 is \(2, 1\): expected node ids in \[0, 2\)"):
        read_npy_edges(_saved(tmp_path), num_nodes=2)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "e.npy").read_bytes()[:-8])
    with pytest.raises(InputFormatError, match=r"cut.npy: is truncated"):
        read_npy_edges(tmp_path / "cut.npy")
    np.save(tmp_path / "far.npy", np.array([[0, 5000]]))
    with pytest.raises(InputFormatError, match=r"a node id is 5,000, but without num_nodes ids must be < 2 x 1 edges"):
        read_npy_edges(tmp_path / "far.npy")
    assert read_npy_edges(tmp_path / "far.npy", num_nodes=5001).num_nodes == 5001


def _saved(tmp_path):
    np.save(tmp_path / "e.npy", EDGES)
    return tmp_path / "e.npy"


def test_parquet_file_and_folder_read_row_group_by_row_group(tmp_path):
    table = pa.table({"w": np.arange(7.0), "dst": EDGES[:, 1].astype(np.int32), "src": EDGES[:, 0]})
    pq.write_table(table, tmp_path / "e.parquet", row_group_size=3)
    assert read_parquet_edges(tmp_path / "e.parquet").equals(_expected())
    folder = tmp_path / "parts"
    folder.mkdir()
    pq.write_table(table.slice(0, 4), folder / "part-0.parquet", row_group_size=2)
    pq.write_table(table.slice(4), folder / "part-1.parquet")
    source = ParquetEdges(folder)
    assert source.num_edges == 7 and source.chunk_edges(1) == 3  # the largest row group is read whole
    assert [s.tolist() for s, _ in source.chunks(2)] == [[0, 2], [1, 0], [3, 0], [2]]
    assert detect_format(folder) == "parquet" and read_dataset(folder).graph.equals(_expected())


def test_parquet_errors(tmp_path):
    pq.write_table(pa.table({"source": [0], "dst": [1]}), tmp_path / "a.parquet")
    with pytest.raises(InputFormatError, match=r"a.parquet: has no src column: expected columns src and dst "
                                               r"\(found source, dst\)"):
        read_parquet_edges(tmp_path / "a.parquet")
    pq.write_table(pa.table({"src": pa.array([0, None]), "dst": [1, 2]}), tmp_path / "b.parquet")
    with pytest.raises(InputFormatError, match=r"column src has 1 missing values"):
        read_parquet_edges(tmp_path / "b.parquet")
    (tmp_path / "c.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputFormatError, match=r"c.parquet: not a readable Parquet file"):
        read_parquet_edges(tmp_path / "c.parquet")


def test_write_npy_edges_round_trip(tmp_path):
    chunks = [(EDGES[:3, 0], EDGES[:3, 1]), (EDGES[3:, 0], EDGES[3:, 1])]
    path = write_npy_edges(tmp_path / "w.npy", chunks, 7)
    assert np.load(path).dtype == np.int32 and detect_format(path) == "npy"
    assert read_dataset(path).graph.equals(_expected())
