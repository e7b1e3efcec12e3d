"""TGN's time encoding ``phi(dt) = cos(dt * w + b)`` and its backward as compiled loops: `cos_encode`.

The neighbours' encoding is the widest elementwise tensor of a TGN batch (3B x k x T = 600k values at batch 200,
k = 10, T = 100), and its arguments are large: ``w_0 = 1`` and gaps of days in seconds give ``|dt * w|`` up to
~1e7, where torch's vectorized cos takes its slow argument reduction (1.0-1.5 ms a batch for the cos, the same
again for the backward's sin, against ~0.4 ms at small arguments, 2 threads). Here one pass computes::

    forward     a = dt * w + b  (float32, rounded once, as torch's fused addcmul)   phi = cos(a)
    backward    g_a = -sin(a) * g_phi      g_w = sum_rows dt * g_a      g_b = sum_rows g_a      g_dt = g_a . w

with the reduction done in float64 (``a = n pi/2 + r``, ``|r| <= pi/4``, Cody-Waite: exact to float32 for
|a| < ~1e8, beyond which the float32 argument has no fractional digits left anyway) and Cephes' single-precision
polynomials for sin and cos on r: within 1e-7 of the float64 cosine of the same float32 argument, as torch's.
``a`` is recomputed in the backward instead of saved (one (n, T) tensor less held per batch).

Determinism: rows are cut into fixed chunks of ``_CHUNK`` (not one per thread); each chunk's partial sums of
``g_w`` and ``g_b`` are added in chunk order, so the gradients are the same floats at any thread count.

Shapes: dt (n,) float32; w, b (T,) float32; phi and its gradient (n, T).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from haloflow.utils.threads import follow_torch_threads

__all__ = ["cos_encode"]

_CHUNK = 128  # rows per partial sum of the backward's reductions (fixed: the thread count changes nothing)
_TWO_OVER_PI = 2.0 / math.pi
_PI_2_HI = 1.5707963267341256  # pi/2 = hi + lo (Cody-Waite), hi with 27 trailing zero bits: n * hi exact
_PI_2_LO = 6.077100506506192e-11


@njit(inline="always", cache=True)
def _reduce(a):  # pragma: no cover - compiled
    # a (float32) = n pi/2 + r: r as float32 in [-pi/4, pi/4] and the quadrant n mod 4
    x = np.float64(a)
    n = math.floor(x * _TWO_OVER_PI + 0.5)
    r = (x - n * _PI_2_HI) - n * _PI_2_LO
    return np.float32(r), np.int64(n) & 3


@njit(inline="always", cache=True)
def _sin_cos_poly(r):  # pragma: no cover - compiled
    # Cephes sinf / cosf on |r| <= pi/4
    z = r * r
    s = r + r * z * (np.float32(-1.6666654611e-1) + z * (np.float32(8.3321608736e-3)
                                                       + z * np.float32(-1.9515295891e-4)))
    c = (np.float32(1.0) - np.float32(0.5) * z
         + z * z * (np.float32(4.166664568298827e-2) + z * (np.float32(-1.388731625493765e-3)
                                                             + z * np.float32(2.443315711809948e-5))))
    return s, c


@njit(inline="always", cache=True)
def _arg(x, w, b):  # pragma: no cover - compiled
    # x * w + b rounded once to float32 (torch's addcmul is a fused multiply-add): the float64 product of two
    # float32 values is exact
    return np.float32(np.float64(x) * np.float64(w) + np.float64(b))


@njit(inline="always", cache=True)
def _cos(a):  # pragma: no cover - compiled
    r, q = _reduce(a)
    s, c = _sin_cos_poly(r)
    # cos(r + q pi/2) = c, -s, -c, s
    v = c if (q & 1) == 0 else s
    return -v if (q == 1 or q == 2) else v


@njit(inline="always", cache=True)
def _sin(a):  # pragma: no cover - compiled
    r, q = _reduce(a)
    s, c = _sin_cos_poly(r)
    # sin(r + q pi/2) = s, c, -s, -c
    v = s if (q & 1) == 0 else c
    return -v if q >= 2 else v


@njit(parallel=True, cache=True)
def _encode_fwd(dt, w, b, out):  # pragma: no cover - compiled
    n, d = out.shape
    for i in prange(n):
        x, o = dt[i], out[i]
        for c in range(d):
            o[c] = _cos(_arg(x, w[c], b[c]))


@njit(parallel=True, cache=True)
def _encode_bwd(dt, w, b, grad, g_dt, partial_w, partial_b):  # pragma: no cover - compiled
    # partial_w, partial_b (chunks, d): one row of sums per chunk of _CHUNK rows; g_dt (n,) or (0,)
    n, d = grad.shape
    want_dt = g_dt.shape[0] > 0
    for ch in prange(partial_w.shape[0]):
        pw, pb = partial_w[ch], partial_b[ch]
        pw[:] = 0.0
        pb[:] = 0.0
        for i in range(ch * _CHUNK, min(n, (ch + 1) * _CHUNK)):
            x, g = dt[i], grad[i]
            for c in range(d):
                ga = -_sin(_arg(x, w[c], b[c])) * g[c]
                pw[c] += x * ga
                pb[c] += ga
            if want_dt:  # a loop of its own: the sum over c would keep the one above from vectorizing
                s_dt = np.float32(0.0)
                for c in range(d):
                    s_dt += -_sin(_arg(x, w[c], b[c])) * g[c] * w[c]
                g_dt[i] = s_dt


class _CosEncode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        flat = dt.detach().reshape(-1).contiguous()
        out = torch.empty(flat.shape[0], w.shape[0], dtype=w.dtype)
        if flat.shape[0]:
            follow_torch_threads()
            _encode_fwd(flat.numpy(), w.detach().contiguous().numpy(), b.detach().contiguous().numpy(), out.numpy())
        ctx.save_for_backward(flat, w, b)
        ctx.dt_shape = dt.shape
        return out.view(*dt.shape, w.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        flat, w, b = ctx.saved_tensors
        d = w.shape[0]
        g = grad.reshape(-1, d).contiguous()
        chunks = -(-flat.shape[0] // _CHUNK)
        partial_w, partial_b = torch.empty(chunks, d, dtype=w.dtype), torch.empty(chunks, d, dtype=w.dtype)
        g_dt = torch.empty(flat.shape[0] if ctx.needs_input_grad[0] else 0, dtype=w.dtype)
        if flat.shape[0]:
            follow_torch_threads()
            _encode_bwd(flat.numpy(), w.detach().contiguous().numpy(), b.detach().contiguous().numpy(), g.numpy(),
                        g_dt.numpy(), partial_w.numpy(), partial_b.numpy())
        g_w = _sum_rows(partial_w) if ctx.needs_input_grad[1] else None
        g_b = _sum_rows(partial_b) if ctx.needs_input_grad[2] else None
        return (g_dt.view(ctx.dt_shape) if ctx.needs_input_grad[0] else None), g_w, g_b


def _sum_rows(x: torch.Tensor) -> torch.Tensor:
    """Column sums of the chunks' partial sums by NumPy (one thread, a fixed order: the same at any thread count)."""
    return torch.from_numpy(x.numpy().sum(axis=0))


