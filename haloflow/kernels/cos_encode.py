"""TGN's time encoding ``phi(dt) = cos(dt * w + b)`` and its backward: ``haloflow::cos_encode``.

The neighbours' encoding is the widest elementwise tensor of a TGN batch (3B x k x T = 600k values at batch 200,
k = 10, T = 100), and its arguments are large: ``w_0 = 1`` and gaps of days in seconds give ``|dt * w|`` up to
~1e7, where torch's vectorized cos takes its slow argument reduction (1.0-1.5 ms a batch for the cos, the same
again for the backward's sin, against ~0.4 ms at small arguments, 2 threads)::

    forward     a = dt * w + b  (rounded once, as torch's fused addcmul)   phi = cos(a), keep sin(a)
    backward    g_a = -sin(a) * g_phi      g_w = sum_rows dt * g_a      g_b = sum_rows g_a      g_dt = g_a . w

Rows the caller masks out (padding slots, rows without mail: a third of the neighbour slots on Wikipedia) are
zeros and get no gradient. The forward keeps ``sin(a)`` (one (n, T) tensor per batch), so the backward is
multiply-adds only.

Bodies:

- stock: ``torch.addcmul``, ``cos``, ``sin``; the backward's ``g_w`` one (1 x n) @ (n x T) product, ``g_b`` one
  column sum. Any device, any float dtype.
- CPU (numba, float32): one pass; the reduction done in float64 (``a = n pi/2 + r``, ``|r| <= pi/4``, Cody-Waite:
  exact to float32 for |a| < ~1e8, beyond which the float32 argument has no fractional digits left anyway) and
  Cephes' single-precision polynomials for sin and cos on r: within 1e-7 of the float64 cosine of the same
  float32 argument, as torch's (not bit for bit). The backward cuts rows into fixed chunks of ``_CHUNK`` (not one
  per thread); each chunk's partial sums of ``g_w`` and ``g_b`` are added in chunk order, so the gradients are the
  same floats at any thread count.

Shapes: dt (n,); w, b (T,); mask bool (n,); phi and its gradient (n, T).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from haloflow.host.threads import follow_torch_threads
from haloflow.kernels._registry import Op, call, eager, register

__all__ = ["cos_encode"]

_CHUNK = 128  # rows per partial sum of the backward's reductions (fixed: the thread count changes nothing)
_TWO_OVER_PI = 2.0 / math.pi
_PI_2_HI = 1.5707963267341256  # pi/2 = hi + lo (Cody-Waite), hi with 27 trailing zero bits: n * hi exact
_PI_2_LO = 6.077100506506192e-11
_SHIFT = 6755399441055744.0  # 1.5 * 2^52: adding and subtracting it rounds a float64 below 2^51 to an integer


# ------------------------------------------------------------------------------------------------ stock formula
def stock(dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, want_sin: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(phi (n, T), sin(a) (n, T) or (0, T)) by torch ops; both zeros on masked rows."""
    arg = torch.addcmul(b, dt.unsqueeze(-1), w)  # (n, T) dt * w + b, one pass (3x the separate ops here)
    phi = torch.cos(arg).masked_fill_(~mask.unsqueeze(-1), 0.0)
    sin_a = torch.sin(arg).masked_fill_(~mask.unsqueeze(-1), 0.0) if want_sin else arg.new_empty(0, w.shape[0])
    return phi, sin_a


