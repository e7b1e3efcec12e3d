"""Dropout whose mask is a pure function of global keys: `keyed_dropout`.

The mask of element (v, j) depends only on ``(seed, epoch, layer, node_ids[v], j)``, never on where row v sits in
the tensor or how many processes share the graph, so a distributed run drops exactly the elements the
single-process run drops::

    key of a row   k_v   = mix(mix(mix(seed + G*(epoch+1)) ^ layer) ^ node_ids[v])      G = 2^64 / golden ratio
    element bits   b_vj  = mix(k_v + G*(j+1))                                           mix = splitmix64 finaliser
    keep (v, j)    iff  (b_vj >> 40) >= round(p * 2^24)                                 24-bit uniform vs p
    out[v, j]      = h[v, j] / (1 - p)  if kept, else 0

    rows in any order / any subset:      node_ids = [7, 2, 9]      node_ids = [9, 7]
                                          row 0 <-> id 7 mask  ==   row 1 <-> id 7 mask

Cost: one splitmix64 finaliser (2 multiplies, 3 shifts) per element in a parallel numba kernel; the backward
multiplies by the saved uint8 mask (N x F bytes).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from haloflow.errors import ConfigError
from haloflow.models.spmm import _sync_numba_threads

__all__ = ["keyed_dropout", "dropout_mask"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_BITS = 24  # resolution of the keep test: p is rounded to a multiple of 2^-24


@njit(inline="always", cache=True)
def _mix(z):  # pragma: no cover - compiled
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(parallel=True, cache=True)
def _mask_kernel(node_ids, n_cols, seed, epoch, layer, threshold, mask):  # pragma: no cover - compiled
    base = _mix(np.uint64(seed) + _GOLDEN * (np.uint64(epoch) + np.uint64(1)))
    base = _mix(base ^ np.uint64(layer))
    shift = np.uint64(64 - _BITS)
    thr = np.uint64(threshold)
    for v in prange(node_ids.shape[0]):
        key = _mix(base ^ np.uint64(node_ids[v]))
        for j in range(n_cols):
            bits = _mix(key + _GOLDEN * np.uint64(j + 1))
            mask[v, j] = (bits >> shift) >= thr


def _threshold(p: float) -> int:
    return int(round(p * (1 << _BITS)))


def dropout_mask(node_ids: torch.Tensor, n_cols: int, *, p: float, seed: int, epoch: int, layer: int) -> torch.Tensor:
    """bool (len(node_ids), n_cols): True where `keyed_dropout` keeps the element."""
    ids = node_ids.detach().to(torch.int64).contiguous().numpy()  # (n,)
    mask = np.empty((ids.shape[0], n_cols), dtype=np.bool_)  # (n, F)
    if mask.size:
        _sync_numba_threads()
        _mask_kernel(ids, n_cols, seed & 0xFFFFFFFFFFFFFFFF, epoch & 0xFFFFFFFFFFFFFFFF,
                     layer & 0xFFFFFFFFFFFFFFFF, _threshold(p), mask)
    return torch.from_numpy(mask)


class _KeyedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return h * mask * scale  # (n, F)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return grad_out * mask * ctx.scale, None, None


def keyed_dropout(
    h: torch.Tensor,
    node_ids: torch.Tensor,
    *,
    p: float,
    seed: int,
    epoch: int,
    layer: int,
    training: bool,
) -> torch.Tensor:
    """Dropout with a mask keyed by ``(seed, epoch, layer, global node id, column)``.

    Args:
        h: (n, F) features, one row per node.
        node_ids: int (n,) global id of each row.
        p: drop probability in [0, 1).
        seed, epoch, layer: the rest of the key (non-negative integers).
        training: when False (or p == 0), ``h`` is returned unchanged.

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
        return h
    mask = dropout_mask(node_ids, h.shape[1], p=p, seed=seed, epoch=epoch, layer=layer)
    return _KeyedDropout.apply(h, mask, 1.0 / (1.0 - p))
