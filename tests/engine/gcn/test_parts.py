"""PartsAggregator: several parts in one process (K = 1 hosting V parts), against the dense single-device operator
(forward and the gradient that goes back through the halo copies); its checks. Bitwise equality across K lives in
``test_exact_at_any_k.py`` (real gloo processes)."""

import pytest
import torch

from haloflow.engine.gcn.parallelize import HaloConfig, parallelize_gcn
from haloflow.engine.gcn.parts import PartsAggregator, PartsExchange
from haloflow.engine.logical import LogicalWorkers
from haloflow.errors import ConfigError
from haloflow.models.aggregate import LocalAggregator
from haloflow.models.gcn import GCN, GCNConfig
from tests.engine.scripts.common import parts_of, small_dataset


@pytest.mark.parametrize("norm", ["gcn", "mean"])
@pytest.mark.parametrize("v", [2, 4])
def test_one_process_hosting_every_part_aggregates_as_the_whole_graph(norm, v):
    dataset = small_dataset(num_nodes=80, num_edges=400)
    parts = parts_of(dataset, v, method="random")
    agg = PartsAggregator(parts, LogicalWorkers(v, 1, 0), None, norm=norm)
    full = torch.from_numpy(dataset.features).double().requires_grad_()  # (N, F) original ids
    hs = [full[torch.from_numpy(p.orig_ids)].float().detach().requires_grad_() for p in parts]
    ys = agg.aggregate_blocks(1, hs)
    dense = LocalAggregator(dataset.graph, norm).op.to_dense().double()  # (N, N)
    ref = dense @ full
    for p, y in zip(parts, ys):
        torch.testing.assert_close(y, ref[torch.from_numpy(p.orig_ids)].float())
    # backward: each part's rows get the gradient of every part that holds them as halo (copied back)
    c = torch.randn(dataset.features.shape[0], ref.shape[1], generator=torch.Generator().manual_seed(1))
    sum((y * c[torch.from_numpy(p.orig_ids)]).sum() for p, y in zip(parts, ys)).backward()
    g = dense.t() @ c.double()  # (N, F)
    for p, h in zip(parts, hs):
        torch.testing.assert_close(h.grad, g[torch.from_numpy(p.orig_ids)].float())


def test_the_exchange_routes_local_pieces_by_copy_and_nothing_else():
    parts = parts_of(small_dataset(), 4, method="random")
    one = PartsExchange(parts, LogicalWorkers(4, 1, 0))
    assert one.send_counts == [0] and one.recv_counts == [0]  # everything is a local copy
    assert sum(c.rows for c in one.local) == sum(p.n_halo for p in parts)


def test_a_model_on_blocks_learns_with_one_view_of_the_weights_per_block():
    """``forward_blocks`` with ``fanout`` views: each weight gets one gradient (the tree over the blocks), equal to
    the gradient of the same forward without views to float rounding."""
    from haloflow.engine.logical import fanout

    dataset = small_dataset()
    parts = parts_of(dataset, 2, method="random")
    agg = PartsAggregator(parts, LogicalWorkers(2, 1, 0), None)
    model = GCN(GCNConfig(in_dim=6, out_dim=3, hidden_dim=8, dropout=0.0))
    xs = [torch.from_numpy(dataset.features[p.orig_ids]) for p in parts]
    ids = [torch.from_numpy(p.orig_ids) for p in parts]
    grads = []
    for views in (fanout(list(model.parameters()), 2), None):
        model.zero_grad()
        sum(o.square().sum() for o in model.forward_blocks(xs, agg, ids, 0, params=views)).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_approximations_need_one_part_per_rank():
    parts = parts_of(small_dataset(), 2)
    model = GCN(GCNConfig(in_dim=6, out_dim=3))
    with pytest.raises(ConfigError, match=r"need one part per rank, but V = 2 logical workers on K = 1 ranks "
                                          r"\(2 each\): run --nproc 2"):
        parallelize_gcn(model, parts, None, halo=HaloConfig(halo_keep=0.5))
    with pytest.raises(ConfigError, match=r"one process hosts every part of the partition \(\[0, 1\]\), got \[1\]"):
        parallelize_gcn(model, parts[1:], None, workers=LogicalWorkers(2, 1, 0))


def test_blocks_of_the_wrong_shape_are_refused():
    parts = parts_of(small_dataset(), 2)
    agg = PartsAggregator(parts, LogicalWorkers(2, 1, 0), None)
    with pytest.raises(ConfigError, match="one \\(n_inner, F\\) block per hosted part"):
        agg.aggregate_blocks(0, [torch.zeros(3, 2)])


@pytest.mark.parametrize("schedule, order", [("overlap", ["launch:fwd", "inner:fwd", "wait:fwd"]),
                                             ("wait_first", ["launch:fwd", "wait:fwd", "inner:fwd"])])
def test_the_inner_spmms_run_while_the_exchange_is_in_flight(schedule, order):
    """The overlap: launch, every hosted part's inner SpMM, then wait (the control waits first); the same floats."""
    dataset = small_dataset()
    parts = parts_of(dataset, 2, method="random")
    outs = []
    for name in ("overlap", schedule):
        agg = PartsAggregator(parts, LogicalWorkers(2, 1, 0), None, config=HaloConfig(schedule=name))
        agg.trace = []
        outs.append(agg.aggregate_blocks(0, [torch.from_numpy(dataset.features[p.orig_ids]) for p in parts]))
    assert agg.trace == order
    assert all(torch.equal(a, b) for a, b in zip(*outs))
