import torch

from haloflow.models.tgn import TemporalAttention
from haloflow.models.tgn_attention import attend


def _inputs(q_n=7, heads=2, k=4, n=5, m=6, f=3, t=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qk = torch.randn(q_n, heads, m + f + t, generator=gen, requires_grad=True)
    memory = torch.randn(n, m, generator=gen, requires_grad=True)
    phi = torch.randn(q_n, k, t, generator=gen, requires_grad=True)
    feat = torch.randn(q_n, k, f, generator=gen)
    rows = torch.randint(0, n, (q_n, k), generator=gen)
    mask = torch.rand(q_n, k, generator=gen) < 0.7
    mask[0], mask[1] = True, False  # all slots real; no neighbour at all
    mult = (torch.rand(q_n, heads, k, generator=gen) > 0.3).float() / 0.7  # a dropout's keep / (1 - p)
    return qk, memory, rows, feat, phi, mask, mult


def _dense(qk, memory, rows, feat, phi, mask, mult):
    """The formulas of tgn_attention.py, one query at a time."""
    pd, xbar = [], []
    for q in range(qk.shape[0]):
        kv = torch.cat([memory[rows[q]], feat[q], phi[q]], dim=1)  # (k, Dk)
        if mask[q].any():
            s = (qk[q] @ kv.t()).masked_fill(~mask[q], float("-inf"))  # (H, k)
            p = torch.softmax(s, dim=1) * mult[q]
        else:
            p = torch.zeros(qk.shape[1], kv.shape[0])
        pd.append(p)
        xbar.append(p @ kv)
    return torch.stack(pd), torch.stack(xbar)


def test_fused_attention_and_its_gradients_equal_the_dense_formulas():
    inputs = _inputs()
    qk, memory, _, _, phi, mask, _ = inputs
    got = attend(*inputs)
    ref = _dense(*inputs)
    gen = torch.Generator().manual_seed(9)
    weights = [torch.randn(r.shape, generator=gen) for r in ref]
    grads = []
    for out in (got, ref):
        grads.append(torch.autograd.grad(sum((o * w).sum() for o, w in zip(out, weights)), [qk, memory, phi]))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert (got[0][1] == 0).all() and (got[1][1] == 0).all()  # no neighbour: no weight, nothing attended
    assert (got[0][~mask[:, None, :].expand_as(got[0])] == 0).all()  # padding slots get no weight


def test_padding_slots_are_never_read():
    qk, memory, rows, feat, phi, mask, mult = _inputs()
    pd, xbar = attend(qk, memory, rows, feat, phi, mask, mult)
    junk = torch.where(mask[..., None], phi, torch.full_like(phi, 1e3))
    pd2, xbar2 = attend(qk, memory, rows, feat, junk, mask, mult)
    assert torch.equal(pd, pd2) and torch.equal(xbar, xbar2)


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
