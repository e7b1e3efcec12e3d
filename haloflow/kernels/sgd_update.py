"""SGD on a batch's rows where they are: ``haloflow::sgd_update`` (``cache/optim.py``'s ``SGD``).

::

    weight[index[k]] += -lr * grad[k]      k = 0..u-1; weight (N, D), index (u,), grad (u, D), in place

``index`` holds distinct rows, but for repeats whose gradient is zero, next to each other (a padded batch's pad
row, ``padded_unique``).

Bodies: stock, the rows gathered, ``add_(grad, alpha=-lr)`` and written back (two random passes over u rows and a
(u, D) copy), on any device; CPU (numba), one parallel pass that updates each row where it is, once (a repeat is
skipped: its zero gradient would leave the row as it is; the pads had made a chain of dependent writes to one
row). A row is written by one thread, so the bits do not depend on the thread count. torch's ``add_`` with
``alpha`` is a fused multiply-add on the CPU (``vec::fmadd``, and the scalar tail contracted alike): the body
calls LLVM's ``fma`` (one rounding), so it gives the stock formula's bits (a multiply and an add rounded apart
differ in ~9 % of the elements: the test would see it). On a CPU without FMA instructions LLVM's ``fma`` is still
exact (a library call) while torch's tail may not be; ``tests/kernels/test_ops.py`` checks the bits there.
Measured on the 2-core Xeon VM (2026-12-07), a batch of 2,048 Kaggle samples (53,248 ids, ~16 k distinct rows,
of the 33.8 M-row tables): the pass 0.75 ms on one thread with the pads, 0.50 ms on two; the trainer's step
3.6 % faster than with the gather and write-back, then 2.2 % more with the threads and the pads skipped
(``docs/results/2026-12-07-tables-step.md``).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange, types
from numba.extending import intrinsic
from torch import Tensor

from haloflow.host.threads import follow_torch_threads
from haloflow.kernels._registry import call, declare, rows2d

__all__ = ["sgd_update"]


def stock(weight: Tensor, index: Tensor, grad: Tensor, lr: float) -> None:
    rows = weight.index_select(0, index)  # (u, D)
    rows.add_(grad, alpha=-lr)
    weight.index_copy_(0, index, rows)


@intrinsic
def _fma32(typingctx, a, b, c):  # pragma: no cover - compiled
    """a * b + c rounded once (LLVM's ``llvm.fma.f32``)."""
    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(cache=True)
def _in_range(index, n):  # pragma: no cover - compiled
    for k in range(index.shape[0]):
        if index[k] < 0 or index[k] >= n:
            return False
    return True


_CHUNK = 256  # rows a parallel task takes


@njit(parallel=True, cache=True)
def _update(weight, index, grad, alpha):  # pragma: no cover - compiled
    n = index.shape[0]
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        for k in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            r = index[k]
            if k > 0 and index[k - 1] == r:  # a repeat (the pads): its gradient is zero, the row is done
                continue
            for d in range(weight.shape[1]):
                weight[r, d] = _fma32(grad[k, d], alpha, weight[r, d])


def _compiled_takes(weight: Tensor, index: Tensor, grad: Tensor) -> bool:
    """float32 rows, contiguous and without a graph, ids of an integer type in range, shapes that agree."""
    return (weight.dtype == grad.dtype == torch.float32 and weight.dim() == grad.dim() == 2 and index.dim() == 1
            and grad.shape == (index.shape[0], weight.shape[1]) and weight.is_contiguous()
            and not (weight.requires_grad or grad.requires_grad) and index.dtype in (torch.int32, torch.int64)
            and _in_range(index.numpy(), weight.shape[0]))


def cpu(weight: Tensor, index: Tensor, grad: Tensor, lr: float) -> None:
    if not _compiled_takes(weight, index, grad):
        return stock(weight, index, grad, lr)  # its errors, its values
    follow_torch_threads()
    _update(rows2d(weight), index.numpy(), rows2d(grad.contiguous()), np.float32(-lr))


OP = declare("sgd_update", stock, cpu, lambda *args: None, mutates_args=("weight",),
             doc="SGD on a batch's distinct rows, in place")


def sgd_update(weight: Tensor, index: Tensor, grad: Tensor, lr: float) -> None:
    """``weight[index[k]] += -lr * grad[k]`` in place (module docstring). Shapes: weight (N, D), index (u,),
    grad (u, D)."""
    call(OP, weight, index, grad, lr)
