"""Relabel nodes so that every part owns one contiguous range of new ids (the partition book).

::

    parts       = [1, 0, 1, 0, 2]          original id -> part
    new_to_orig = [1, 3, 0, 2, 4]          part 0 | part 1 | part 2, original order kept inside a part
    orig_to_new = [2, 0, 3, 1, 4]          the inverse permutation
    bounds      = [0, 2, 4, 5]             part k owns new ids bounds[k] .. bounds[k+1]-1

Cost: one stable sort of N part ids (O(N log N)) and three int64 (N,) arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from haloflow.errors import ConfigError
from haloflow.partition.types import Assignment, PartitionBook

__all__ = ["Relabelling", "relabel"]


@dataclass(frozen=True, eq=False)
class Relabelling:
    """The partition book plus the two directions of the id permutation.

    Shapes:
        new_to_orig: int64 (N,), new_to_orig[new_id] = original id;  orig_to_new: int64 (N,), its inverse.
    """

    book: PartitionBook
    new_to_orig: np.ndarray
    orig_to_new: np.ndarray

    def __post_init__(self) -> None:
        n = self.book.num_nodes
        if self.new_to_orig.shape != (n,) or self.orig_to_new.shape != (n,):
            raise ConfigError(
                f"new_to_orig {self.new_to_orig.shape} and orig_to_new {self.orig_to_new.shape} must both be "
                f"({n},), the node count of the partition book"
            )


def relabel(assignment: Assignment) -> Relabelling:
    """Number the nodes part by part; inside a part the original order is kept."""
    parts = np.asarray(assignment.parts)
    k = assignment.num_parts
    if parts.ndim != 1:
        raise ConfigError(f"assignment.parts must be 1-D, got shape {parts.shape}")
    if parts.size and (int(parts.min()) < 0 or int(parts.max()) >= k):
        bad = int(parts.min()) if int(parts.min()) < 0 else int(parts.max())
        raise ConfigError(f"assignment.parts holds part {bad}, expected parts in [0, {k})")
    n = parts.shape[0]
    new_to_orig = np.argsort(parts, kind="stable").astype(np.int64, copy=False)  # (N,)
    orig_to_new = np.empty(n, dtype=np.int64)
    orig_to_new[new_to_orig] = np.arange(n, dtype=np.int64)
    bounds = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=k), out=bounds[1:])
    return Relabelling(book=PartitionBook(bounds=bounds), new_to_orig=new_to_orig, orig_to_new=orig_to_new)
