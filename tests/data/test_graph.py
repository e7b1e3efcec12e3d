import numpy as np
import pytest

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.errors import ConfigError

# A hand-drawn graph on 5 nodes (node 4 isolated) with a duplicate edge 0->1 and a self-loop 2->2:
#
#     0 --> 1 <-- 2 <-> 1      edges (src -> dst): 0->1, 2->1, 1->2, 0->2, 3->2, 0->1 (again), 2->2
#      \         ^ ^
#       `------->' 3
SRC = np.array([0, 2, 1, 0, 3, 0, 2])
DST = np.array([1, 1, 2, 2, 2, 1, 2])
N = 5


def csr(indptr, indices):
    return np.array(indptr, dtype=np.int64), np.array(indices, dtype=np.int64)


# Expected (indptr, indices) worked out by hand for each option; row v lists v's in-neighbours, sorted.
CASES = {
    "as_given": ({}, csr([0, 0, 3, 7, 7, 7], [0, 0, 2, 0, 1, 2, 3])),
    "dedup": ({"dedup": True}, csr([0, 0, 2, 6, 6, 6], [0, 2, 0, 1, 2, 3])),
    "drop_self_loops": ({"drop_self_loops": True}, csr([0, 0, 3, 6, 6, 6], [0, 0, 2, 0, 1, 3])),
    "symmetrize": ({"symmetrize": True}, csr([0, 2, 4, 8, 9, 9], [1, 2, 0, 2, 0, 1, 2, 3, 2])),
    "symmetrize_no_loops": (
        {"symmetrize": True, "drop_self_loops": True},
        csr([0, 2, 4, 7, 8, 8], [1, 2, 0, 2, 0, 1, 3, 2]),
    ),
    "add_self_loops": ({"add_self_loops": True}, csr([0, 1, 4, 8, 9, 10], [0, 0, 1, 2, 0, 1, 2, 3, 3, 4])),
    "symmetrize_add_self_loops": (
        {"symmetrize": True, "add_self_loops": True},
        csr([0, 3, 6, 10, 12, 13], [0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 2, 3, 4]),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_from_edges_options_give_hand_checked_csr(case):
    kwargs, (indptr, indices) = CASES[case]
    g = CSRGraph.from_edges(SRC, DST, N, **kwargs)
    assert g.num_nodes == N
    assert g.indptr.dtype == np.int64 and g.indices.dtype == np.int64
    np.testing.assert_array_equal(g.indptr, indptr)
    np.testing.assert_array_equal(g.indices, indices)
    assert g.num_edges == indices.shape[0]


def test_from_edges_default_num_nodes_is_max_id_plus_one_and_accepts_int32():
    g = CSRGraph.from_edges(SRC.astype(np.int32), DST.astype(np.int32))
    assert g.num_nodes == 4
    np.testing.assert_array_equal(g.indptr, [0, 0, 3, 7, 7])


def test_from_edges_without_edges():
    g = CSRGraph.from_edges(np.zeros(0, np.int64), np.zeros(0, np.int64), 3)
    np.testing.assert_array_equal(g.indptr, [0, 0, 0, 0])
    assert g.num_edges == 0
    assert CSRGraph.from_edges([], []).num_nodes == 0
    loops = CSRGraph.from_edges([], [], 2, add_self_loops=True)
    np.testing.assert_array_equal(loops.indices, [0, 1])


def test_edges_degrees_and_transpose_by_hand():
    g = CSRGraph.from_edges(SRC, DST, N)
    src, dst = g.edges()
    np.testing.assert_array_equal(src, [0, 0, 2, 0, 1, 2, 3])  # by destination, then source
    np.testing.assert_array_equal(dst, [1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(g.in_degree(), [0, 3, 4, 0, 0])
    np.testing.assert_array_equal(g.out_degree(), [3, 1, 2, 1, 0])
    t = g.transpose()  # row v = out-neighbours of v
    np.testing.assert_array_equal(t.indptr, [0, 3, 4, 6, 7, 7])
    np.testing.assert_array_equal(t.indices, [1, 1, 2, 2, 1, 2, 2])
    np.testing.assert_array_equal(t.in_degree(), g.out_degree())
    assert t.transpose().equals(g)


def test_scipy_round_trip_and_dense_oracle():
    g = CSRGraph.from_edges(SRC, DST, N)
    dense = np.zeros((N, N))
    np.add.at(dense, (DST, SRC), 1.0)  # A[dst, src], duplicates counted
    np.testing.assert_array_equal(g.to_scipy().toarray(), dense)
    assert CSRGraph.from_scipy(g.to_scipy()).equals(g)
    # from_scipy sorts the columns of an unsorted matrix
    import scipy.sparse as sp

    unsorted = sp.csr_matrix((np.ones(3), np.array([2, 0, 1]), np.array([0, 3, 3, 3])), shape=(3, 3))
    np.testing.assert_array_equal(CSRGraph.from_scipy(unsorted).indices, [0, 1, 2])


def test_equals_compares_structure():
    g = CSRGraph.from_edges(SRC, DST, N)
    assert g.equals(CSRGraph.from_edges(SRC[::-1], DST[::-1], N))  # edge order does not matter
    assert not g.equals(CSRGraph.from_edges(SRC, DST, N + 1))
    assert not g.equals(CSRGraph.from_edges(SRC, DST, N, dedup=True))
    assert "num_nodes=5" in repr(g) and "num_edges=7" in repr(g)


@pytest.mark.parametrize(
    "src, dst, n, match",
    [
        ([0, 1], [1], 3, "same length, got 2 and 1"),
        ([0, 3], [1, 1], 3, r"node id 3 is out of range: expected ids in \[0, 3\)"),
        ([0, -1], [1, 1], 3, "node id -1 is out of range"),
        ([0], [1], -1, "num_nodes must be >= 0, got -1"),
    ],
)
def test_from_edges_rejects_bad_input(src, dst, n, match):
    with pytest.raises(ConfigError, match=match):
        CSRGraph.from_edges(np.array(src), np.array(dst), n)


def test_csr_constructor_validates_shapes():
    with pytest.raises(ConfigError, match=r"indptr must have num_nodes \+ 1 = 4 entries"):
        CSRGraph(indptr=np.zeros(3, np.int64), indices=np.zeros(0, np.int64), num_nodes=3)
    with pytest.raises(ConfigError, match=r"indptr\[-1\] = 2 but indices has 1 entries"):
        CSRGraph(indptr=np.array([0, 1, 2]), indices=np.zeros(1, np.int64), num_nodes=2)


def test_graph_dataset_validates_rows_and_counts_classes():
    g = CSRGraph.from_edges(SRC, DST, N)
    labels = np.array([2, -1, 0, 1, 2])
    ds = GraphDataset(g, features=np.zeros((N, 3), np.float32), labels=labels, name="tiny")
    assert ds.num_classes == 3 and ds.num_nodes == N
    assert "tiny" in repr(ds) and "features=3" in repr(ds)
    assert GraphDataset(g, labels=labels, num_classes=7).num_classes == 7  # an explicit count is kept
    with pytest.raises(ConfigError, match="features has 4 rows but the graph has 5 nodes"):
        GraphDataset(g, features=np.zeros((4, 3), np.float32))
    with pytest.raises(ConfigError, match="test_mask has 6 rows"):
        GraphDataset(g, test_mask=np.zeros(6, bool))


def test_describe_edges_counts_undirected_edges_of_a_symmetric_graph():
    directed = CSRGraph.from_edges(SRC, DST, N)
    assert directed.describe_edges() == "7 directed edges"  # not known to be symmetric
    sym = CSRGraph.from_edges(SRC, DST, N, symmetrize=True)  # 0-1, 0-2, 1-2, 2-3 both ways, and the loop 2-2 once
    assert sym.symmetric and sym.num_self_loops() == 1
    assert sym.describe_edges() == "5 undirected edges (9 directed entries)"
    simple = CSRGraph.from_edges(SRC, DST, N, symmetrize=True, drop_self_loops=True)
    assert simple.describe_edges() == "4 undirected edges (8 directed entries)"
