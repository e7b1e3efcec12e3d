import math

import numpy as np
import pytest
import torch

from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError
from haloflow.models.aggregate import Aggregator, LocalAggregator, add_diagonal, normalized_values, self_loop_values
from haloflow.models.spmm import KERNELS

# Edges 0->1, 1->0, 1->2, 2->1, 3->2: in-degrees [1, 2, 2, 0].
SRC = np.array([0, 1, 1, 2, 3])
DST = np.array([1, 0, 2, 1, 2])


def s(x: float) -> float:
    return 1 / math.sqrt(x)


# Hand-computed D^-1/2 (A + I) D^-1/2 with D = in-degree + 1 = [2, 3, 3, 1].
GCN_4 = [
    [1 / 2, s(2 * 3), 0, 0],
    [s(3 * 2), 1 / 3, 1 / 3, 0],
    [0, 1 / 3, 1 / 3, s(3 * 1)],
    [0, 0, 0, 1],
]
# Hand-computed mean over in-neighbours (node 3 has none: its row is 0).
MEAN_4 = [
    [0, 1, 0, 0],
    [1 / 2, 0, 1 / 2, 0],
    [0, 1 / 2, 0, 1 / 2],
    [0, 0, 0, 0],
]


def _graph4():
    return CSRGraph.from_edges(SRC, DST, 4)


def _random_graph(rng, n=40, m=150):
    return CSRGraph.from_edges(rng.integers(0, n, m), rng.integers(0, n, m), n, drop_self_loops=True, dedup=True)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("norm", "matrix"), [("gcn", GCN_4), ("mean", MEAN_4)])
def test_four_node_graph_matches_hand_computed(norm, matrix, kernel):
    agg = LocalAggregator(_graph4(), norm, kernel=kernel)
    assert isinstance(agg, Aggregator)
    dense = torch.tensor(matrix, dtype=torch.float64)
    torch.testing.assert_close(agg.op.to_dense(), dense, rtol=1e-6, atol=1e-7)
    h = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    torch.testing.assert_close(agg.aggregate(0, h), (dense @ h.double()).float())


def test_gcn_norm_matches_pyg_on_random_graph(rng):
    gcn_norm = pytest.importorskip("torch_geometric.nn.conv.gcn_conv").gcn_norm
    g = _random_graph(rng)
    src, dst = g.edges()
    edge_index, weight = gcn_norm(torch.from_numpy(np.stack([src, dst])), num_nodes=g.num_nodes)
    ref = torch.zeros(g.num_nodes, g.num_nodes, dtype=torch.float64)
    ref.index_put_((edge_index[1], edge_index[0]), weight.double(), accumulate=True)  # row = destination
    torch.testing.assert_close(LocalAggregator(g, "gcn").op.to_dense(), ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("norm", ["gcn", "mean"])
def test_random_graph_forward_and_gradient_match_dense(norm, rng):
    g = _random_graph(rng)
    a = torch.from_numpy(g.to_scipy().toarray()).double()  # (N, N), row v = in-neighbours
    deg = a.sum(1)
    if norm == "gcn":
        d = (deg + 1).rsqrt()
        ref = d[:, None] * (a + torch.eye(g.num_nodes, dtype=torch.float64)) * d[None, :]
    else:
        ref = a / deg.clamp(min=1)[:, None]
    agg = LocalAggregator(g, norm)
    h = torch.from_numpy(rng.standard_normal((g.num_nodes, 5))).requires_grad_()
    torch.testing.assert_close(agg.aggregate(0, h), ref @ h.detach(), rtol=1e-6, atol=1e-6)
    assert torch.autograd.gradcheck(lambda t: agg.aggregate(1, t), (h,))


@pytest.mark.parametrize("norm", ["gcn", "mean"])
def test_values_of_a_row_block_equal_the_full_graphs(norm, rng):
    # The engine computes values for its own rows (a block of the full CSR) from global degrees:
    # every entry must come out bit-identical to the single-device operator's.
    g = _random_graph(rng)
    deg = g.in_degree()
    full = normalized_values(g.indptr, g.indices, deg, deg, norm)
    lo, hi = 11, 29
    block_indptr = g.indptr[lo : hi + 1] - g.indptr[lo]
    block_indices = g.indices[g.indptr[lo] : g.indptr[hi]]
    block = normalized_values(block_indptr, block_indices, deg[lo:hi], deg, norm)
    assert block.dtype == np.float32
    assert np.array_equal(block, full[g.indptr[lo] : g.indptr[hi]])
    loops = self_loop_values(deg[lo:hi], norm)
    if norm == "gcn":
        assert np.array_equal(loops, (1.0 / (deg[lo:hi] + 1.0)).astype(np.float32))
    else:
        assert loops is None


def test_errors_name_the_problem():
    g = _graph4()
    with pytest.raises(ConfigError, match=r"norm must be one of \('gcn', 'mean'\), got 'sum'"):
        LocalAggregator(g, "sum")
    with pytest.raises(ConfigError, match=r"row_gdeg_in has shape \(3,\), expected \(4,\)"):
        normalized_values(g.indptr, g.indices, np.ones(3), np.ones(4), "gcn")
    with pytest.raises(ConfigError, match="global in-degree 0"):
        normalized_values(g.indptr, g.indices, np.zeros(4), np.zeros(4), "mean")


def _add_diagonal_by_sort(indptr, indices, values, diag):
    """The definition: every (row, column, value) and the diagonal's, stably sorted by row, then column."""
    n = indptr.shape[0] - 1
    rows = np.concatenate([np.repeat(np.arange(n), np.diff(indptr)), np.arange(n)])
    cols = np.concatenate([indices, np.arange(n)])
    vals = np.concatenate([values, diag])
    order = np.lexsort((cols, rows))
    return np.asarray(indptr) + np.arange(n + 1), cols[order], vals[order]


@pytest.mark.parametrize("sorted_rows", [True, False])
def test_add_diagonal_puts_the_diagonal_in_column_order_beside_an_existing_one(sorted_rows):
    """Rows sorted by column (every CSRGraph) take the linear merge, others the sort: both give the definition's
    arrays, on square blocks and on [inner | halo] blocks, with repeated entries and (v, v) entries of their own."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(0, 9))
        n_cols = n + int(rng.integers(0, 5))
        counts = rng.integers(0, 6, n)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        rows = [rng.integers(0, max(n_cols, 1), c) for c in counts]
        rows = [np.sort(r) if sorted_rows else r for r in rows]
        indices = np.concatenate(rows).astype(np.int64) if n else np.zeros(0, np.int64)
        for v in range(n):  # some rows hold their own (v, v)
            if counts[v] and rng.random() < 0.4:
                indices[indptr[v]] = v
                if sorted_rows:
                    indices[indptr[v]:indptr[v + 1]].sort()
        values = rng.random(indices.shape[0]).astype(np.float32)
        diag = rng.random(n).astype(np.float32)
        for got, want in zip(add_diagonal(indptr, indices, values, diag),
                             _add_diagonal_by_sort(indptr, indices, values, diag)):
            np.testing.assert_array_equal(got, want)