class _CosEncodeOps(torch.autograd.Function):
    """The same as torch ops (other devices), with a backward that reduces over the (..., d) gradient once:
    ``g_w = dt . g_arg`` as one matrix product, ``g_b`` one column sum (autograd's broadcast reductions cost ~2 ms
    a CPU batch)."""

    @staticmethod
    def forward(ctx, dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        arg = torch.addcmul(b, dt.unsqueeze(-1), w)  # (..., d) dt * w + b, one pass (3x the separate ops here)
        ctx.save_for_backward(dt, w, arg)
        return torch.cos(arg)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dt, w, arg = ctx.saved_tensors
        g_arg = torch.sin(arg).mul_(grad).neg_().reshape(-1, w.shape[0])  # (n, d): d cos / d arg = -sin
        g_dt = (g_arg * w).sum(-1).view(dt.shape) if ctx.needs_input_grad[0] else None
        g_w = (dt.reshape(1, -1) @ g_arg).view(-1) if ctx.needs_input_grad[1] else None  # (d,)
        g_b = g_arg.sum(0) if ctx.needs_input_grad[2] else None  # (d,)
        return g_dt, g_w, g_b


def cos_encode(dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``cos(dt[..., None] * w + b)``, differentiable in all three; compiled on float32 CPU tensors, torch's ops
    elsewhere.

    Shapes:
        dt (...,);  w, b (T,)  ->  (..., T).
    """
    dt = dt.to(w.dtype)
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in (dt, w, b)):
        return _CosEncodeOps.apply(dt, w, b)
    return _CosEncode.apply(dt, w, b)
