import numpy as np
import pytest

from haloflow.data.generators import RMATConfig, SBMConfig, csr_from_chunks, rmat_chunks, rmat_graph, sbm_dataset
from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError


def test_sbm_is_deterministic_and_homophilous():
    a = sbm_dataset(num_nodes=2000, num_classes=4, seed=3)
    b = sbm_dataset(num_nodes=2000, num_classes=4, seed=3)
    c = sbm_dataset(num_nodes=2000, num_classes=4, seed=4)
    assert a.graph.equals(b.graph) and np.array_equal(a.features, b.features)
    assert not a.graph.equals(c.graph)
    src, dst = a.graph.edges()
    assert np.all(src != dst)
    # undirected: the reverse of every edge is present
    assert CSRGraph.from_edges(dst, src, a.num_nodes).equals(a.graph)
    same = np.mean(a.labels[src] == a.labels[dst])
    assert 0.75 < same < 0.9  # homophily 0.8 plus 1/K of the cross edges
    masks = a.train_mask.astype(int) + a.val_mask + a.test_mask
    assert np.all(masks == 1) and a.train_mask.sum() == 200
    assert a.features.dtype == np.float32 and a.features.shape == (2000, 32)


def test_sbm_features_carry_class_signal():
    d = sbm_dataset(num_nodes=3000, num_classes=3, feature_noise=0.5, seed=0)
    cent = np.stack([d.features[d.labels == k].mean(0) for k in range(3)])
    pred = np.argmin(((d.features[:, None, :] - cent[None]) ** 2).sum(-1), axis=1)
    assert np.mean(pred == d.labels) > 0.9


def test_sbm_config_errors():
    with pytest.raises(ConfigError, match="homophily"):
        SBMConfig(homophily=1.5)
    with pytest.raises(ConfigError, match="num_nodes >= num_classes"):
        SBMConfig(num_nodes=3, num_classes=5)


def test_rmat_edges_independent_of_chunk_size_and_seeded():
    whole = [np.concatenate(x) for x in zip(*rmat_chunks(RMATConfig(scale=10, seed=1, chunk_size=1 << 20)))]
    parts = [np.concatenate(x) for x in zip(*rmat_chunks(RMATConfig(scale=10, seed=1, chunk_size=777)))]
    other = [np.concatenate(x) for x in zip(*rmat_chunks(RMATConfig(scale=10, seed=2)))]
    assert whole[0].size == 16 * 1024
    assert np.array_equal(whole[0], parts[0]) and np.array_equal(whole[1], parts[1])
    assert not np.array_equal(whole[0], other[0])
    assert whole[0].min() >= 0 and whole[0].max() < 1024


def test_rmat_quadrant_probabilities():
    # Without id scrambling, the top bit of (src, dst) picks the quadrant of the first level: a, b, c, d.
    s, d = next(rmat_chunks(RMATConfig(scale=12, permute=False, seed=0, chunk_size=1 << 20)))
    top_s, top_d = s >> 11, d >> 11
    freq = [np.mean((top_s == i) & (top_d == j)) for i, j in [(0, 0), (0, 1), (1, 0), (1, 1)]]
    np.testing.assert_allclose(freq, [0.57, 0.19, 0.19, 0.05], atol=0.01)


def test_rmat_is_skewed():
    g = rmat_graph(RMATConfig(scale=12, seed=0))
    deg = g.in_degree()
    assert deg.max() > 20 * deg.mean()


def test_csr_from_chunks_matches_from_edges():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 50, 400), rng.integers(0, 50, 400)
    chunks = lambda: iter([(src[:150], dst[:150]), (src[150:], dst[150:])])  # noqa: E731
    for kw in [{}, {"dedup": True}, {"symmetrize": True, "drop_self_loops": True}, {"drop_self_loops": True}]:
        got = csr_from_chunks(chunks, 50, **kw)
        want = CSRGraph.from_edges(src, dst, 50, **kw)
        assert got.equals(want), kw
