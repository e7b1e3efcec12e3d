"""The logical workers' fixed-order sums: a rank's share of the V-tree is a whole subtree."""

import pytest
import torch
from torch import nn

from haloflow.engine.logical import LogicalWorkers, fanout, sliced, sliced_mlp, tree_sum
from haloflow.errors import ConfigError


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))


def _grads(model, xs):
    model.zero_grad(set_to_none=True)
    outs = sliced(model, [(x,) for x in xs])
    torch.cat(outs).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_tree_sum_is_the_pairwise_tree():
    a, b, c, d, e = (torch.tensor([x], dtype=torch.float32) for x in (1e8, 1.0, -1e8, 1.0, 0.5))
    assert torch.equal(tree_sum([a, b, c, d]), (a + b) + (c + d))
    assert torch.equal(tree_sum([a, b, c, d, e]), ((a + b) + (c + d)) + e)
    assert not torch.equal((((a + b) + c) + d), (a + b) + (c + d))  # the order matters for these floats


@pytest.mark.parametrize("k", [1, 2, 4])
def test_each_rank_sums_a_subtree_and_the_ranks_complete_the_v_tree(k):
    """V = 4 slices on one process against K ranks (each summing its own workers, the ranks then tree-summed):
    the same bits; the control, one product over all rows (V = 1), differs."""
    V, model = 4, _mlp()
    x = torch.randn(4 * 33, 13)
    xs = list(x.split(33))
    whole = _grads(model, xs)
    w = [LogicalWorkers(V, k, r) for r in range(k)]
    per_rank = [_grads(model, [xs[i] for i in lw.mine]) for lw in w]
    for j, g in enumerate(whole):
        assert torch.equal(tree_sum([pr[j] for pr in per_rank]), g)
    one = _grads(model, [x])
    assert any(not torch.equal(a, b) for a, b in zip(one, whole))


def test_fanout_of_one_worker_is_the_parameter_itself():
    p = nn.Parameter(torch.ones(3))
    assert fanout([p], 1)[0][0] is p


def test_cut_depends_on_v_only_and_ranks_hold_contiguous_workers():
    assert LogicalWorkers(4, 2, 1).cut(10) == LogicalWorkers(4, 1, 0).cut(10) == [3, 3, 2, 2]
    assert LogicalWorkers(4, 2, 1).rank_sizes(10) == [6, 4]
    assert list(LogicalWorkers(8, 2, 1).mine) == [4, 5, 6, 7]
    assert LogicalWorkers(8, 4, 3).my_slices(16) == [2, 2]


@pytest.mark.parametrize("v,k", [(4, 3), (6, 2), (4, 8), (0, 1)])
def test_a_k_that_does_not_divide_v_by_a_power_of_two_is_refused(v, k):
    with pytest.raises(ConfigError, match="logical-workers"):
        LogicalWorkers(v, k, 0)


@pytest.mark.parametrize("size", [32, 7])
def test_sliced_mlp_gives_each_worker_its_bits_whatever_k_hosts_it(size):
    """The MLP path of DLRM: K = 1, 2, 4 ranks hosting 4 workers get the same outputs and, after the ranks' tree,
    the same weight gradients; slices of 32 rows run as one GEMM (rows agree), of 7 rows one GEMM per slice."""
    model = _mlp()
    x = torch.randn(4 * size, 13)

    def run(rows, slices):
        model.zero_grad(set_to_none=True)
        y = sliced_mlp(model, rows, slices)
        y.pow(2).sum().backward()
        return y.detach(), [p.grad.clone() for p in model.parameters()]

    y1, g1 = run(x, [size] * 4)
    for k in (2, 4):
        per = 4 // k
        outs = [run(x[r * per * size:(r + 1) * per * size], [size] * per) for r in range(k)]
        assert torch.equal(torch.cat([o[0] for o in outs]), y1)
        for j, g in enumerate(g1):
            assert torch.equal(tree_sum([o[1][j] for o in outs]), g), f"K = {k}, parameter {j}"
