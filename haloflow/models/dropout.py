"""Dropout whose mask is a pure function of global keys: `keyed_dropout`.

The mask of element (v, j) depends only on ``(seed, epoch, layer, node_ids[v], j)``, never on where row v sits in
the tensor or how many processes share the graph, so a distributed run drops exactly the elements the
single-process run drops::

    key of a row   k_v   = mix(mix(mix(seed + G*(epoch+1)) ^ layer) ^ node_ids[v])      G = 2^64 / golden ratio
    pair of cols   b_vi  = mix(k_v + G*(i+1))        i = j // 2                        mix = splitmix64 finaliser
    32-bit draw    u_vj  = high 32 bits of b_vi for even j, low 32 bits for odd j
    keep (v, j)    iff  u_vj >= round(p * 2^32)
    out[v, j]      = h[v, j] * (1 / (1 - p))  if kept, else 0
                     (with relu=True: kept also needs h[v, j] > 0, i.e. keyed_dropout(relu(h)) in one pass)

    rows in any order / any subset:      node_ids = [7, 2, 9]      node_ids = [9, 7]
                                          row 0 <-> id 7 mask  ==   row 1 <-> id 7 mask

Cost: one splitmix64 finaliser (2 multiplies, 3 shifts) per *two* elements, fused with the scaling in one
parallel numba pass that also writes a uint8 mask; the backward is one more pass over the gradient and mask.
Tensors on another device (CUDA) draw the same bits with int64 torch ops there (checked bit-identical on an H200).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from haloflow.errors import ConfigError
from haloflow.models.spmm import _sync_numba_threads
from haloflow.utils.splitmix import GOLDEN as _GOLDEN, M1 as _M1, M2 as _M2, mix as _mix, py_mix

__all__ = ["keyed_dropout", "dropout_mask"]

_LOW32 = np.uint64(0xFFFFFFFF)


@njit(inline="always", cache=True)
def _base_key(seed, epoch, layer):  # pragma: no cover - compiled
    base = _mix(np.uint64(seed) + _GOLDEN * (np.uint64(epoch) + np.uint64(1)))
    return _mix(base ^ np.uint64(layer))


@njit(inline="always", cache=True)
def _keep_one(h, out, mask, v, j, draw, thr, scale, relu, write_mask):  # pragma: no cover - compiled
    x = h[v, j]
    keep = draw >= thr
    if relu:
        keep = keep and x > 0
    out[v, j] = x * scale if keep else x * 0  # x * 0: a zero of h's dtype (no float64 detour)
    if write_mask:
        mask[v, j] = keep


@njit(parallel=True, cache=True)
def _dropout_kernel(h, node_ids, seed, epoch, layer, threshold, scale, relu, out, mask):  # pragma: no cover
    # One hash per pair of columns; rows in parallel. out = h * scale where kept (and h > 0 when relu), else 0.
    # The mask (what the backward passes through) is written only when it has rows (i.e. a gradient is wanted).
    base = _base_key(seed, epoch, layer)
    thr = np.uint64(threshold)
    f = h.shape[1]
    write_mask = mask.shape[0] > 0
    for v in prange(h.shape[0]):
        key = _mix(base ^ np.uint64(node_ids[v]))
        for i in range(f // 2):
            bits = _mix(key + _GOLDEN * np.uint64(i + 1))
            _keep_one(h, out, mask, v, 2 * i, bits >> np.uint64(32), thr, scale, relu, write_mask)
            _keep_one(h, out, mask, v, 2 * i + 1, bits & _LOW32, thr, scale, relu, write_mask)
        if f % 2:
            bits = _mix(key + _GOLDEN * np.uint64(f // 2 + 1))
            _keep_one(h, out, mask, v, f - 1, bits >> np.uint64(32), thr, scale, relu, write_mask)


@njit(parallel=True, cache=True)
def _masked_scale_kernel(g, mask, scale, out):  # pragma: no cover - compiled
    for v in prange(g.shape[0]):
        for j in range(g.shape[1]):
            out[v, j] = g[v, j] * scale if mask[v, j] else 0.0


def _threshold(p: float) -> int:
    return min(int(round(p * 2.0**32)), 2**32 - 1)


def _u64(value: int) -> int:
    return value & 0xFFFFFFFFFFFFFFFF


# ------------------------------------------------------------------ the same hash in torch ops, for other devices
def _signed(u: int) -> int:
    u &= 0xFFFFFFFFFFFFFFFF
    return u - (1 << 64) if u >= (1 << 63) else u


def _torch_mix(z: torch.Tensor) -> torch.Tensor:
    # int64 tensors hold the uint64 bits: multiplication wraps the same way; shifts are made logical by masking.
    def lsr(t: torch.Tensor, k: int) -> torch.Tensor:
        return (t >> k) & ((1 << (64 - k)) - 1)

    z = (z ^ lsr(z, 30)) * _signed(int(_M1))
    z = (z ^ lsr(z, 27)) * _signed(int(_M2))
    return z ^ lsr(z, 31)


def _torch_keep(node_ids: torch.Tensor, n_cols: int, p: float, seed: int, epoch: int, layer: int) -> torch.Tensor:
    """bool (n, n_cols) keep mask computed with torch ops on node_ids' device; bit-identical to the numba kernel."""
    g = int(_GOLDEN)
    base = py_mix(py_mix((_u64(seed) + g * (_u64(epoch) + 1)) & 0xFFFFFFFFFFFFFFFF) ^ _u64(layer))
    key = _torch_mix(node_ids.to(torch.int64) ^ _signed(base))  # (n,)
    pairs = (n_cols + 1) // 2
    steps = torch.tensor([_signed(g * (i + 1)) for i in range(pairs)], dtype=torch.int64, device=node_ids.device)
    bits = _torch_mix(key[:, None] + steps[None, :])  # (n, pairs)
    draws = torch.stack([(bits >> 32) & 0xFFFFFFFF, bits & 0xFFFFFFFF], dim=2).reshape(len(node_ids), 2 * pairs)
    return draws[:, :n_cols] >= _threshold(p)  # (n, n_cols)


