"""Each distinct row's gradient from its bags' gradients, occurrence by occurrence: ``haloflow::bag_row_grads``
(the backward of ``cache/batched.py``'s pooled lookups, for all tables at once).

::

    grad (n, D)       the bags' gradients
    inverse (nnz,)    the row (among the batch's distinct rows) of every occurrence, bag by bag
    lengths (n,)      occurrences per bag
    out (u, D)        out[inverse[p]] += grad[bag of p], p = 0, 1, ... in order

The order of the additions is the occurrences' order, whatever else the batch holds, so a row's gradient has
the same bits beside other tables or on another rank (``embedding_bag``'s own backward sorts the whole index
array, unstably).

Bodies (the same additions in the same order, bit for bit):

- stock: ``repeat_interleave`` (each occurrence's bag), ``index_select`` of the bags' gradients, one
  ``index_add_`` (CPU: one occurrence at a time, in order);
- CPU: numba, no (nnz, D) copy: the rows split between torch's threads, each thread walking every occurrence in
  order and adding those of its rows (a row's additions on one thread, in order: the bits do not depend on the
  thread count). Measured on the 2-core AMD EPYC VM (2026-12-07, float32, D = 16): the op alone on 26 x 2,048
  bags of 0-2 random ids each, 5.1 -> 0.77 ms (one thread); the backward of the trainer's tables on Kaggle's
  generated batches of 2,048, which is mostly this op, 4.5 -> 1.0 ms. On the 2-core Xeon VM (same day), the
  pass on two threads 0.77 -> 0.66 ms, with the range check a pass of its own.
"""

from __future__ import annotations

import torch
from numba import njit, prange
from torch import Tensor

from haloflow.host.threads import follow_torch_threads
from haloflow.kernels._registry import call, declare

__all__ = ["bag_row_grads"]


def stock(grad: Tensor, inverse: Tensor, lengths: Tensor, num_rows: int) -> Tensor:
    bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=grad.device), lengths,
                                  output_size=inverse.numel())  # (nnz,) the bag of every occurrence
    rows = torch.zeros(num_rows, grad.shape[1], dtype=grad.dtype, device=grad.device)
    return rows.index_add_(0, inverse, grad.index_select(0, bag))  # one occurrence at a time


@njit(cache=True)
def _valid(inverse, lengths, num_rows):  # pragma: no cover - compiled
    total = 0
    for j in range(lengths.shape[0]):
        if lengths[j] < 0:
            return False
        total += lengths[j]
    if total != inverse.shape[0]:
        return False
    for p in range(inverse.shape[0]):
        if inverse[p] < 0 or inverse[p] >= num_rows:
            return False
    return True


@njit(parallel=True, cache=True)
def _accumulate(grad, inverse, lengths, out, parts):  # pragma: no cover - compiled
    # part t owns rows [t R / parts, (t + 1) R / parts) and walks every occurrence in order, adding those of its
    # rows: each row's additions run in the occurrences' order, on one thread, whatever the thread count
    D, R = grad.shape[1], out.shape[0]
    for t in prange(parts):
        lo, hi = t * R // parts, (t + 1) * R // parts
        for r in range(lo, hi):
            for d in range(D):
                out[r, d] = 0.0
        p = 0
        for j in range(lengths.shape[0]):
            for _ in range(lengths[j]):
                r = inverse[p]
                if lo <= r < hi:
                    for d in range(D):
                        out[r, d] += grad[j, d]
                p += 1


def cpu(grad: Tensor, inverse: Tensor, lengths: Tensor, num_rows: int) -> Tensor:
    if grad.requires_grad or grad.shape[0] != lengths.shape[0]:  # a graph wanted (double backward), or a
        # mismatch the stock formula reports
        return stock(grad, inverse, lengths, num_rows)
    inv, lens = inverse.numpy(), lengths.numpy()
    if not _valid(inv, lens, num_rows):
        return stock(grad, inverse, lengths, num_rows)  # lengths or a row out of range: the stock formula's error
    out = torch.empty(num_rows, grad.shape[1], dtype=grad.dtype)
    follow_torch_threads()
    _accumulate(grad.contiguous().numpy(), inv, lens, out.numpy(), torch.get_num_threads())
    return out


OP = declare("bag_row_grads", stock, cpu,
             lambda grad, inverse, lengths, num_rows: grad.new_empty((num_rows, grad.shape[1])),
             doc="each distinct row's gradient, its bags' gradients added occurrence by occurrence")


def bag_row_grads(grad: Tensor, inverse: Tensor, lengths: Tensor, num_rows: int) -> Tensor:
    """(num_rows, D): each row's gradient, its occurrences' bag gradients added in order (module docstring)."""
    return call(OP, grad, inverse, lengths, num_rows)
