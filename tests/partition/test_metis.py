import numpy as np
import pytest

from haloflow.data.graph import CSRGraph
from haloflow.partition.metis import metis_partition, symmetric_adjacency


def two_cliques(size: int = 5) -> CSRGraph:
    """Two directed-both-ways cliques of ``size`` nodes joined by the single edge 0 -> size."""
    a = [(i, j) for i in range(size) for j in range(size) if i != j]
    e = np.array(a + [(i + size, j + size) for i, j in a] + [(0, size)])
    return CSRGraph.from_edges(e[:, 0], e[:, 1], 2 * size)


def test_symmetric_adjacency_docstring_example():
    g = CSRGraph.from_edges(np.array([0, 2, 1, 2]), np.array([1, 1, 2, 2]), 3)
    xadj, adjncy = symmetric_adjacency(g.indptr, g.indices, 3)
    assert xadj.tolist() == [0, 1, 3, 4] and adjncy.tolist() == [1, 0, 2, 1]


def test_symmetric_adjacency_matches_sorting_oracle(rng):
    src, dst = rng.integers(0, 300, 3000), rng.integers(0, 300, 3000)  # repeats and self-loops included
    g = CSRGraph.from_edges(src, dst, 300)
    xadj, adjncy = symmetric_adjacency(g.indptr, g.indices, 300)
    ref = CSRGraph.from_edges(src, dst, 300, symmetrize=True, drop_self_loops=True)
    assert np.array_equal(xadj, ref.indptr) and np.array_equal(adjncy, ref.indices)


def test_symmetric_input_is_passed_through_without_copy(rng):
    src, dst = rng.integers(0, 100, 500), rng.integers(0, 100, 500)
    g = CSRGraph.from_edges(src, dst, 100, symmetrize=True, drop_self_loops=True)
    xadj, adjncy = symmetric_adjacency(g.indptr, g.indices, 100)
    assert xadj is g.indptr and adjncy is g.indices


def test_symmetric_adjacency_sorts_unsorted_rows():
    indptr = np.array([0, 2, 2, 2]); indices = np.array([2, 1])  # row 0 = [2, 1], unsorted
    xadj, adjncy = symmetric_adjacency(indptr, indices, 3)
    assert xadj.tolist() == [0, 2, 3, 4] and adjncy.tolist() == [1, 2, 0, 0]


def test_two_cliques_cut_one_edge():
    g = two_cliques()
    xadj, adjncy = symmetric_adjacency(g.indptr, g.indices, g.num_nodes)
    parts = metis_partition(xadj, adjncy, 2, seed=0)
    assert parts.dtype == np.int64
    src, dst = g.edges()
    assert int((parts[src] != parts[dst]).sum()) == 1
    assert len(set(parts[:5].tolist())) == 1 and len(set(parts[5:].tolist())) == 1


def test_one_part_is_all_zeros_and_seed_is_deterministic(rng):
    g = CSRGraph.from_edges(rng.integers(0, 400, 4000), rng.integers(0, 400, 4000), 400)
    xadj, adjncy = symmetric_adjacency(g.indptr, g.indices, 400)
    assert np.array_equal(metis_partition(xadj, adjncy, 1), np.zeros(400, dtype=np.int64))
    a = metis_partition(xadj, adjncy, 4, seed=7)
    b = metis_partition(xadj, adjncy, 4, seed=7)
    assert np.array_equal(a, b) and set(a.tolist()) == {0, 1, 2, 3}


def test_edgeless_graph_is_split_evenly():
    xadj, adjncy = symmetric_adjacency(np.zeros(8, dtype=np.int64), np.zeros(0, dtype=np.int64), 7)
    parts = metis_partition(xadj, adjncy, 3)
    assert np.bincount(parts).tolist() == [3, 2, 2]


def test_seed_0_reproduces_a_plain_pymetis_call(rng):
    import pymetis

    g = CSRGraph.from_edges(rng.integers(0, 2000, 16000), rng.integers(0, 2000, 16000), 2000,
                            symmetrize=True, drop_self_loops=True)
    ref = pymetis.part_graph(4, pymetis.CSRAdjacency(g.indptr, g.indices))
    assert np.array_equal(metis_partition(g.indptr, g.indices, 4, seed=0), np.asarray(ref.vertex_part))


def test_known_symmetric_graph_goes_to_metis_unchanged_and_gives_the_checked_result():
    from haloflow.data.graph import CSRGraph
    from haloflow.partition.api import PartitionConfig, partition_graph

    rng = np.random.default_rng(5)
    src, dst = rng.integers(0, 300, 2000), rng.integers(0, 300, 2000)
    g = CSRGraph.from_edges(src, dst, 300, symmetrize=True, drop_self_loops=True)
    assert g.simple_symmetric and not CSRGraph.from_edges(src, dst, 300, symmetrize=True).simple_symmetric
    unknown = CSRGraph(indptr=g.indptr, indices=g.indices, num_nodes=300)  # same arrays, checked instead
    cfg = PartitionConfig(num_parts=4, method="metis")
    np.testing.assert_array_equal(partition_graph(g, cfg).parts, partition_graph(unknown, cfg).parts)
