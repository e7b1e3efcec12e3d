"""TGN's time encoding ``phi(dt) = cos(dt * w + b)`` and its backward as compiled loops: `cos_encode`.

The neighbours' encoding is the widest elementwise tensor of a TGN batch (3B x k x T = 600k values at batch 200,
k = 10, T = 100), and its arguments are large: ``w_0 = 1`` and gaps of days in seconds give ``|dt * w|`` up to
~1e7, where torch's vectorized cos takes its slow argument reduction (1.0-1.5 ms a batch for the cos, the same
again for the backward's sin, against ~0.4 ms at small arguments, 2 threads). Here one pass computes::

    forward     a = dt * w + b  (float32, rounded once, as torch's fused addcmul)   phi = cos(a), keep sin(a)
    backward    g_a = -sin(a) * g_phi      g_w = sum_rows dt * g_a      g_b = sum_rows g_a      g_dt = g_a . w

with the reduction done in float64 (``a = n pi/2 + r``, ``|r| <= pi/4``, Cody-Waite: exact to float32 for
|a| < ~1e8, beyond which the float32 argument has no fractional digits left anyway) and Cephes' single-precision
polynomials for sin and cos on r: within 1e-7 of the float64 cosine of the same float32 argument, as torch's.
The polynomials give sin and cos together, so the forward keeps ``sin(a)`` (one (n, T) tensor held per batch) and
the backward is multiply-adds only (it used to reduce every argument again: 1.2 of its 1.4 ms). Rows the caller
masks out (padding slots, rows without mail: a third of the neighbour slots on Wikipedia) are not computed.

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
_SHIFT = 6755399441055744.0  # 1.5 * 2^52: adding and subtracting it rounds a float64 below 2^51 to an integer


@njit(inline="always", cache=True)
def _reduce(a):  # pragma: no cover - compiled
    # a (float32) = n pi/2 + r: r as float32 in [-pi/4, pi/4] and the quadrant n mod 4 as a float32 in
    # {-2, -1, 0, 1, 2}. n is rounded with the 1.5 * 2^52 shift, not math.floor: the same n except at exact
    # halves, and on AVX2 (Zen 1 measured) floor's vroundpd made the reduction 2x slower. No fastmath here: it
    # would fold the shift away.
    x = np.float64(a)
    n = (x * _TWO_OVER_PI + _SHIFT) - _SHIFT
    r = (x - n * _PI_2_HI) - n * _PI_2_LO
    q = n - 4.0 * ((n * 0.25 + _SHIFT) - _SHIFT)  # n - 4 round(n / 4)
    return np.float32(r), np.float32(q)


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
def _sin_cos(a):  # pragma: no cover - compiled
    r, q = _reduce(a)
    s, c = _sin_cos_poly(r)
    # with a = r + q pi/2:  q = 0, 1, +-2, -1:  cos(a) = c, -s, -c, s;  sin(a) = s, c, -s, -c
    odd = q * q == np.float32(1.0)
    opposite = q * q == np.float32(4.0)  # q = +-2
    cos_v = s if odd else c
    sin_v = c if odd else s
    cos_v = -cos_v if (q == np.float32(1.0) or opposite) else cos_v
    sin_v = -sin_v if (q == np.float32(-1.0) or opposite) else sin_v
    return sin_v, cos_v


@njit(parallel=True, cache=True)
def _encode_fwd(dt, w, b, mask, out, sin_out):  # pragma: no cover - compiled
    # out (n, d) = cos(a); sin_out (n, d) = sin(a) for the backward, or (0, d) when no gradient is wanted;
    # rows where mask (n,) is False are zeros in both
    n, d = out.shape
    want_sin = sin_out.shape[0] > 0
    for i in prange(n):
        x, o = dt[i], out[i]
        if not mask[i]:
            o[:] = 0.0
            if want_sin:
                sin_out[i][:] = 0.0
            continue
        if want_sin:
            so = sin_out[i]
            for c in range(d):
                s, co = _sin_cos(_arg(x, w[c], b[c]))
                o[c] = co
                so[c] = s
        else:
            for c in range(d):
                o[c] = _sin_cos(_arg(x, w[c], b[c]))[1]


@njit(parallel=True, cache=True)
def _encode_bwd(dt, w, sin_a, mask, grad, g_dt, partial_w, partial_b):  # pragma: no cover - compiled
    # partial_w, partial_b (chunks, d): one row of sums per chunk of _CHUNK rows; g_dt (n,) or (0,); rows
    # where mask is False are constants (no gradient)
    n, d = grad.shape
    want_dt = g_dt.shape[0] > 0
    for ch in prange(partial_w.shape[0]):
        pw, pb = partial_w[ch], partial_b[ch]
        pw[:] = 0.0
        pb[:] = 0.0
        for i in range(ch * _CHUNK, min(n, (ch + 1) * _CHUNK)):
            if not mask[i]:
                if want_dt:
                    g_dt[i] = 0.0
                continue
            x, g, s = dt[i], grad[i], sin_a[i]
            for c in range(d):
                ga = -s[c] * g[c]
                pw[c] += x * ga
                pb[c] += ga
            if want_dt:  # a loop of its own: the sum over c would keep the one above from vectorizing
                s_dt = np.float32(0.0)
                for c in range(d):
                    s_dt += -s[c] * g[c] * w[c]
                g_dt[i] = s_dt


class _CosEncode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        flat = dt.detach().reshape(-1).contiguous()
        keep = mask.reshape(-1).contiguous()
        d = w.shape[0]
        out = torch.empty(flat.shape[0], d, dtype=w.dtype)
        # sin(a) is kept for the backward (one (n, d) tensor) instead of reducing every argument a second time
        sin_a = torch.empty(flat.shape[0] if any(ctx.needs_input_grad[:3]) else 0, d, dtype=w.dtype)
        if flat.shape[0]:
            follow_torch_threads()
            _encode_fwd(flat.numpy(), w.detach().contiguous().numpy(), b.detach().contiguous().numpy(),
                        keep.numpy(), out.numpy(), sin_a.numpy())
        ctx.save_for_backward(flat, w, sin_a, keep)
        ctx.dt_shape = dt.shape
        return out.view(*dt.shape, d)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        flat, w, sin_a, keep = ctx.saved_tensors
        d = w.shape[0]
        g = grad.reshape(-1, d).contiguous()
        chunks = -(-flat.shape[0] // _CHUNK)
        partial_w, partial_b = torch.empty(chunks, d, dtype=w.dtype), torch.empty(chunks, d, dtype=w.dtype)
        g_dt = torch.empty(flat.shape[0] if ctx.needs_input_grad[0] else 0, dtype=w.dtype)
        if flat.shape[0]:
            follow_torch_threads()
            _encode_bwd(flat.numpy(), w.detach().contiguous().numpy(), sin_a.numpy(), keep.numpy(), g.numpy(),
                        g_dt.numpy(), partial_w.numpy(), partial_b.numpy())
        g_w = _sum_rows(partial_w) if ctx.needs_input_grad[1] else None
        g_b = _sum_rows(partial_b) if ctx.needs_input_grad[2] else None
        return (g_dt.view(ctx.dt_shape) if ctx.needs_input_grad[0] else None), g_w, g_b, None


def _sum_rows(x: torch.Tensor) -> torch.Tensor:
    """Column sums of the chunks' partial sums by NumPy (one thread, a fixed order: the same at any thread count)."""
    return torch.from_numpy(x.numpy().sum(axis=0))


