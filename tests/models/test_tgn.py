from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from haloflow.data.temporal import TemporalEvents
from haloflow.data.temporal_sampler import NegativeSampler, TemporalCSR
from haloflow.errors import ConfigError
from haloflow.models.tgn import (
    TGN,
    TemporalAttention,
    TGNConfig,
    TimeEncoder,
    _gru_cell,
    make_tgn_batch,
    tgn_batch_loss,
    tgn_messages,
)
from haloflow.models.tgn_memory import MemoryRows, MemoryUpdate, TGNMemoryState
from haloflow.models.tgn_train import tgn_step

USERS, ITEMS, F_DIM = 12, 8, 3
CFG = TGNConfig(memory_dim=8, time_dim=6, embedding_dim=5, edge_feat_dim=F_DIM, num_neighbors=4, dropout=0.0)


def _stream(seed: int = 0, e: int = 300) -> TemporalEvents:
    """Users 0..11 interact with items 12..19 at times 0..199 (many ties), 3 edge features."""
    rng = np.random.default_rng(seed)
    return TemporalEvents(src=rng.integers(0, USERS, e), dst=USERS + rng.integers(0, ITEMS, e),
                          t=np.sort(rng.integers(0, 200, e)), num_nodes=USERS + ITEMS,
                          edge_feat=rng.normal(size=(e, F_DIM)))


def _warm(model: TGN, events: TemporalEvents, num_batches: int, batch: int = 20):
    """A state after ``num_batches`` batches without training, with the CSR and the negative sampler."""
    csr = TemporalCSR.from_events(events)
    neg = NegativeSampler.from_destinations(events, seed=0)
    state = TGNMemoryState(events.num_nodes, model.config.memory_dim, events.edge_dim)
    for b in range(num_batches):
        ids = np.arange(b * batch, (b + 1) * batch)
        tgn_step(model, state, events, ids, neg.sample(ids), csr)
    return state, csr, neg


# --------------------------------------------------------------------------------------------- parts
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(memory_dim=100, time_dim=101), r"memory_dim \+ time_dim = 100 \+ 101 = 201 must be divisible by heads"),
        (dict(memory_dim=0), "memory_dim must be >= 1, got 0"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
        (dict(num_neighbors=-1), "num_neighbors must be >= 0"),
    ],
)
def test_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        TGNConfig(**kw)


def test_paper_width_172_is_accepted():
    cfg = TGNConfig(memory_dim=172, time_dim=172, embedding_dim=172, edge_feat_dim=172)
    assert cfg.message_dim == 2 * 172 + 172 + 172 and cfg.query_dim % cfg.heads == 0


def test_time_encoder_starts_as_tgn():
    enc = TimeEncoder(5)
    np.testing.assert_allclose(enc.w.detach().numpy(), [1, 10**-2.25, 10**-4.5, 10**-6.75, 1e-9], rtol=1e-6)
    assert enc.b.abs().sum() == 0 and enc.w.requires_grad
    dt = torch.tensor([[0.0, 3.0]])
    torch.testing.assert_close(enc(dt), torch.cos(dt[..., None] * enc.w))  # (1, 2, 5)
    assert not TimeEncoder(5, learnable=False).w.requires_grad


def test_update_memory_runs_the_gru_on_pending_messages_only():
    model = TGN(CFG)
    gen = torch.Generator().manual_seed(0)
    rows = MemoryRows(memory=torch.randn(2, 8, generator=gen),
                      last_update=torch.tensor([1.0, 2.0], dtype=torch.float64),
                      mail_other=torch.randn(2, 8, generator=gen), mail_feat=torch.randn(2, 3, generator=gen),
                      mail_t=torch.tensor([4.0, 9.0], dtype=torch.float64), mail_eid=torch.tensor([5, -1]))
    memory, last = model.update_memory(rows)
    enc = model.time_enc
    msg = torch.cat([rows.memory[0], rows.mail_other[0], rows.mail_feat[0], torch.cos(3.0 * enc.w + enc.b)])
    torch.testing.assert_close(memory[0], model.memory_updater(msg[None], rows.memory[:1])[0])
    torch.testing.assert_close(memory[1], rows.memory[1])  # empty mailbox: memory as stored
    assert last.tolist() == [4.0, 2.0]


