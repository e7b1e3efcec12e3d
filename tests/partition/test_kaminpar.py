import numpy as np
import pytest

from haloflow.data.meshes import delaunay_graph
from haloflow.partition.kaminpar import kaminpar_partition, parhip_bytes, write_parhip


def test_the_parhip_file_has_the_documented_layout(tmp_path):
    xadj = np.array([0, 1, 3, 4])  # the path 0 - 1 - 2
    adjncy = np.array([1, 0, 2, 1])
    path = tmp_path / "g.parhip"
    write_parhip(path, xadj, adjncy, np.array([5, 6, 7]))
    words = np.fromfile(path, dtype="<u8")
    assert path.stat().st_size == parhip_bytes(3, 4, True)
    header, offsets, neighbours, weights = words[:3], words[3:7], words[7:11], words[11:]
    assert header.tolist() == [1, 3, 4]  # edge weights absent (bit 0), vertex weights present (bit 1 clear)
    assert offsets.tolist() == [24 + 32 + 8 * x for x in (0, 1, 3, 4)]
    assert neighbours.tolist() == [1, 0, 2, 1] and weights.tolist() == [5, 6, 7]


def test_kaminpar_reads_the_graph_it_was_handed_and_repeats_with_the_seed_on_one_thread():
    kaminpar = pytest.importorskip("kaminpar")
    g = delaunay_graph(3000, seed=2)
    parts = kaminpar_partition(g.indptr, g.indices, 4, imbalance=1.03, seed=5, threads=1)
    assert np.array_equal(parts, kaminpar_partition(g.indptr, g.indices, 4, imbalance=1.03, seed=5, threads=1))
    sizes = np.bincount(parts, minlength=4)
    assert sizes.max() <= 1.03 * 3000 / 4 + 1
    # a random split of a mesh cuts ~3/4 of its edges; a partitioner that read the wrong graph would not be far
    # below that
    rows = np.repeat(np.arange(3000), np.diff(g.indptr))
    assert (parts[rows] != parts[g.indices]).mean() < 0.1
    del kaminpar


def test_kaminpar_loads_the_file_as_the_graph_and_weights_it_was_given(tmp_path):
    kaminpar = pytest.importorskip("kaminpar")
    g = delaunay_graph(500, seed=4)
    weights = np.arange(500) % 7 + 1
    write_parhip(tmp_path / "g.parhip", g.indptr, g.indices, weights)
    loaded = kaminpar.load_graph(str(tmp_path / "g.parhip"), kaminpar.GraphFileFormat.PARHIP)
    assert loaded.n() == 500 and loaded.m() == g.indices.shape[0] and loaded.is_node_weighted()
    for v in (0, 123, 499):
        assert sorted(u for u, _ in loaded.neighbors(v)) == sorted(g.indices[g.indptr[v]:g.indptr[v + 1]].tolist())
        assert loaded.node_weight(v) == weights[v]


def test_one_of_kaminpars_own_contexts_may_be_named_and_a_wrong_name_is_refused():
    pytest.importorskip("kaminpar")
    from haloflow.errors import ConfigError

    g = delaunay_graph(1000, seed=1)
    parts = kaminpar_partition(g.indptr, g.indices, 4, imbalance=1.03, threads=1, context="default")
    assert np.bincount(parts, minlength=4).max() <= 1.03 * 1000 / 4 + 1
    with pytest.raises(ConfigError, match=r"KaMinPar context must be one of .*default.*; got 'best'"):
        kaminpar_partition(g.indptr, g.indices, 4, context="best")
