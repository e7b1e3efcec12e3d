"""haloflow/kernels/attend.py: the fused attention core against dense formulas, one query at a time (its bodies
against each other: tests/kernels/test_ops.py)."""

import torch

from haloflow.kernels.attend import attend


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
    """The formulas of kernels/attend.py, one query at a time."""
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
