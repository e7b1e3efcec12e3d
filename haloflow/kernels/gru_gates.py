"""torch's GRU cell from its products, forward and backward by hand: ``haloflow::gru_gates``.

TGN's memory update (``models/tgn._gru_cell``) computes the cell's products arranged by input part and hands the
gates here::

    r, z = sigmoid(xp_rz + hp_rz)                            torch's gate order r, z, n
    n    = tanh(xp_n + hp_n + r * (hp_gh + b_gh))            hp = [hp_rz | hp_n | hp_gh]   (n, 4M)
    h'   = (1 - z) n + z h                                   xp = [xp_rz | xp_n]            (n, 3M)

    backward, from g = dL/dh':
    g_an  = g (1 - z) (1 - n^2)                                   d/d(xp_n + hp_n + r gh_n)
    g_hp  = [ g_an gh_n r (1 - r) | g (h - n) z (1 - z) | g_an | g_an r ]      (n, 4M); its first 3M: g_xp
    g_h   = g z

By hand because autograd's version of these ~8 lines (slices, chunk, where and their zero-filled backwards) cost
more than the arithmetic. ``b_gh`` (W_hh's n bias, inside the r product) comes in here rather than through the
product of h: a bias there is a copy of an (n, 4M) block before the product.

Bodies:

- stock: the formulas as torch ops, on any device.
- CPU: the forward's sigmoid runs over a buffer padded so that torch cuts it into pieces of whole vector steps at
  the thread count of the moment (`_tail_free`): torch gives each thread ``ceil(numel / pieces)`` elements and runs
  the last ``piece % 32`` of each in its scalar loop, whose sigmoid rounds differently from the vector one (47 of
  3.1 M values here), so the result depended on the thread count. The backward is one numba pass over the rows
  for what autograd did in ~15 (n, M) passes. Equal to the stock formulas to float32 rounding (the sigmoid's
  vector and scalar loops differ in a few values), and the same bits at any thread count.

Shapes: xp (n, 3M);  hp (n, 4M);  b_gh (M,);  h (n, M)  ->  h' (n, M).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from haloflow.host.threads import follow_torch_threads
from haloflow.kernels._registry import Op, call, eager, register

__all__ = ["gru_gates"]

_GRAIN = 32768  # at::internal::GRAIN_SIZE: torch cuts an elementwise op over more elements into one piece a thread
_STEP = 32  # elements of one step of torch's vector loop (2 x 16 floats with AVX-512; a multiple of AVX2's and NEON's)


def _gates(xp, hp, b_gh, h, rz):
    """The forward once ``rz`` holds sigmoid(xp_rz + hp_rz): (h', n, gh_n)."""
    m = h.shape[1]
    r, z = rz[:, :m], rz[:, m:]
    gh_n = torch.add(hp[:, 3 * m:], b_gh)  # (n, M)
    n = torch.add(xp[:, 2 * m:], hp[:, 2 * m:3 * m]).addcmul_(r, gh_n).tanh_()  # (n, M)
    return torch.lerp(n, h, z), n, gh_n


def stock(xp: torch.Tensor, hp: torch.Tensor, b_gh: torch.Tensor, h: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h', rz, n, gh_n): the output and what the backward reads."""
    m = h.shape[1]
    rz = torch.add(xp[:, :2 * m], hp[:, :2 * m]).sigmoid_()  # (n, 2M): r | z
    out, n, gh_n = _gates(xp, hp, b_gh, h, rz)
    return out, rz, n, gh_n


def stock_backward(g, rz, n, gh_n, h) -> tuple[torch.Tensor, torch.Tensor]:
    """(g_hp (n, 4M), g_h (n, M))."""
    m = h.shape[1]
    r, z = rz[:, :m], rz[:, m:]
    g_an = g * (1.0 - z) * (1.0 - n * n)  # d/d(xp_n + hp_n + r gh_n)
    g_hp = torch.cat([g_an * gh_n * r * (1.0 - r), g * (h - n) * z * (1.0 - z), g_an, g_an * r], dim=1)
    return g_hp, g * z


def _tail_free(rows: int, width: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An empty (rows, width) block and the flat buffer it starts, padded so that torch cuts an elementwise op
    over the buffer into pieces of whole vector steps, at the thread count of the moment (the module docstring)."""
    numel, threads = rows * width, torch.get_num_threads()
    size = -(-numel // _STEP) * _STEP
    while True:
        pieces = 1 if size < _GRAIN or threads == 1 else min(threads, -(-size // _GRAIN))
        padded = -(-size // (_STEP * pieces)) * (_STEP * pieces)
        if padded == size:
            break
        size = padded
    buf = like.new_empty(size)
    return buf[:numel].view(rows, width), buf


def cpu(xp, hp, b_gh, h):
    m, rows = h.shape[1], h.shape[0]
    rz, buf = _tail_free(rows, 2 * m, xp)  # (n, 2M): r | z
    torch.add(xp[:, :2 * m], hp[:, :2 * m], out=rz)
    # over the padded buffer every element takes torch's vector loop: the same bits at any thread count (the
    # scalar and vector tanh, lerp and addcmul below agreed on every value tried; the sigmoids did not)
    buf.sigmoid_()
    out, n, gh_n = _gates(xp, hp, b_gh, h, rz)
    return out, rz, n, gh_n  # rz a view of the padded buffer (no copy); nothing else holds the buffer


@njit(parallel=True, cache=True)
def _gru_gates_bwd(g, rz, n, gh_n, h, g_hp, g_h):  # pragma: no cover - compiled
    # one pass over the rows for what autograd did in ~15 (n, M) passes; formulas in the module docstring
    m = h.shape[1]
    for i in prange(g.shape[0]):
        gr, ghr, gpr, hr, nr, rzr, ghn = g[i], g_h[i], g_hp[i], h[i], n[i], rz[i], gh_n[i]
        for c in range(m):
            r, z, nv = rzr[c], rzr[m + c], nr[c]
            an = gr[c] * (np.float32(1.0) - z) * (np.float32(1.0) - nv * nv)
            gpr[2 * m + c] = an
            gpr[3 * m + c] = an * r
            gpr[c] = an * ghn[c] * r * (np.float32(1.0) - r)
            gpr[m + c] = gr[c] * (hr[c] - nv) * z * (np.float32(1.0) - z)
            ghr[c] = gr[c] * z


def cpu_backward(g, rz, n, gh_n, h):
    if g.dtype != torch.float32 or g.shape[0] == 0:
        return stock_backward(g, rz, n, gh_n, h)
    g, rz, n, gh_n, h = (t.contiguous() for t in (g, rz, n, gh_n, h))
    m = h.shape[1]
    g_hp, g_h = torch.empty(g.shape[0], 4 * m, dtype=g.dtype), torch.empty_like(h)
    follow_torch_threads()
    _gru_gates_bwd(g.numpy(), rz.numpy(), n.numpy(), gh_n.numpy(), h.numpy(), g_hp.numpy(), g_h.numpy())
    return g_hp, g_h


# ------------------------------------------------------------------------------------------------ the op
@torch.library.custom_op("haloflow::gru_gates", mutates_args=())
def _gru_gates(xp: torch.Tensor, hp: torch.Tensor, b_gh: torch.Tensor, h: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return stock(xp, hp, b_gh, h)


_gru_gates.register_kernel("cpu")(cpu)


@_gru_gates.register_fake
def _(xp, hp, b_gh, h):
    m = h.shape[1]
    return torch.empty_like(h), h.new_empty(h.shape[0], 2 * m), torch.empty_like(h), torch.empty_like(h)


@torch.library.custom_op("haloflow::gru_gates_backward", mutates_args=())
def _gru_gates_backward(g: torch.Tensor, rz: torch.Tensor, n: torch.Tensor, gh_n: torch.Tensor, h: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    return stock_backward(g, rz, n, gh_n, h)


_gru_gates_backward.register_kernel("cpu")(cpu_backward)


@_gru_gates_backward.register_fake
def _(g, rz, n, gh_n, h):
    return g.new_empty(g.shape[0], 4 * h.shape[1]), torch.empty_like(h)


def _setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(output[1], output[2], output[3], inputs[3])


def _backward(ctx, g, *_unused):
    rz, n, gh_n, h = ctx.saved_tensors
    need = ctx.needs_input_grad
    if g is None:
        return None, None, None, None
    g_hp, g_h = call(BACKWARD, g.contiguous(), rz, n, gh_n, h)
    m = h.shape[1]
    g_b = g_hp[:, 3 * m:].sum(0) if need[2] else None
    return (g_hp[:, :3 * m] if need[0] else None), (g_hp if need[1] else None), g_b, (g_h if need[3] else None)


_gru_gates.register_autograd(_backward, setup_context=_setup)


def gru_gates(xp: torch.Tensor, hp: torch.Tensor, b_gh: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The GRU cell's new state from its products (the module docstring); differentiable in all four.

    Shapes:
        xp (n, 3M);  hp (n, 4M);  b_gh (M,);  h (n, M)  ->  (n, M).
    """
    return _EAGER(xp, hp, b_gh, h)[0]


OP = register(Op("gru_gates", stock=stock, cpu=cpu, custom_op=torch.ops.haloflow.gru_gates,
                 doc="GRU gates from the cell's products; the sigmoid over a tail-free buffer on the CPU"))
BACKWARD = register(Op("gru_gates_backward", stock=stock_backward, cpu=cpu_backward,
                       custom_op=torch.ops.haloflow.gru_gates_backward,
                       doc="its backward in one pass over the rows"))
_EAGER = eager(OP, _setup, _backward)
