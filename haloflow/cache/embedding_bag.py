"""``CachedEmbeddingBag``: a sum-pooled embedding bag over any `RowStore`, with the optimizer fused into the store.

::

    ids      [7, 2, 7, 9, 2]    offsets [0, 2, 5)   (bags: [7, 2], [7, 9, 2])
    uniq     [2, 7, 9]          inverse [1, 0, 1, 2, 0]
    rows   = store.gather(uniq)            (u, D) leaf tensor, requires grad
    pooled = embedding_bag(inverse, rows, offsets, mode="sum")       (B, D)
    loss.backward()                        rows.grad (u, D): each row's gradient summed over its occurrences
    step() -> store.apply_gradients(uniq, rows.grad)

The table is not a parameter of the module (a ``torch.optim`` optimizer never sees it); ``step()`` after
``backward()`` updates the rows in the store (TorchRec's "fused optimizer" style). Summing the gradient of a
row over its occurrences here gives the same floats as ``nn.EmbeddingBag(sparse=True)``'s gradient coalesced.

Shapes:
    ids int64 (nnz,), offsets int64 (B,) bag starts (or (B+1,) with ``include_last_offset``) -> (B, D)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from haloflow.cache.batched import pooled_sum
from haloflow.cache.types import RowStore

__all__ = ["CachedEmbeddingBag"]


class CachedEmbeddingBag(nn.Module):
    """Sum pooling of the rows of ``store``, like ``nn.EmbeddingBag(mode="sum")`` with offsets.

    Args:
        store: where the rows live (`MemoryStore`, `CachedStore`, ...).
        include_last_offset: offsets are (B+1,) with the end of the last bag (as ``JaggedBatch.bag_offsets``).
        per_occurrence: ``take_gradients`` gives one gradient row per looked-up id (nnz,), not one per distinct
            row: for a caller that sums them with other processes' rows in one fixed order (a data-parallel
            replica at any K: a rank's own sum per row, then the ranks', would add in an order that depends on K).
    """

    def __init__(self, store: RowStore, *, include_last_offset: bool = False, per_occurrence: bool = False):
        super().__init__()
        self.store, self.include_last_offset = store, include_last_offset
        self.per_occurrence = per_occurrence
        self._pending: list[tuple[Tensor, Tensor]] = []  # (uniq, rows) of forwards not yet stepped
        self._prefetched: tuple[Tensor, Tensor, Tensor] | None = None  # (ids, uniq, inverse) of the last prefetch

    def forward(self, ids: Tensor, offsets: Tensor) -> Tensor:
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0] is ids:  # the batch prefetched: its unique is done already
            uniq, inverse = prefetched[1:]
        else:
            uniq, inverse = torch.unique(ids, return_inverse=True)  # (u,), (nnz,)
        train = self.training and torch.is_grad_enabled()  # an evaluation under no_grad leaves nothing pending
        if train and self.per_occurrence:
            # one leaf row per occurrence (nnz, D): the same pooled sums (the same rows, in the same bag order),
            # and each occurrence's gradient kept apart
            occ = self.store.gather(uniq).detach().index_select(0, inverse.to(self.store.device)).requires_grad_()
            self._pending.append((ids, occ))
            dev = occ.device
            return pooled_sum(occ, torch.arange(ids.numel(), device=dev), self._full(offsets, ids.numel(), dev))
        rows = self.store.gather(uniq).detach().requires_grad_(train)  # (u, D) leaf
        if train:
            self._pending.append((uniq, rows))
        dev = rows.device
        return pooled_sum(rows, inverse.to(dev), self._full(offsets, ids.numel(), dev))  # (B, D)

    def _full(self, offsets: Tensor, nnz: int, dev) -> Tensor:
        """(B+1,) bag bounds: ``offsets`` as given with ``include_last_offset``, else with nnz appended."""
        offsets = offsets.to(dev)
        if self.include_last_offset:
            return offsets
        return torch.cat([offsets, torch.tensor([nnz], dtype=offsets.dtype, device=dev)])

    def prefetch(self, ids: Tensor) -> None:
        """Start loading the next batch's rows (when the store can; a no-op for a `MemoryStore`)."""
        fetch = getattr(self.store, "prefetch", None)
        if fetch is not None:
            uniq, inverse = torch.unique(ids, return_inverse=True)  # kept for the forward of the same tensor
            self._prefetched = ids, uniq, inverse
            fetch(uniq)

    def upcoming(self, ids: Tensor) -> None:
        """Announce a batch to come to a store whose policy looks ahead (``CachedStore.upcoming``); else a no-op."""
        announce = getattr(self.store, "upcoming", None)
        if announce is not None:
            announce(ids)

    def step(self) -> None:
        """Hand each pending forward's ``rows.grad`` to ``store.apply_gradients``; rows without a gradient skip."""
        for uniq, grad in self.take_gradients():
            self.store.apply_gradients(uniq, grad)

    def take_gradients(self) -> list[tuple[Tensor, Tensor]]:
        """``(ids (u,), grads (u, D))`` of every forward since the last ``step`` (``per_occurrence``: ids (nnz,),
        one row per occurrence, ids repeating), forgotten here: for a caller that
        combines them first (a data-parallel replica sums them over ranks) and then calls
        ``store.apply_gradients`` itself. Forwards whose rows got no gradient are left out."""
        pending, self._pending = self._pending, []
        return [(uniq, rows.grad) for uniq, rows in pending if rows.grad is not None]

    def extra_repr(self) -> str:
        s = self.store
        return f"{getattr(s, 'name', '?')}: {s.num_rows} x {s.dim}, store={type(s).__name__}"