def dropout_mask(node_ids: torch.Tensor, n_cols: int, *, p: float, seed: int, epoch: int, layer: int) -> torch.Tensor:
    """bool (len(node_ids), n_cols) on node_ids' device: True where `keyed_dropout` keeps the element."""
    if node_ids.device.type != "cpu":  # the torch ops on the device: the same bits, no host round trip
        return _torch_keep(node_ids, n_cols, p, seed, epoch, layer)
    ones = torch.ones(node_ids.shape[0], n_cols)
    return _dropout(ones, node_ids, p, seed, epoch, layer, relu=False, want_mask=True)[1].to(torch.bool)


def _dropout(h: torch.Tensor, node_ids: torch.Tensor, p: float, seed: int, epoch: int, layer: int, *,
             relu: bool, want_mask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    h = h.detach().contiguous()  # (n, F)
    if h.device.type != "cpu":  # same mask from torch ops on the device (one (n, F) int64 temporary)
        keep = _torch_keep(node_ids.to(h.device), h.shape[1], p, seed, epoch, layer)
        if relu:
            keep &= h > 0
        out = torch.where(keep, h * (1.0 / (1.0 - p)), torch.zeros((), dtype=h.dtype, device=h.device))
        return out, (keep.to(torch.uint8) if want_mask else keep.new_empty((0, 0), dtype=torch.uint8))
    ids = node_ids.detach().to(torch.int64).contiguous().numpy()  # (n,)
    out = torch.empty_like(h)  # (n, F)
    mask = torch.empty(h.shape if want_mask else (0, 0), dtype=torch.uint8)  # (n, F) or empty
    if h.numel():
        _sync_numba_threads()
        hn = h.numpy()
        scale = hn.dtype.type(1.0 / (1.0 - p))  # same dtype as h: one rounding of the scale, float arithmetic
        _dropout_kernel(hn, ids, np.uint64(_u64(seed)), np.uint64(_u64(epoch)), np.uint64(_u64(layer)),
                        np.uint64(_threshold(p)), scale, relu, out.numpy(),
                        mask.numpy())
    return out, mask


class _KeyedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, node_ids: torch.Tensor, p: float, seed: int, epoch: int, layer: int,
                relu: bool):
        out, mask = _dropout(h, node_ids, p, seed, epoch, layer, relu=relu, want_mask=ctx.needs_input_grad[0])
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p)
        return out  # (n, F)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (mask,) = ctx.saved_tensors
        g = grad_out.contiguous()
        if g.device.type != "cpu":
            return g * mask * ctx.scale, None, None, None, None, None, None
        grad_in = torch.empty_like(g)
        if g.numel():
            _sync_numba_threads()
            gn = g.numpy()
            _masked_scale_kernel(gn, mask.numpy(), gn.dtype.type(ctx.scale), grad_in.numpy())
        return grad_in, None, None, None, None, None, None


def keyed_dropout(
    h: torch.Tensor,
    node_ids: torch.Tensor,
    *,
    p: float,
    seed: int,
    epoch: int,
    layer: int,
    training: bool,
    relu: bool = False,
) -> torch.Tensor:
    """Dropout with a mask keyed by ``(seed, epoch, layer, global node id, column)``.

    Args:
        h: (n, F) features, one row per node.
        node_ids: int (n,) global id of each row.
        p: drop probability in [0, 1).
        seed, epoch, layer: the rest of the key (non-negative integers).
        training: when False (or p == 0), ``h`` is returned unchanged (or ``relu(h)``).
        relu: apply ``relu`` first, fused into the same pass (``keyed_dropout(relu(h))`` with one read of h).

    Shapes:
        h (n, F) -> (n, F); kept elements are scaled by ``1 / (1 - p)``.
    """
    if not 0.0 <= p < 1.0:
        raise ConfigError(f"dropout p must be in [0, 1), got {p}")
    if h.dim() != 2 or node_ids.shape != (h.shape[0],):
        raise ConfigError(
            f"keyed_dropout needs h (n, F) and node_ids (n,), got {tuple(h.shape)} and {tuple(node_ids.shape)}"
        )
    for name, val in (("seed", seed), ("epoch", epoch), ("layer", layer)):
        if val < 0:
            raise ConfigError(f"{name} must be >= 0 for a dropout key, got {val}")
    if not training or p == 0.0:
        return torch.relu(h) if relu else h
    return _KeyedDropout.apply(h, node_ids, p, seed, epoch, layer, relu)
