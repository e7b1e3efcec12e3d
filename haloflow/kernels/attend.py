"""The core of TGN's temporal attention, fused: scores, masked softmax, dropout and the weighted sum of the
neighbour inputs in one pass per query, and the backward in one more: ``haloflow::attend``.

Per query q, head h and neighbour slot j (``qk`` is the query already moved into the neighbours' input space,
``tgn.TemporalAttention``)::

    s_hj  = qk_h . kv_j                              over the real slots (mask_j); padding never read
    p_hj  = softmax_j(s_hj)                          0 on padding; all 0 for a query without neighbours
    pd_hj = p_hj * mult_hj                           mult = keep / (1 - p_drop) of the keyed dropout (1 in eval)
    xbar_h = sum_j pd_hj kv_j

    backward, from g_pd (Q, H, k) and g_xbar (Q, H, Dk):
    gpd_hj = g_pd_hj + g_xbar_h . kv_j;   gs_hj = p_hj (gp_hj - sum_j' p_hj' gp_hj'),  gp = gpd * mult
    g_qk_h = sum_j gs_hj kv_j;            g_kv_j = sum_h gs_hj qk_h + pd_hj g_xbar_h
    g_memory[v] = sum of g_kv_j[:M] over the slots j (of any query) that read row v

Why a kernel: with H = 2 and k = 10 these are 600 tiny products a batch ((2 x 200) by (200 x 10) and back),
which batched BLAS runs at ~2 GFLOP/s (4.5 ms of a 21 ms CPU step, backward included); here each query's
products are one pass over its (k, Dk) block, rows in parallel (numba prange), no (Q, k, Dk) temporaries.
The memory's gradient is a second parallel pass, one memory row at a time over the slots that read it (a
counting sort of the slots by row), instead of a (Q, k, M) block of slot gradients and an ``index_add_``.
Every query and every memory row is computed by one thread in a fixed order, so the result does not depend on
the thread count, and a query's outputs not on which other queries share the call.

Bodies: stock, the formulas as torch ops (a (Q, k, Dk) block of the neighbour inputs built, ``einsum``, ``softmax``,
``bmm``; the backward by the formulas above, the memory's gradient an ``index_add_``), on any device; CPU (numba,
float32), the two passes above, equal to the stock formulas to float32 rounding (their sums run in another order).

Shapes: see `attend`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from haloflow.host.threads import follow_torch_threads
from haloflow.kernels._registry import Op, call, eager, register

__all__ = ["attend"]


# ------------------------------------------------------------------------------------------------ stock formula
def _neighbour_inputs(mem, rows, feat, phi):
    q_n, k = rows.shape
    return torch.cat([mem.index_select(0, rows.reshape(-1)).view(q_n, k, -1), feat, phi], dim=2)  # (Q, k, Dk)


def stock(qk, mem, phi, rows, feat, mask, mult):
    """(p, pd, xbar) by torch ops."""
    kv = _neighbour_inputs(mem, rows, feat, phi)  # (Q, k, Dk)
    scores = torch.einsum("qhd,qkd->qhk", qk, kv)  # (Q, H, k)
    empty = ~mask.any(dim=1)  # (Q,)
    scores = scores.masked_fill(~(mask | empty[:, None])[:, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).masked_fill(empty[:, None, None], 0.0)  # (Q, H, k)
    pd = p * mult
    return p, pd, torch.bmm(pd, kv)  # (Q, H, k), (Q, H, k), (Q, H, Dk)


def stock_backward(qk, mem, phi, rows, feat, mask, mult, p, pd, g_pd, g_xbar, want_mem):
    """(g_qk, g_mem (n, M) or (0, M), g_phi) by the formulas of the module docstring, as torch ops."""
    m, f = mem.shape[1], feat.shape[2]
    kv = _neighbour_inputs(mem, rows, feat, phi)  # (Q, k, Dk)
    gp = (g_pd + torch.einsum("qhd,qkd->qhk", g_xbar, kv)) * mult  # (Q, H, k): gradient of the softmax output
    g_s = p * (gp - (p * gp).sum(-1, keepdim=True))  # (Q, H, k); 0 on padding, where p is 0
    g_qk = torch.einsum("qhk,qkd->qhd", g_s, kv)  # (Q, H, Dk)
    g_kv = torch.einsum("qhk,qhd->qkd", g_s, qk) + torch.einsum("qhk,qhd->qkd", pd, g_xbar)  # (Q, k, Dk)
    g_kv = g_kv * mask[..., None]  # padding slots are never read
    g_mem = (torch.zeros_like(mem).index_add_(0, rows.reshape(-1), g_kv[..., :m].reshape(-1, m)) if want_mem
             else mem.new_empty(0, m))
    return g_qk, g_mem, g_kv[..., m + f:].contiguous()


# ------------------------------------------------------------------------------------------------ CPU body
@njit(inline="always", fastmath=True, cache=True)
def _dot(a, b):  # pragma: no cover - compiled
    # over 1-D rows: numba vectorizes these loops (indexing the 3-D arrays in place ran ~3x slower, unvectorized)
    s = np.float32(0.0)
    for c in range(a.shape[0]):
        s += a[c] * b[c]
    return s


@njit(inline="always", fastmath=True, cache=True)
def _axpy(w, x, y):  # pragma: no cover - compiled
    for c in range(x.shape[0]):
        y[c] += w * x[c]


@njit(inline="always", fastmath=True, cache=True)
def _axpy2(a, x, b, z, y):  # pragma: no cover - compiled
    for c in range(x.shape[0]):
        y[c] += a * x[c] + b * z[c]


@njit(inline="always", cache=True)
def _slot_dot(v, m, f, mem_row, feat_row, phi_row):  # pragma: no cover - compiled
    # v . [mem_row, feat_row, phi_row] without building the concatenated row
    return _dot(v[:m], mem_row) + _dot(v[m:m + f], feat_row) + _dot(v[m + f:], phi_row)


@njit(parallel=True, fastmath=True, cache=True)
def _attend_fwd(qk, mem, rows, feat, phi, mask, mult, p_out, pd_out, xbar):  # pragma: no cover - compiled
    n_q, n_h, d = qk.shape
    k, m, f = rows.shape[1], mem.shape[1], feat.shape[2]
    for q in prange(n_q):
        for h in range(n_h):
            qv = qk[q, h]
            top = -np.inf
            for j in range(k):
                if mask[q, j]:
                    s = _slot_dot(qv, m, f, mem[rows[q, j]], feat[q, j], phi[q, j])
                    p_out[q, h, j] = s
                    top = max(top, s)
            total = 0.0
            for j in range(k):
                if mask[q, j]:
                    e = math.exp(p_out[q, h, j] - top)
                    p_out[q, h, j] = e
                    total += e
            xb = xbar[q, h]
            xb[:] = 0.0
            for j in range(k):
                if mask[q, j]:
                    p_out[q, h, j] = p_out[q, h, j] / total
                    pd = p_out[q, h, j] * mult[q, h, j]  # the stored (rounded) p, as the backward reads it
                    pd_out[q, h, j] = pd
                    _axpy(pd, mem[rows[q, j]], xb[:m])
                    _axpy(pd, feat[q, j], xb[m:m + f])
                    _axpy(pd, phi[q, j], xb[m + f:])
                else:
                    p_out[q, h, j] = 0.0
                    pd_out[q, h, j] = 0.0


@njit(cache=True)
def _slots_by_row(rows, mask, n_rows, indptr, slots):  # pragma: no cover - compiled
    # counting sort of the real slots (q * k + j) by memory row: slots[indptr[v]:indptr[v + 1]] are row v's,
    # ascending (the backward adds them in this fixed order)
    n_q, k = rows.shape
    indptr[:] = 0
    for q in range(n_q):
        for j in range(k):
            if mask[q, j]:
                indptr[rows[q, j] + 1] += 1
    for v in range(n_rows):
        indptr[v + 1] += indptr[v]
    fill = indptr[:-1].copy()
    for q in range(n_q):
        for j in range(k):
            if mask[q, j]:
                r = rows[q, j]
                slots[fill[r]] = q * k + j
                fill[r] += 1


@njit(parallel=True, fastmath=True, cache=True)
def _attend_bwd(qk, mem, rows, feat, phi, mask, mult, p, pd, g_pd, g_xbar, g_qk, g_phi, g_s, indptr, slots, g_mem
                ):  # pragma: no cover - compiled
    # pass 1, per query: the scores' gradient g_s (Q, H, k), g_qk and g_phi. Pass 2, per memory row v (when
    # g_mem has rows): sum over v's slots (indptr, slots from _slots_by_row) of each slot's memory gradient,
    #   g_mem[v] = sum_(q, j) sum_h g_s[q, h, j] qk[q, h, :M] + pd[q, h, j] g_xbar[q, h, :M]
    # feat is data, so it gets none.
    n_q, n_h, d = qk.shape
    k, m, f = rows.shape[1], mem.shape[1], feat.shape[2]
    for q in prange(n_q):
        gs = g_s[q]  # (H, k)
        for h in range(n_h):
            gx = g_xbar[q, h]
            dot = 0.0
            for j in range(k):
                gs[h, j] = 0.0
                if mask[q, j]:
                    g = g_pd[q, h, j] + _slot_dot(gx, m, f, mem[rows[q, j]], feat[q, j], phi[q, j])
                    g *= mult[q, h, j]  # gradient of the softmax output p
                    gs[h, j] = g
                    dot += p[q, h, j] * g
            for j in range(k):
                gs[h, j] = p[q, h, j] * (gs[h, j] - dot)
            gq = g_qk[q, h]
            gq[:] = 0.0
            for j in range(k):
                if mask[q, j]:
                    w = gs[h, j]
                    _axpy(w, mem[rows[q, j]], gq[:m])
                    _axpy(w, feat[q, j], gq[m:m + f])
                    _axpy(w, phi[q, j], gq[m + f:])
        for j in range(k):
            gp = g_phi[q, j]
            gp[:] = 0.0
            if mask[q, j]:
                for h in range(n_h):
                    _axpy2(gs[h, j], qk[q, h, m + f:], pd[q, h, j], g_xbar[q, h, m + f:], gp)
    for v in prange(g_mem.shape[0]):
        gm = g_mem[v]
        gm[:] = 0.0
        for e in range(indptr[v], indptr[v + 1]):
            q, j = slots[e] // k, slots[e] % k
            for h in range(n_h):
                _axpy2(g_s[q, h, j], qk[q, h, :m], pd[q, h, j], g_xbar[q, h, :m], gm)


def cpu(qk, mem, phi, rows, feat, mask, mult):
    if any(t.dtype != torch.float32 for t in (qk, mem, phi, feat, mult)) or rows.shape[1] == 0:
        return stock(qk, mem, phi, rows, feat, mask, mult)
    qk, mem, phi, rows, feat, mask, mult = (t.contiguous() for t in (qk, mem, phi, rows, feat, mask, mult))
    n_q, n_h, d = qk.shape
    p = torch.empty(n_q, n_h, rows.shape[1], dtype=qk.dtype)
    pd, xbar = torch.empty_like(p), torch.empty(n_q, n_h, d, dtype=qk.dtype)
    if n_q:
        follow_torch_threads()
        _attend_fwd(qk.numpy(), mem.numpy(), rows.numpy(), feat.numpy(), phi.numpy(), mask.numpy(), mult.numpy(),
                    p.numpy(), pd.numpy(), xbar.numpy())
    return p, pd, xbar


def cpu_backward(qk, mem, phi, rows, feat, mask, mult, p, pd, g_pd, g_xbar, want_mem):
    if any(t.dtype != torch.float32 for t in (qk, mem, phi, feat, mult)) or rows.shape[1] == 0:
        return stock_backward(qk, mem, phi, rows, feat, mask, mult, p, pd, g_pd, g_xbar, want_mem)
    qk, mem, phi, rows, feat, mask, mult, p, pd, g_pd, g_xbar = (
        t.contiguous() for t in (qk, mem, phi, rows, feat, mask, mult, p, pd, g_pd, g_xbar))
    q_n, k = rows.shape
    g_qk, g_phi, g_s = torch.empty_like(qk), torch.empty_like(phi), torch.empty_like(p)
    g_mem = torch.empty_like(mem) if want_mem else mem.new_empty(0, mem.shape[1])
    indptr = np.zeros(mem.shape[0] + 1 if want_mem else 1, dtype=np.int64)
    slots = np.empty(q_n * k if want_mem else 0, dtype=np.int64)
    if want_mem:
        _slots_by_row(rows.numpy(), mask.numpy(), mem.shape[0], indptr, slots)
    if q_n or want_mem:
        follow_torch_threads()
        _attend_bwd(qk.numpy(), mem.numpy(), rows.numpy(), feat.numpy(), phi.numpy(), mask.numpy(), mult.numpy(),
                    p.numpy(), pd.numpy(), g_pd.numpy(), g_xbar.numpy(), g_qk.numpy(), g_phi.numpy(), g_s.numpy(),
                    indptr, slots, g_mem.numpy())
    return g_qk, g_mem, g_phi


# ------------------------------------------------------------------------------------------------ the op
@torch.library.custom_op("haloflow::attend", mutates_args=())
def _attend(qk: torch.Tensor, mem: torch.Tensor, phi: torch.Tensor, rows: torch.Tensor, feat: torch.Tensor,
            mask: torch.Tensor, mult: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return stock(qk, mem, phi, rows, feat, mask, mult)


_attend.register_kernel("cpu")(cpu)


@_attend.register_fake
def _(qk, mem, phi, rows, feat, mask, mult):
    p = qk.new_empty(qk.shape[0], qk.shape[1], rows.shape[1])
    return p, torch.empty_like(p), torch.empty_like(qk)


@torch.library.custom_op("haloflow::attend_backward", mutates_args=())
def _attend_backward(qk: torch.Tensor, mem: torch.Tensor, phi: torch.Tensor, rows: torch.Tensor, feat: torch.Tensor,
                     mask: torch.Tensor, mult: torch.Tensor, p: torch.Tensor, pd: torch.Tensor, g_pd: torch.Tensor,
                     g_xbar: torch.Tensor, want_mem: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return stock_backward(qk, mem, phi, rows, feat, mask, mult, p, pd, g_pd, g_xbar, want_mem)


_attend_backward.register_kernel("cpu")(cpu_backward)


@_attend_backward.register_fake
def _(qk, mem, phi, rows, feat, mask, mult, p, pd, g_pd, g_xbar, want_mem):
    return (torch.empty_like(qk), mem.new_empty(mem.shape[0] if want_mem else 0, mem.shape[1]),
            torch.empty_like(phi))


def _setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[0])
    ctx.save_for_backward(*inputs, output[0], output[1])


def _backward(ctx, _g_p, g_pd, g_xbar):
    qk, mem, phi, rows, feat, mask, mult, p, pd = ctx.saved_tensors
    g_pd = torch.zeros_like(pd) if g_pd is None else g_pd
    g_xbar = torch.zeros_like(qk) if g_xbar is None else g_xbar
    need = ctx.needs_input_grad
    g_qk, g_mem, g_phi = call(BACKWARD, qk, mem, phi, rows, feat, mask, mult, p, pd, g_pd, g_xbar, need[1])
    return g_qk, (g_mem if need[1] else None), g_phi, None, None, None, None


_attend.register_autograd(_backward, setup_context=_setup)


def attend(qk: torch.Tensor, memory: torch.Tensor, rows: torch.Tensor, feat: torch.Tensor, phi: torch.Tensor,
           mask: torch.Tensor, mult: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropped attention weights ``pd`` and the weighted neighbour inputs ``xbar`` (formulas above), the input
    of slot j of query q being ``kv_qj = [memory[rows[q, j]], feat[q, j], phi[q, j]]``, read in place (the
    (Q, k, Dk) block is never built on the CPU: its concatenation alone took 1.4 ms a batch).

    Differentiable in ``qk``, ``memory`` and ``phi``; ``feat`` (edge features) and ``mult`` (the dropout's
    keep / (1 - p), or ones) are constants. A ready (Q, k, Dk) block is ``memory = kv.view(Q*k, Dk)`` with
    ``rows = arange(Q*k).view(Q, k)``.

    Shapes:
        qk (Q, H, M+F+T);  memory (n, M);  rows int64 (Q, k) in [0, n);  feat (Q, k, F);  phi (Q, k, T);
        mask bool (Q, k);  mult (Q, H, k)  ->  pd (Q, H, k), xbar (Q, H, M+F+T).
    """
    _p, pd, xbar = _EAGER(qk, memory, phi, rows, feat, mask, mult.to(qk.dtype))
    return pd, xbar


OP = register(Op("attend", stock=stock, cpu=cpu, custom_op=torch.ops.haloflow.attend,
                 doc="TGN attention core: scores, masked softmax, dropout, weighted sum in one pass"))
BACKWARD = register(Op("attend_backward", stock=stock_backward, cpu=cpu_backward,
                       custom_op=torch.ops.haloflow.attend_backward,
                       doc="its backward; the memory gradient one row at a time over the slots that read it"))
_EAGER = eager(OP, _setup, _backward)