def test_attention_equals_torch_multihead_attention():
    q_n, k, dq, dk = 6, 4, 14, 17
    att = TemporalAttention(dq, dk, heads=2, dropout=0.0, seed=0).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        att.w_kv.bias.normal_(generator=gen)  # non-zero biases: the key bias must cancel, the value bias not
    query = torch.randn(q_n, dq, generator=gen)
    kv = torch.randn(q_n, k, dk, generator=gen)
    mask = torch.rand(q_n, k, generator=gen) < 0.7
    mask[0] = True
    mask[1] = False  # no neighbour at all
    out = att(query, kv, mask, torch.arange(q_n), epoch=0)

    mha = nn.MultiheadAttention(dq, 2, kdim=dk, vdim=dk, batch_first=True)
    with torch.no_grad():
        mha.q_proj_weight.copy_(att.w_q.weight)
        mha.k_proj_weight.copy_(att.w_kv.weight[:dq])
        mha.v_proj_weight.copy_(att.w_kv.weight[dq:])
        mha.in_proj_bias.copy_(torch.cat([att.w_q.bias, att.w_kv.bias]))
        mha.out_proj.weight.copy_(att.w_o.weight)
        mha.out_proj.bias.copy_(att.w_o.bias)
    ref, _ = mha(query[:, None], kv, kv, key_padding_mask=~mask)  # (Q, 1, Dq)
    has = mask.any(1)
    torch.testing.assert_close(out[has], ref[has, 0], rtol=1e-5, atol=1e-6)
    assert (out[1] == 0).all()
    # Padding slots are never read: garbage there changes nothing.
    kv2 = torch.where(mask[..., None], kv, torch.full_like(kv, 1e3))
    torch.testing.assert_close(att(query, kv2, mask, torch.arange(q_n), epoch=0), out)


def test_make_tgn_batch_numbers_nodes_and_samples_strictly_earlier():
    ev = _stream()
    csr = TemporalCSR.from_events(ev)
    ids = np.arange(100, 140)
    neg = NegativeSampler.from_destinations(ev).sample(ids)
    b = make_tgn_batch(ev, ids, neg, csr, num_neighbors=4, epoch=3)
    assert b.num_events == 40 and b.epoch == 3
    torch.testing.assert_close(b.node_ids[b.query_row],
                               torch.from_numpy(np.concatenate([ev.src[ids], ev.dst[ids], neg])))
    nb = csr.sample_recent(np.concatenate([ev.src[ids], ev.dst[ids], neg]), np.tile(ev.t[ids], 3), 4)
    np.testing.assert_array_equal(b.nbr_mask.numpy(), nb.mask)
    np.testing.assert_array_equal(b.node_ids[b.nbr_row].numpy()[nb.mask], nb.ids[nb.mask])
    assert (b.nbr_dt[b.nbr_mask] > 0).all()  # strictly before the event
    np.testing.assert_array_equal(b.nbr_feat.numpy()[nb.mask], ev.edge_feat[nb.eids[nb.mask]])
    assert (b.nbr_feat[~b.nbr_mask] == 0).all()
    assert torch.equal(b.node_ids, torch.unique(b.node_ids))  # ascending, distinct
    assert torch.equal(b.query_nodes, torch.unique(b.query_row)) and torch.equal(b.query_nodes[b.query_pos],
                                                                               b.query_row)


# --------------------------------------------------------------------------------------------- semantics
def test_memory_used_by_batch_b_ignores_batch_b_events():
    ev = _stream()
    model = TGN(CFG)
    state, csr, neg = _warm(model, ev, num_batches=5)
    ids = np.arange(100, 120)
    # The same stream with batch b's events rewired to other items and given other features.
    rng = np.random.default_rng(9)
    dst2, feat2 = ev.dst.copy(), ev.edge_feat.copy()
    dst2[ids] = USERS + (dst2[ids] - USERS + rng.integers(1, ITEMS, ids.size)) % ITEMS
    feat2[ids] = rng.normal(size=(ids.size, F_DIM))
    ev2 = TemporalEvents(src=ev.src, dst=dst2, t=ev.t, num_nodes=ev.num_nodes, edge_feat=feat2)
    outs, batches = [], []
    for events in (ev, ev2):
        batch = make_tgn_batch(events, ids, neg.sample(ids), TemporalCSR.from_events(events), num_neighbors=4)
        outs.append(model(state.gather(batch.node_ids), batch))
        batches.append(batch)
    common = np.intersect1d(batches[0].node_ids.numpy(), batches[1].node_ids.numpy())
    assert np.isin(ev.src[ids], common).all()
    assert (state.mail_eid[ev.src[ids]] >= 0).sum() >= 10  # the GRU path is exercised: pending messages
    pos = [torch.from_numpy(np.searchsorted(b.node_ids.numpy(), common)) for b in batches]
    torch.testing.assert_close(outs[0].memory[pos[0]], outs[1].memory[pos[1]], rtol=0, atol=1e-6)
    torch.testing.assert_close(outs[0].last_update[pos[0]], outs[1].last_update[pos[1]], rtol=0, atol=0)
    # ...while batch b's events do reach batch b + 1 through the messages stored after the loss.
    after = []
    for batch, out in zip(batches, outs):
        s = state.clone()
        upd = tgn_messages(batch, out)
        s.apply(upd.node_ids, upd.rows)
        after.append(s)
    assert not torch.equal(after[0].mail_other, after[1].mail_other)
    assert not torch.equal(after[0].mail_feat, after[1].mail_feat)