def stock_backward(dt: torch.Tensor, w: torch.Tensor, sin_a: torch.Tensor, mask: torch.Tensor, grad: torch.Tensor,
                   want_dt: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(g_dt (n,) or (0,), g_w (T,), g_b (T,)): reduced over the (n, T) gradient once (``g_w = dt . g_a`` one
    product, ``g_b`` one column sum; autograd's broadcast reductions cost ~2 ms a CPU batch)."""
    g_a = sin_a.mul(grad).neg_().masked_fill_(~mask.unsqueeze(-1), 0.0)  # (n, T): d cos / d a = -sin
    g_dt = (g_a * w).sum(-1) if want_dt else dt.new_empty(0)
    return g_dt, (dt.reshape(1, -1) @ g_a).view(-1), g_a.sum(0)


# ------------------------------------------------------------------------------------------------ CPU body
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


def cpu(dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, want_sin: bool
        ) -> tuple[torch.Tensor, torch.Tensor]:
    if w.dtype != torch.float32:
        return stock(dt, w, b, mask, want_sin)
    dt, w, b, mask = (t.contiguous() for t in (dt, w, b, mask))
    d = w.shape[0]
    out = torch.empty(dt.shape[0], d, dtype=w.dtype)
    sin_a = torch.empty(dt.shape[0] if want_sin else 0, d, dtype=w.dtype)
    if dt.shape[0]:
        follow_torch_threads()
        _encode_fwd(dt.numpy(), w.numpy(), b.numpy(), mask.numpy(), out.numpy(), sin_a.numpy())
    return out, sin_a


def cpu_backward(dt: torch.Tensor, w: torch.Tensor, sin_a: torch.Tensor, mask: torch.Tensor, grad: torch.Tensor,
                 want_dt: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if w.dtype != torch.float32:
        return stock_backward(dt, w, sin_a, mask, grad, want_dt)
    dt, w, sin_a, mask, grad = (t.contiguous() for t in (dt, w, sin_a, mask, grad))
    d = w.shape[0]
    chunks = -(-dt.shape[0] // _CHUNK)
    partial_w, partial_b = torch.empty(chunks, d, dtype=w.dtype), torch.empty(chunks, d, dtype=w.dtype)
    g_dt = torch.empty(dt.shape[0] if want_dt else 0, dtype=w.dtype)
    if dt.shape[0]:
        follow_torch_threads()
        _encode_bwd(dt.numpy(), w.numpy(), sin_a.numpy(), mask.numpy(), grad.numpy(), g_dt.numpy(),
                    partial_w.numpy(), partial_b.numpy())
    # column sums of the chunks' partial sums by NumPy: one thread, a fixed order (the same at any thread count)
    return g_dt, torch.from_numpy(partial_w.numpy().sum(axis=0)), torch.from_numpy(partial_b.numpy().sum(axis=0))


# ------------------------------------------------------------------------------------------------ the op
@torch.library.custom_op("haloflow::cos_encode", mutates_args=())
def _cos_encode(dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, want_sin: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
    return stock(dt, w, b, mask, want_sin)


_cos_encode.register_kernel("cpu")(cpu)


@_cos_encode.register_fake
def _(dt, w, b, mask, want_sin):
    return dt.new_empty(dt.shape[0], w.shape[0], dtype=w.dtype), dt.new_empty(
        dt.shape[0] if want_sin else 0, w.shape[0], dtype=w.dtype)


@torch.library.custom_op("haloflow::cos_encode_backward", mutates_args=())
def _cos_encode_backward(dt: torch.Tensor, w: torch.Tensor, sin_a: torch.Tensor, mask: torch.Tensor,
                         grad: torch.Tensor, want_dt: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return stock_backward(dt, w, sin_a, mask, grad, want_dt)


_cos_encode_backward.register_kernel("cpu")(cpu_backward)


@_cos_encode_backward.register_fake
def _(dt, w, sin_a, mask, grad, want_dt):
    return dt.new_empty(dt.shape[0] if want_dt else 0, dtype=w.dtype), torch.empty_like(w), torch.empty_like(w)


def _setup(ctx, inputs, output):
    dt, w, _b, mask, _want = inputs
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(dt, w, output[1], mask)


def _backward(ctx, grad, _grad_sin):
    dt, w, sin_a, mask = ctx.saved_tensors
    need = ctx.needs_input_grad
    if grad is None or not any(need[:3]):
        return None, None, None, None, None
    g_dt, g_w, g_b = call(BACKWARD, dt, w, sin_a, mask, grad.contiguous(), need[0])
    return (g_dt if need[0] else None), (g_w if need[1] else None), (g_b if need[2] else None), None, None


_cos_encode.register_autograd(_backward, setup_context=_setup)


def cos_encode(dt: torch.Tensor, w: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None
               ) -> torch.Tensor:
    """``cos(dt[..., None] * w + b)``, differentiable in all three. Where ``mask`` is False the row is not encoded:
    zeros, and no gradient (TGN's padding slots and rows without mail, whose encodings nothing reads).

    Shapes:
        dt (...,);  w, b (T,);  mask bool (...,) or None (all rows)  ->  (..., T).
    """
    dt = dt.to(w.dtype)
    mask = torch.ones(dt.shape, dtype=torch.bool, device=dt.device) if mask is None else mask
    if mask.shape != dt.shape:
        raise ValueError(f"cos_encode: mask {tuple(mask.shape)} must have the shape of dt {tuple(dt.shape)}")
    want_sin = torch.is_grad_enabled() and any(t.requires_grad for t in (dt, w, b))
    phi, _ = _EAGER(dt.reshape(-1), w, b, mask.reshape(-1), want_sin)
    return phi.view(*dt.shape, w.shape[0])


OP = register(Op("cos_encode", stock=stock, cpu=cpu, custom_op=torch.ops.haloflow.cos_encode,
                 doc="TGN time encoding cos(dt w + b), keeping sin for the backward"))
BACKWARD = register(Op("cos_encode_backward", stock=stock_backward, cpu=cpu_backward,
                       custom_op=torch.ops.haloflow.cos_encode_backward,
                       doc="its backward: g_dt, g_w, g_b in a fixed chunk order"))
_EAGER = eager(OP, _setup, _backward)
