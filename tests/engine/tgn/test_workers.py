"""A TGN batch on V logical workers: the slices, and weight gradients that are the V-tree of the workers' own."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.data.temporal_sampler import NegativeSampler, TemporalCSR
from haloflow.engine.logical import LogicalWorkers, tree_sum
from haloflow.engine.tgn.workers import forward_workers, worker_slices
from haloflow.models.tgn import TGN, make_tgn_batch, tgn_batch_loss, tgn_messages
from haloflow.models.tgn_memory import TGNMemoryState

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from tgn_parity import config, stream  # noqa: E402


def test_a_rank_gets_its_workers_slices_in_worker_order():
    ids, neg = np.arange(100, 110), np.arange(200, 210)  # B = 10, V = 4: slices of 3, 3, 2, 2
    got = worker_slices(LogicalWorkers(4, 2, 1), ids, neg)  # rank 1 of 2 holds workers 2 and 3
    assert [a.tolist() for a, _ in got] == [[106, 107], [108, 109]]
    assert [b.tolist() for _, b in got] == [[206, 207], [208, 209]]
    assert [a.tolist() for a, _ in worker_slices(LogicalWorkers(4, 1, 0), ids[:3], neg[:3])] == [[100], [101], [102],
                                                                                                 []]


@pytest.fixture(scope="module")
def setting():
    ev = stream(num_events=600)
    cfg = config()
    model = TGN(cfg.model_config(ev.edge_dim))
    csr = TemporalCSR.from_events(ev)
    state = TGNMemoryState(ev.num_nodes, cfg.memory_dim, ev.edge_dim)
    sampler = NegativeSampler.from_destinations(ev, seed=0)
    with torch.no_grad():  # 200 earlier events' messages in the memory, so that the batch's rows have mail
        for lo in range(0, 200, 50):
            old = np.arange(lo, lo + 50)
            b = make_tgn_batch(ev, old, sampler.sample(old), csr, num_neighbors=cfg.num_neighbors)
            upd = tgn_messages(b, model(state.gather(b.node_ids), b))
            state.apply(upd.node_ids, upd.rows)
    ids = np.arange(200, 267)  # a batch of 67 events: uneven slices
    neg = sampler.sample(ids)
    return ev, cfg, model, csr, state, ids, neg


def _worker_inputs(setting, lw):
    ev, cfg, model, csr, state, ids, neg = setting
    out = []
    for a, b in worker_slices(lw, ids, neg):
        batch = make_tgn_batch(ev, a, b, csr, num_neighbors=cfg.num_neighbors) if a.size else None
        out.append(None if batch is None else (state.gather(batch.node_ids), batch))
    return out


def _loss(outs, b):
    return tree_sum([torch.zeros(()) if o is None else tgn_batch_loss(o.pos_logit, o.neg_logit, b) for o in outs])


@pytest.mark.parametrize("v", [2, 4])
def test_a_weight_gradient_is_the_tree_of_the_workers_own(setting, v):
    """The oracle: each worker's forward and backward alone, their gradients summed by the pairwise tree."""
    model, ids = setting[2], setting[5]
    inputs = _worker_inputs(setting, LogicalWorkers(v, 1, 0))
    model.zero_grad(set_to_none=True)
    _loss(forward_workers(model, inputs), ids.size).backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    alone = []
    for x in inputs:
        model.zero_grad(set_to_none=True)
        tgn_batch_loss(*(lambda o: (o.pos_logit, o.neg_logit))(model(*x)), ids.size).backward()
        alone.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in got:
        assert torch.equal(got[name], tree_sum([g[name] for g in alone])), name


def test_an_empty_worker_counts_as_zeros(setting):
    """B < V leaves a worker without events: its gradient is zeros in the tree, as a rank holding only it sends."""
    model = setting[2]
    ev, cfg, _, csr, state, ids, neg = setting
    short = (ev, cfg, model, csr, state, ids[:3], neg[:3])  # V = 4: slices 1, 1, 1, 0
    inputs = _worker_inputs(short, LogicalWorkers(4, 1, 0))
    assert inputs[3] is None
    model.zero_grad(set_to_none=True)
    outs = forward_workers(model, inputs)
    assert outs[3] is None
    _loss(outs, 3).backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    _loss(forward_workers(model, inputs[:3]), 3).backward()  # three workers: the tree ((g0 + g1) + g2)
    three = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name in got:  # ((g0 + g1) + (g2 + 0)) == ((g0 + g1) + g2) up to the sign of a zero
        assert torch.equal(got[name], three[name]), name


def test_slices_change_the_bits_so_the_control_can_fail(setting):
    """One product over the whole batch (V = 1) rounds otherwise than four slices: what V fixes."""
    model, ids = setting[2], setting[5]
    grads = []
    for v in (1, 4):
        model.zero_grad(set_to_none=True)
        _loss(forward_workers(model, _worker_inputs(setting, LogicalWorkers(v, 1, 0))), ids.size).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert any(not torch.equal(grads[0][n], grads[1][n]) for n in grads[0])
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-6)  # the same math