def test_the_gru_gets_gradients_from_messages_of_earlier_batches():
    ev = _stream()
    model = TGN(CFG)
    csr = TemporalCSR.from_events(ev)
    neg = NegativeSampler.from_destinations(ev)
    state = TGNMemoryState(ev.num_nodes, 8, F_DIM)
    grads = []
    for ids in (np.arange(0, 20), np.arange(20, 40)):
        model.zero_grad()
        batch = make_tgn_batch(ev, ids, neg.sample(ids), csr, num_neighbors=4)
        out = model(state.gather(batch.node_ids), batch)
        tgn_batch_loss(out.pos_logit, out.neg_logit, 20).backward()
        grads.append((model.memory_updater.weight_ih.grad.abs().sum().item(), model.time_enc.w.grad.abs().sum().item()))
        upd = tgn_messages(batch, out)
        state.apply(upd.node_ids, upd.rows)
    assert grads[0][0] == 0.0  # first batch: every mailbox is empty
    assert grads[1][0] > 0.0 and grads[1][1] > 0.0  # then the GRU and the time encoding learn


def test_messages_carry_both_endpoints_of_each_event():
    ev = _stream()
    model = TGN(CFG)
    state, csr, neg = _warm(model, ev, num_batches=2)
    ids = np.arange(40, 50)
    batch = make_tgn_batch(ev, ids, neg.sample(ids), csr, num_neighbors=4)
    out = model(state.gather(batch.node_ids), batch)
    upd = tgn_messages(batch, out)
    np.testing.assert_array_equal(upd.node_ids.numpy(), np.concatenate([ev.src[ids], ev.dst[ids]]))
    s_row, d_row = batch.query_row[:10], batch.query_row[10:20]
    torch.testing.assert_close(upd.rows.memory[:10], out.memory[s_row].detach())
    torch.testing.assert_close(upd.rows.mail_other[:10], out.memory[d_row].detach())  # src's message holds s_dst
    torch.testing.assert_close(upd.rows.mail_other[10:], out.memory[s_row].detach())
    np.testing.assert_array_equal(upd.rows.mail_eid.numpy(), np.tile(ids, 2))
    np.testing.assert_array_equal(upd.rows.mail_t.numpy(), np.tile(ev.t[ids], 2))
    np.testing.assert_allclose(upd.rows.mail_feat.numpy(), np.tile(ev.edge_feat[ids], (2, 1)))
    assert not upd.rows.memory.requires_grad


