"""A cache's rows read from and written to where they are: ``haloflow::cache_gather`` and ``haloflow::cache_scatter``
(``cache/batched_cache.py``, after ``haloflow::cache_plan`` decided each row's slot).

``slots`` (S + 1, ...) are the device's rows, ``backing`` (R + 1, ...) every row (host memory); slot S and row R
are the pads. For a batch's distinct rows ``uniq`` (u,) padded with R, their slots ``slot`` (S: none)::

    gather   out[i] = slots[slot[i]]  if fresh[i]  else  backing[uniq[i]]       (u, ...)
             fresh[i] = hit[i] and not pending[slot[i]]
    scatter  for each array: slots[slot[i]] = values[i];  backing[uniq[i] if not cached[i] else R] = values[i]
             then dirty[slot[i]] = True, pending[slot[i]] = False  (the slots now hold their rows' update)

``fresh``: the slot holds the row's values (a hit whose slot is not ``pending``, waiting for its first write; the
gather works it out, so that a lookup spends no ops of its own on it); ``cached``: the row's update goes to its slot
(a hit or an admission), the others' to the backing rows. The stock formula gathers (or
writes) both places for every row and picks with ``where`` (padded: every shape fixed by u); the CPU body
(numba) touches each row once, where it is, and leaves the pads alone. The real rows and slots hold the same
bits after either (the pads hold whatever the padded writes left, which nothing reads).

The stock gather reads every row twice (its slot and its backing row) and picks with ``where``, the stock scatter
writes every row twice (one of the places a pad); the CPU body reads and writes each row once. A step gathers the
weight at its lookup and every optimizer state at its update, and scatters them all at the update.
"""

from __future__ import annotations

import torch
from numba import njit
from torch import Tensor

from haloflow.kernels._registry import call, declare, rows2d

__all__ = ["cache_gather", "cache_scatter"]


def _column(mask: Tensor, like: Tensor) -> Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))


def gather_stock(slots: Tensor, backing: Tensor, slot: Tensor, uniq: Tensor, hit: Tensor, pending: Tensor) -> Tensor:
    R = backing.shape[0] - 1
    fresh = hit & ~pending.index_select(0, slot)
    here = slots.index_select(0, slot)  # (u, ...) the pad slot for the rows not there
    there = backing.index_select(0, torch.where(fresh, R, uniq).to(backing.device)).to(slots.device)
    return torch.where(_column(fresh, here), here, there)


def scatter_stock(slots: list[Tensor], backing: list[Tensor], values: list[Tensor], slot: Tensor, uniq: Tensor,
                  cached: Tensor, dirty: Tensor, pending: Tensor) -> None:
    for s, b, v in zip(slots, backing, values):
        R = b.shape[0] - 1
        s.index_copy_(0, slot, v)  # the rows that are not cached write the pad slot
        b.index_copy_(0, torch.where(cached, R, uniq).to(b.device), v.to(b.device))
    dirty.index_fill_(0, slot, True)
    pending.index_fill_(0, slot, False)


@njit(cache=True)
def _gather(slots, backing, slot, uniq, hit, pending, out):  # pragma: no cover - compiled
    D = out.shape[1]
    for i in range(uniq.shape[0]):
        if hit[i] and not pending[slot[i]]:
            r = slot[i]
            for d in range(D):
                out[i, d] = slots[r, d]
        else:
            r = uniq[i]
            for d in range(D):
                out[i, d] = backing[r, d]


@njit(cache=True)
def _mark(slot, dirty, pending):  # pragma: no cover - compiled
    for i in range(slot.shape[0]):
        dirty[slot[i]] = True
        pending[slot[i]] = False


@njit(cache=True)
def _scatter(slots, backing, values, slot, uniq, cached):  # pragma: no cover - compiled
    R = backing.shape[0] - 1
    D = values.shape[1]
    for i in range(uniq.shape[0]):
        if cached[i]:
            dst, r = slots, slot[i]
        elif uniq[i] < R:
            dst, r = backing, uniq[i]
        else:
            continue
        for d in range(D):
            dst[r, d] = values[i, d]


def gather_cpu(slots: Tensor, backing: Tensor, slot: Tensor, uniq: Tensor, hit: Tensor, pending: Tensor) -> Tensor:
    out = torch.empty((uniq.shape[0], *slots.shape[1:]), dtype=slots.dtype)
    _gather(rows2d(slots), rows2d(backing), slot.numpy(), uniq.numpy(), hit.numpy(), pending.numpy(), rows2d(out))
    return out


def scatter_cpu(slots: list[Tensor], backing: list[Tensor], values: list[Tensor], slot: Tensor, uniq: Tensor,
                cached: Tensor, dirty: Tensor, pending: Tensor) -> None:
    slot_, uniq_, cached_ = slot.numpy(), uniq.numpy(), cached.numpy()
    for s, b, v in zip(slots, backing, values):
        _scatter(rows2d(s), rows2d(b), rows2d(v.contiguous()), slot_, uniq_, cached_)
    _mark(slot_, dirty.numpy(), pending.numpy())


GATHER = declare("cache_gather", gather_stock, gather_cpu,
                 lambda slots, backing, slot, uniq, hit, pending: slots.new_empty((uniq.shape[0], *slots.shape[1:])),
                 doc="a batch's rows read from their slot or from the backing rows")
SCATTER = declare("cache_scatter", scatter_stock, scatter_cpu, lambda *args: None,
                  mutates_args=("slots", "backing", "dirty", "pending"),
                  doc="a batch's updated rows written to their slot or to the backing rows, the slots marked")


def cache_gather(slots: Tensor, backing: Tensor, slot: Tensor, uniq: Tensor, hit: Tensor, pending: Tensor) -> Tensor:
    """(u, ...) each row from its slot where it is a ``hit`` whose slot is not ``pending``, else from the backing
    rows (module docstring)."""
    return call(GATHER, slots, backing, slot, uniq, hit, pending)


def cache_scatter(slots: list[Tensor], backing: list[Tensor], values: list[Tensor], slot: Tensor, uniq: Tensor,
                  cached: Tensor, dirty: Tensor, pending: Tensor) -> None:
    """Write each array's ``values`` (u, ...) to each row's slot where ``cached``, else to its backing row; then
    mark the batch's slots ``dirty`` and no longer ``pending`` (module docstring)."""
    call(SCATTER, slots, backing, values, slot, uniq, cached, dirty, pending)
