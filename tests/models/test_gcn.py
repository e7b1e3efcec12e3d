import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError
from haloflow.models.aggregate import LocalAggregator
from haloflow.models.gcn import GCN, GCNConfig, gcn_loss

# Edges 0->1, 1->0, 1->2, 2->1, 3->2; D = in-degree + 1 = [2, 3, 3, 1].
GRAPH4 = CSRGraph.from_edges(np.array([0, 1, 1, 2, 3]), np.array([1, 0, 2, 1, 2]), 4)
r = math.sqrt
A_HAT4 = torch.tensor(
    [
        [1 / 2, 1 / r(6), 0, 0],
        [1 / r(6), 1 / 3, 1 / 3, 0],
        [0, 1 / 3, 1 / 3, 1 / r(3)],
        [0, 0, 0, 1],
    ],
    dtype=torch.float64,
)
MEAN4 = torch.tensor([[0, 1, 0, 0], [0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5], [0, 0, 0, 0]], dtype=torch.float64)


def _with_random_biases(model: GCN, seed: int) -> GCN:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in model.biases:
            b.copy_(torch.randn(b.shape, generator=gen))
    return model


def _dense_forward(model: GCN, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Eval-mode reference in float64: H <- relu(A H W + b) (GCN) or relu(H Ws + A H Wn + b) (SAGE)."""
    h = x.double()
    n = model.config.num_layers
    for layer in range(n):
        w, b = model.weights[layer].double(), model.biases[layer].double()
        out = a @ h @ w + b
        if model.self_weights is not None:
            out = out + h @ model.self_weights[layer].double()
        h = torch.relu(out) if layer < n - 1 else out
    return h


def test_two_layer_gcn_on_four_nodes_equals_dense_hand_computation():
    model = _with_random_biases(GCN(GCNConfig(in_dim=3, out_dim=2, hidden_dim=5)), seed=1).eval()
    x = torch.tensor([[1.0, 0.0, 2.0], [0.5, -1.0, 0.0], [0.0, 3.0, 1.0], [-2.0, 1.0, 1.0]])
    logits = model(x, LocalAggregator(GRAPH4, "gcn"), torch.arange(4), epoch=0)
    w0, b0, w1, b1 = (t.double() for t in (model.weights[0], model.biases[0], model.weights[1], model.biases[1]))
    expected = A_HAT4 @ torch.relu(A_HAT4 @ x.double() @ w0 + b0) @ w1 + b1
    torch.testing.assert_close(logits.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("conv", ["gcn", "sage"])
@pytest.mark.parametrize(("hidden", "out"), [(6, 2), (3, 7)])  # later layers transform first / aggregate first
def test_three_layers_match_dense_reference(conv, hidden, out, rng):
    cfg = GCNConfig(in_dim=5, out_dim=out, hidden_dim=hidden, num_layers=3, conv=conv, seed=2)
    assert cfg.transform_first(1) is False and cfg.transform_first(2) == (out < hidden)
    model = _with_random_biases(GCN(cfg), seed=3).eval()
    x = torch.from_numpy(rng.standard_normal((4, 5)).astype(np.float32))
    logits = model(x, LocalAggregator(GRAPH4, cfg.norm), torch.arange(4), epoch=0)
    a = A_HAT4 if conv == "gcn" else MEAN4
    torch.testing.assert_close(logits.double(), _dense_forward(model, a, x), rtol=1e-5, atol=1e-5)


class _CountingAggregator:
    def __init__(self, inner: LocalAggregator):
        self.inner, self.norm, self.calls = inner, inner.norm, []

    def aggregate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        self.calls.append(layer)
        return self.inner.aggregate(layer, h)


@pytest.mark.parametrize("conv", ["gcn", "sage"])
def test_precompute_first_gives_the_same_model_without_dropout(conv, rng):
    """Precompute moves layer 0's dropout from X to A X; without dropout both forms are the same model."""
    n = 60
    g = CSRGraph.from_edges(rng.integers(0, n, 300), rng.integers(0, n, 300), n, symmetrize=True,
                            drop_self_loops=True)
    x = torch.from_numpy(rng.standard_normal((n, 12)).astype(np.float32))
    ids = torch.arange(n) * 3 + 11  # any global ids
    runs = {}
    for pre in (True, False):
        cfg = GCNConfig(in_dim=12, out_dim=4, hidden_dim=8, conv=conv, precompute_first=pre, seed=5, dropout=0.0)
        model = GCN(cfg).train()
        agg = _CountingAggregator(LocalAggregator(g, cfg.norm))
        outs = [model(x, agg, ids, epoch=e) for e in range(3)]
        sum(o.sum() for o in outs).backward()
        runs[pre] = (outs, [p.grad.clone() for p in model.parameters()], agg.calls)
    (out_t, grad_t, calls_t), (out_f, grad_f, calls_f) = runs[True], runs[False]
    for a, b in zip(out_t, out_f):
        torch.testing.assert_close(a, b)  # the same math; float32 sums in another order
    for a, b in zip(grad_t, grad_f):
        torch.testing.assert_close(a, b)
    assert calls_t == [0, 1, 1, 1]  # layer 0 aggregated once
    assert calls_f == [0, 1] * 3


def test_without_precompute_layer_0_drops_the_input_as_kipf_does(rng):
    """Kipf's layer 0 (PyG's GCNConv): A_hat @ drop(X) @ W0 + b0, against a dense reference with the same mask."""
    from haloflow.kernels.keyed_dropout import keyed_dropout

    n = 40
    g = CSRGraph.from_edges(rng.integers(0, n, 200), rng.integers(0, n, 200), n, symmetrize=True,
                            drop_self_loops=True)
    x = torch.from_numpy(rng.random((n, 6)).astype(np.float32))
    ids = torch.arange(n)
    cfg = GCNConfig(in_dim=6, out_dim=3, hidden_dim=5, num_layers=1, precompute_first=False, dropout=0.5, seed=2)
    model = GCN(cfg).train()
    agg = LocalAggregator(g, "gcn")
    dense = agg.op.to_dense().float()
    dropped = keyed_dropout(x, ids, p=0.5, seed=2, epoch=3, layer=0, training=True)
    assert not torch.equal(dropped, x)
    want = dense @ dropped @ model.weights[0] + model.biases[0]
    torch.testing.assert_close(model(x, agg, ids, epoch=3), want)
    pre = GCN(GCNConfig(in_dim=6, out_dim=3, hidden_dim=5, num_layers=1, precompute_first=True, dropout=0.5,
                        seed=2)).train()
    assert not torch.allclose(pre(x, agg, ids, epoch=3), want)  # the precomputed form drops A X instead


def test_gcn_loss_over_split_rows_sums_to_the_global_mean(rng):
    logits = torch.from_numpy(rng.standard_normal((30, 4)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, 4, 30))
    mask = torch.from_numpy(rng.random(30) < 0.4)
    total = int(mask.sum())
    ref = F.cross_entropy(logits[mask], labels[mask])
    torch.testing.assert_close(gcn_loss(logits, labels, mask, total), ref)
    halves = [slice(0, 13), slice(13, 30)]  # two "ranks", each with its own rows
    parts = sum(gcn_loss(logits[s], labels[s], mask[s], total) for s in halves)
    torch.testing.assert_close(parts, ref)


def test_param_groups_decay_only_the_first_layer():
    model = GCN(GCNConfig(in_dim=3, out_dim=2, conv="sage"))
    first, rest = model.param_groups(5e-4)
    assert first["weight_decay"] == 5e-4 and rest["weight_decay"] == 0.0
    assert {id(p) for p in first["params"]} == {id(model.weights[0]), id(model.self_weights[0])}
    assert len(first["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_errors_name_the_problem():
    with pytest.raises(ConfigError, match="GCNConfig.conv must be one of"):
        GCNConfig(in_dim=3, out_dim=2, conv="gat")
    with pytest.raises(ConfigError, match=r"GCNConfig.dropout must be in \[0, 1\), got 1.5"):
        GCNConfig(in_dim=3, out_dim=2, dropout=1.5)
    with pytest.raises(ConfigError, match="GCNConfig.num_layers must be >= 1, got 0"):
        GCNConfig(in_dim=3, out_dim=2, num_layers=0)
    model = GCN(GCNConfig(in_dim=3, out_dim=2, conv="sage"))
    with pytest.raises(ConfigError, match="conv='sage' needs an aggregator with norm='mean', got norm='gcn'"):
        model(torch.ones(4, 3), LocalAggregator(GRAPH4, "gcn"), torch.arange(4), epoch=0)
    with pytest.raises(ConfigError, match=r"GCN expects x \(n, 3\)"):
        model(torch.ones(4, 5), LocalAggregator(GRAPH4, "mean"), torch.arange(4), epoch=0)
    with pytest.raises(ConfigError, match="num_global_train must be >= 1"):
        gcn_loss(torch.ones(2, 2), torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.bool), 0)


def test_cora_kipf_defaults_reach_80_percent_test_accuracy(shared_data):
    from haloflow.data import read_planetoid

    ds = read_planetoid(shared_data / "planetoid", "cora")
    x = torch.from_numpy(ds.features)
    x = x / x.sum(1, keepdim=True).clamp(min=1)  # row-normalised bag of words, as in Kipf & Welling
    labels = torch.from_numpy(ds.labels)
    train, test = torch.from_numpy(ds.train_mask), torch.from_numpy(ds.test_mask)
    cfg = GCNConfig(in_dim=x.shape[1], out_dim=ds.num_classes, seed=0)  # hidden 16, dropout 0.5
    model, agg, ids = GCN(cfg), LocalAggregator(ds.graph, cfg.norm), torch.arange(ds.num_nodes)
    opt = torch.optim.Adam(model.param_groups(weight_decay=5e-4), lr=0.01)
    for epoch in range(200):
        model.train()
        opt.zero_grad()
        gcn_loss(model(x, agg, ids, epoch), labels, train, int(train.sum())).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(x, agg, ids, epoch=0).argmax(1)
    accuracy = (pred[test] == labels[test]).float().mean().item()
    assert accuracy >= 0.80, f"Cora test accuracy {accuracy:.3f} < 0.80 (Kipf & Welling report 0.815)"