def test_a_batch_split_across_processes_computes_the_same():
    """The distributed contract: each part gathers its own rows, the loss pieces and gradients add up to the
    whole batch's, and the owners' state is the same whatever order the parts' updates arrive in."""
    ev = _stream()
    model = TGN(replace(CFG, dropout=0.3)).train()  # keyed dropout: the same masks in every split
    state, csr, neg = _warm(model, ev, num_batches=4)
    ids = np.arange(80, 120)

    def run(part):
        batch = make_tgn_batch(ev, part, neg.sample(part, stream=1), csr, num_neighbors=4, epoch=1)
        out = model(state.gather(batch.node_ids), batch)
        loss = tgn_batch_loss(out.pos_logit, out.neg_logit, num_events=ids.size)  # global count
        loss.backward()
        return loss.detach(), out, tgn_messages(batch, out)

    model.zero_grad()
    loss, out, upd = run(ids)
    whole_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    parts = [run(ids[:17]), run(ids[17:])]
    split_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    torch.testing.assert_close(torch.cat([p[1].pos_logit for p in parts]), out.pos_logit, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([p[1].neg_logit for p in parts]), out.neg_logit, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(parts[0][0] + parts[1][0], loss, rtol=1e-6, atol=1e-7)
    for g_split, g_whole in zip(split_grads, whole_grads, strict=True):
        torch.testing.assert_close(g_split, g_whole, rtol=1e-4, atol=1e-6)
    whole, split = state.clone(), state.clone()
    whole.apply(upd.node_ids, upd.rows)
    arrived = MemoryUpdate.cat([u for _, _, u in reversed(parts)])  # the later part's rows come first
    split.apply(arrived.node_ids, arrived.rows)
    for name in ("memory", "last_update", "mail_other", "mail_feat", "mail_t", "mail_eid"):
        torch.testing.assert_close(getattr(split, name), getattr(whole, name), rtol=1e-5, atol=1e-6)
    batch = make_tgn_batch(ev, ids, neg.sample(ids, stream=1), csr, num_neighbors=4, epoch=1)
    evaluated = model.eval()(state.gather(batch.node_ids), batch)
    assert not torch.allclose(evaluated.pos_logit, out.pos_logit)  # dropout was on in training


def test_batch_loss_is_tgn_mean_bce():
    gen = torch.Generator().manual_seed(0)
    pos, neg = torch.randn(7, generator=gen), torch.randn(7, generator=gen)
    expected = (F.binary_cross_entropy_with_logits(pos, torch.ones(7))
                + F.binary_cross_entropy_with_logits(neg, torch.zeros(7)))
    torch.testing.assert_close(tgn_batch_loss(pos, neg, 7), expected)
    with pytest.raises(ConfigError, match=r"pos_logit \(B,\) and neg_logit \(B,\), got \(7,\) and \(6,\)"):
        tgn_batch_loss(pos, neg[:6], 7)
    with pytest.raises(ConfigError, match="num_events must be >= 1"):
        tgn_batch_loss(pos, neg, 0)


def test_forward_checks_rows_against_the_batch():
    ev = _stream()
    model = TGN(CFG)
    state, csr, neg = _warm(model, ev, num_batches=1)
    ids = np.arange(20, 30)
    batch = make_tgn_batch(ev, ids, neg.sample(ids), csr, num_neighbors=4)
    with pytest.raises(ConfigError, match="state rows for .* batch nodes"):
        model(state.gather(batch.node_ids[:-1]), batch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # float32: the compiled backward; float64: torch ops
def test_gru_gates_give_torchs_cell_and_its_gradients(dtype):
    gen = torch.Generator().manual_seed(7)
    cell = nn.GRUCell(6 + 5 + 3, 6).to(dtype)  # message [h, other (5), phi (3)]
    stored, phi = torch.randn(9, 5, generator=gen, dtype=dtype), torch.randn(9, 3, generator=gen, dtype=dtype)
    phi.requires_grad_()
    h = torch.randn(9, 6, generator=gen, dtype=dtype).requires_grad_()
    g = torch.randn(9, 6, generator=gen, dtype=dtype)
    params = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh, phi, h)
    other = list(stored.split([3, 0, 2], dim=1))  # message parts after h (an empty one: no edge features)
    got = _gru_cell(cell, h, other, phi)  # rows without mail never reach the cell (TGN.update_memory)
    want = cell(torch.cat([h, stored, phi], 1), h)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(got, want, **tol)
    for a, e in zip(torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g)):
        torch.testing.assert_close(a, e, **tol)


def test_folded_attention_equals_the_attention_then_the_next_product():
    """``folded`` multiplies the weights first; the numbers (and the weights' gradients) are the unfolded ones."""
    q_n, k, m, f, t, d = 9, 4, 6, 3, 4, 5
    att = TemporalAttention(m + t, m + f + t, heads=2, dropout=0.3, seed=0).train()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(generator=gen)  # non-zero biases too
    s_q, t_q = torch.randn(q_n, m, generator=gen), torch.randn(t, generator=gen)
    memory, rows = torch.randn(6, m, generator=gen), torch.randint(0, 6, (q_n, k), generator=gen)
    feat, phi = torch.randn(q_n, k, f, generator=gen), torch.randn(q_n, k, t, generator=gen)
    mask = torch.rand(q_n, k, generator=gen) < 0.7
    mask[2] = False
    keys, w_after = torch.arange(q_n) * 3 + 1, torch.randn(d, m + t, generator=gen)
    s_q[5], s_q[7] = s_q[1], s_q[1]  # queries of one node share its row
    distinct, pos = torch.unique(s_q, dim=0, return_inverse=True)  # (U, M), (Q,)
    kv = torch.cat([memory[rows], feat, phi], dim=2)
    query = torch.cat([s_q, t_q.expand(q_n, -1)], dim=1)
    outs, grads = [], []
    for run in (lambda: att.folded(s_q, t_q, memory, rows, feat, phi, mask, keys, 2, w_after),
                lambda: att.folded(distinct, t_q, memory, rows, feat, phi, mask, keys, 2, w_after, query_pos=pos),
                lambda: att(query, kv, mask, keys, epoch=2) @ w_after.t()):
        out = run()
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), list(att.parameters())))
    assert distinct.shape[0] == q_n - 2
    for i in (1, 2):
        torch.testing.assert_close(outs[0], outs[i], rtol=1e-4, atol=1e-4)
        for a, b in zip(grads[0], grads[i]):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
    assert (outs[0][2] == 0).all()
