"""Interfaces of the embedding cache: where rows live (`RowStore`), how they learn (`RowOptimizer`), which stay hot
(`CachePolicy`), and what a cache counts (`CacheStats`).

A table of ``N`` rows of width ``D`` and its optimizer state, row by row::

    row id   weight (N, D)        state, one entry per row (shapes depend on the optimizer)
      0      [w00 w01 .. w0D-1]   SGD: none   Adagrad: sum (N, D)   row-wise Adagrad: sum (N,)
      1      [w10 w11 .. w1D-1]
      ..
     N-1     [ ...            ]

A store keeps a row and its state together wherever the row is (device slot, host memory, file), so the
optimizer update of a row is the same arithmetic wherever it happens: this is what makes a cached table train
exactly like an uncached one.

One training step through a store (the TorchRec "fused optimizer" style: the store owns the optimizer)::

    uniq, inverse = unique(ids)               # (u,), (nnz,)
    rows = store.gather(uniq)                 # (u, D) on the compute device
    ... forward on rows[inverse], backward -> grad (u, D)
    store.apply_gradients(uniq, grad)         # updates weight and optimizer state of those u rows
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

__all__ = ["RowStore", "RowOptimizer", "CachePolicy", "CacheStats"]


@runtime_checkable
class RowStore(Protocol):
    """Where the rows of one embedding table (and their optimizer state) live.

    Implementations: `MemoryStore` (the whole table on the compute device) and `CachedStore` (hot rows in device
    slots over a `BackingStore` in host memory or a memory-mapped file).

    Shapes:
        gather: ids int64 (n,) -> rows (n, D) on ``device`` (a copy: writing to it does not change the table)
        apply_gradients: ids int64 (u,) without repeats, grads (u, D)
    """

    name: str
    num_rows: int
    dim: int
    device: torch.device

    def gather(self, ids: Tensor) -> Tensor: ...

    def apply_gradients(self, ids: Tensor, grads: Tensor) -> None: ...

    def flush(self) -> None: ...

    def state_dict(self) -> dict[str, Tensor]: ...

    def load_state_dict(self, state: dict[str, Tensor]) -> None: ...

    def close(self) -> None: ...


class RowOptimizer(abc.ABC):
    """A sparse optimizer whose state lives with the rows: ``update`` sees only the rows being updated.

    ``state_spec`` names each per-row state array, its per-row shape and its initial value; a store allocates
    ``(N, *shape)`` of each beside the weights. A store calls ``apply_rows``, which by default gathers the rows,
    ``update``s the copies in place and writes them back.
    """

    name: str

    @abc.abstractmethod
    def state_spec(self, dim: int) -> dict[str, tuple[tuple[int, ...], float]]:
        """``{state name: (per-row shape, initial value)}``; empty for SGD."""

    @abc.abstractmethod
    def update(self, weight: Tensor, state: dict[str, Tensor], grad: Tensor) -> None:
        """Update ``weight`` (u, D) and ``state`` (u, ...) in place from ``grad`` (u, D) of u distinct rows."""

    @abc.abstractmethod
    def config(self) -> dict:
        """Plain values that rebuild this optimizer with `haloflow.cache.optim.make_optimizer`."""

    def apply_rows(self, arrays: dict[str, Tensor], index: Tensor, grad: Tensor) -> None:
        """Update rows ``index`` (u,) of ``arrays`` (``weight`` (N, D) and the state) with ``grad`` (u, D).

        Here: gathers the u rows of every array to ``grad``'s device, ``update``s them there and writes them back
        (two passes over u rows of each array); an optimizer with a way to update rows where they are overrides
        it (SGD). ``index`` must not repeat (a repeated row would be written twice, the last wins), but for
        repeats whose gradient is zero, next to each other (a padded batch's pad row).
        """
        dev = grad.device
        idx = index.to(arrays["weight"].device)
        rows = {k: a.index_select(0, idx).to(dev) for k, a in arrays.items()}  # (u, ...) copies
        weight = rows.pop("weight")
        self.update(weight, rows, grad)
        rows["weight"] = weight
        for k, a in arrays.items():
            a.index_copy_(0, idx, rows[k].to(a.device))


class CachePolicy(abc.ABC):
    """Which rows deserve a slot. One object per table; scores are per row id, higher = more worth keeping.

    The slot directory (`haloflow.cache.directory.SlotDirectory`) asks ``scores`` for the misses of a batch and for
    the cached rows that may be evicted, evicts the lowest, and calls ``record`` once per batch with the batch's
    distinct ids; a policy with a ``window`` is also told the ids of the batches to come (``upcoming``).
    ``admit_all`` False means a miss takes a slot only from a row that scores lower (otherwise it
    is served from the backing store); True is the classic policy that caches every miss.
    """

    name: str
    admit_all: bool = True
    window: int = 0  # batches ahead the policy wants announced with ``upcoming`` (0: it looks at the past only)

    @abc.abstractmethod
    def reset(self, num_rows: int) -> None:
        """Forget the history (a fresh table of ``num_rows`` rows)."""

    @abc.abstractmethod
    def record(self, ids: np.ndarray, clock: int) -> None:
        """The distinct ``ids`` (u,) were looked up by batch number ``clock`` (0, 1, 2, ...)."""

    @abc.abstractmethod
    def scores(self, ids: np.ndarray) -> np.ndarray:
        """Keep-priority of ``ids`` (k,) as a (k,) array; ties are broken by the smaller id leaving first."""

    def upcoming(self, ids: np.ndarray) -> None:
        """The ids (any order, repeats allowed) of the next batch not yet announced; batches are announced in order
        from batch 0, up to ``window`` ahead of the one being planned. Ignored unless the policy looks ahead."""

    def score_table(self) -> np.ndarray | None:
        """The (N,) int64 array that ``scores`` indexes (``scores(ids) == score_table()[ids]``) when a row's score
        is a stored number, so that the directory can plan in one compiled pass; None (default) when scores are
        computed. The directory keeps the scores of its cached rows beside their slots, so ``record(ids)`` may
        change only the entries of ``ids``."""
        return None

    def warm_start(self, num_slots: int) -> np.ndarray:
        """Row ids to load before the first batch (at most ``num_slots``); none by default."""
        return np.empty(0, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        """Host bytes of the policy's state (one int64 per row for LRU, LFU and frequency)."""
        return 0


@dataclass
class CacheStats:
    """Counters of a cache, summed over batches. A lookup is one distinct id of one batch.

    ``overflow`` counts misses served from the backing store without taking a slot (more distinct ids than
    free slots, or not admitted by the policy). Bytes count rows with their optimizer state.
    """

    lookups: int = 0
    hits: int = 0
    misses: int = 0
    admitted: int = 0
    overflow: int = 0
    evicted: int = 0
    written_back: int = 0
    bytes_to_device: int = 0
    bytes_to_host: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def __add__(self, other: CacheStats) -> CacheStats:
        return CacheStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["hit_rate"] = self.hit_rate
        return out