class _CosEncodeOps(torch.autograd.Function):
    """The same as torch ops (other devices), with a backward that reduces over the (..., d) gradient once:
    ``g_w = dt . g_arg`` as one matrix product, ``g_b`` one column sum (autograd's broadcast reductions cost ~2 ms
    a CPU batch)."""

    @staticmethod
    def forward(ctx, dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        arg = torch.addcmul(b, dt.unsqueeze(-1), w)  # (..., d) dt * w + b, one pass (3x the separate ops here)
        ctx.save_for_backward(dt, w, arg, mask)
        return torch.cos(arg).masked_fill_(~mask.unsqueeze(-1), 0.0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dt, w, arg, mask = ctx.saved_tensors
        g_arg = torch.sin(arg).mul_(grad).neg_().masked_fill_(~mask.unsqueeze(-1), 0.0)  # d cos / d arg = -sin
        g_arg = g_arg.reshape(-1, w.shape[0])  # (n, d)
        g_dt = (g_arg * w).sum(-1).view(dt.shape) if ctx.needs_input_grad[0] else None
        g_w = (dt.reshape(1, -1) @ g_arg).view(-1) if ctx.needs_input_grad[1] else None  # (d,)
        g_b = g_arg.sum(0) if ctx.needs_input_grad[2] else None  # (d,)
        return g_dt, g_w, g_b, None


def cos_encode(dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None
               ) -> torch.Tensor:
    """``cos(dt[..., None] * w + b)``, differentiable in all three; compiled on float32 CPU tensors, torch's ops
    elsewhere. Where ``mask`` is False the row is not encoded: zeros, and no gradient (TGN's padding slots and
    rows without mail, whose encodings nothing reads: about a third of a batch's neighbour slots).

    Shapes:
        dt (...,);  w, b (T,);  mask bool (...,) or None (all rows)  ->  (..., T).
    """
    dt = dt.to(w.dtype)
    mask = torch.ones(dt.shape, dtype=torch.bool, device=dt.device) if mask is None else mask
    if mask.shape != dt.shape:
        raise ValueError(f"cos_encode: mask {tuple(mask.shape)} must have the shape of dt {tuple(dt.shape)}")
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in (dt, w, b)):
        return _CosEncodeOps.apply(dt, w, b, mask)
    return _CosEncode.apply(dt, w, b, mask)
