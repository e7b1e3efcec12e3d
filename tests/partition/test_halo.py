import numpy as np
import pytest

from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError
from haloflow.partition.halo import HaloBuilder, HaloIndex, build_part, build_parts
from tests.partition.part_oracle import check_parts, relabelling_from_parts, small_dataset


def test_hand_built_two_parts():
    # The module docstring's example: identity relabelling, part 0 owns 0 1 2, part 1 owns 3 4.
    src = np.array([0, 3, 4, 1, 2, 3])
    dst = np.array([1, 1, 2, 3, 4, 4])
    graph = CSRGraph.from_edges(src, dst, 5)
    rel = relabelling_from_parts(np.array([0, 0, 0, 1, 1]), 2)
    p0, p1 = build_parts(graph, rel)
    assert (p0.n_inner, p0.n_halo, p1.n_inner, p1.n_halo) == (3, 2, 2, 2)
    assert p0.indptr.tolist() == [0, 0, 2, 3] and p0.indices.tolist() == [0, 3, 4]
    assert p0.halo_gids.tolist() == [3, 4] and p0.halo_offsets.tolist() == [0, 0, 2]
    assert p0.send_ids.tolist() == [1, 2] and p0.send_offsets.tolist() == [0, 0, 2]
    assert p1.indptr.tolist() == [0, 1, 3] and p1.indices.tolist() == [2, 0, 3]
    assert p1.halo_gids.tolist() == [1, 2] and p1.halo_offsets.tolist() == [0, 2, 2]
    assert p1.send_ids.tolist() == [0, 1] and p1.send_offsets.tolist() == [0, 2, 2]
    # Global degrees, local order [inner | halo].
    assert p0.in_degree.tolist() == [0, 2, 1, 1, 2] and p0.out_degree.tolist() == [1, 1, 1, 2, 1]
    assert p1.in_degree.tolist() == [1, 2, 2, 1] and p1.out_degree.tolist() == [2, 1, 1, 1]


@pytest.mark.parametrize("num_parts", [1, 2, 3, 8])
def test_random_assignment_matches_brute_force(num_parts):
    ds = small_dataset(seed=num_parts)
    rng = np.random.default_rng(num_parts)
    assign = rng.integers(0, num_parts, ds.num_nodes)
    if num_parts == 8:
        assign[assign == 5] = 4  # an empty part must still get a (zero-size) GraphPart
    rel = relabelling_from_parts(assign, num_parts)
    parts = list(build_parts(ds.graph, rel, ds))
    check_parts(ds.graph, parts, rel.new_to_orig, ds)
    if num_parts == 8:
        assert parts[5].n_inner == 0 and parts[5].indices.size == 0


def test_index_same_whatever_the_chunks_or_the_key_collection():
    ds = small_dataset(seed=3)
    assign = np.random.default_rng(3).integers(0, 4, ds.num_nodes)
    rel = relabelling_from_parts(assign, 4)
    src, dst = ds.graph.edges()
    whole = HaloIndex.build(ds.graph, rel)
    chunked = HaloIndex.build(ds.graph, rel, chunk_edges=7)
    sorted_keys = HaloIndex.build(ds.graph, rel, chunk_edges=50, dense_limit=0)  # no byte map: sort and merge
    assert whole.cut_edges == chunked.cut_edges == sorted_keys.cut_edges
    assert whole.cut_edges == int(np.count_nonzero(assign[src] != assign[dst]))
    assert np.array_equal(whole.keys, chunked.keys) and np.array_equal(whole.keys, sorted_keys.keys)
    # Brute force: part p's halo = sources of cut edges into p, as new ids.
    for p in range(4):
        into_p = (assign[dst] == p) & (assign[src] != p)
        assert whole.halo(p).tolist() == sorted(set(rel.orig_to_new[src[into_p]].tolist()))
    assert whole.in_edges.tolist() == np.bincount(assign[dst], minlength=4).tolist()


def test_build_part_equals_builder_and_keeps_node_data():
    ds = small_dataset(seed=4)
    rel = relabelling_from_parts(np.random.default_rng(4).integers(0, 3, ds.num_nodes), 3)
    one = build_part(ds.graph, rel, 2, ds)
    other = HaloBuilder(ds.graph, rel).build(2, ds)
    for name in ("indptr", "indices", "halo_gids", "send_ids", "in_degree", "features", "labels", "train_mask"):
        assert np.array_equal(getattr(one, name), getattr(other, name)), name
    assert one.num_classes == 4 and one.features.dtype == np.float32


def test_errors_name_the_argument():
    ds = small_dataset(seed=5, num_nodes=20, num_edges=40)
    rel = relabelling_from_parts(np.zeros(20, np.int64), 2)
    with pytest.raises(ConfigError, match=r"k=2 is out of range: expected 0 <= k < 2"):
        build_part(ds.graph, rel, 2)
    small = relabelling_from_parts(np.zeros(10, np.int64), 2)
    with pytest.raises(ConfigError, match=r"relabelling covers 10 nodes .* the graph has 20 nodes"):
        build_part(ds.graph, small, 0)
