"""Value types shared by the partitioners, the halo builder, the on-disk format and the engine.

Partition book (after relabelling, each part owns one contiguous range of *new* global ids)::

    bounds = [0, n_0, n_0+n_1, ..., N]            part k owns new ids bounds[k] .. bounds[k+1]-1
    owner(gid) = searchsorted(bounds, gid, side="right") - 1
    new_to_orig[new_id] = original id;  orig_to_new[orig_id] = new id

One part (rank r), local ids::

    0 .. n_inner-1                  inner nodes: new global ids bounds[r] .. bounds[r+1]-1, in order
    n_inner .. n_inner+n_halo-1     halo copies of remote in-neighbours, grouped by owner (ascending),
                                    sorted by new global id inside a group
                                      halo_offsets (K+1,): group of owner p = halo[halo_offsets[p]:halo_offsets[p+1]]
                                      (the group of r itself is empty)

    local CSR: rows = inner nodes, columns index [inner | halo]
        indptr (n_inner+1,), indices (nnz,) sorted inside each row
        every in-edge of an inner node is stored in exactly this part (edges belong to their destination's part)

    send lists: send_ids[send_offsets[p]:send_offsets[p+1]] = local inner ids that part p holds as halo,
                sorted (so they line up with p's halo group for r, which is sorted by global id)

    degrees: in_degree / out_degree (n_inner+n_halo,) are degrees in the *whole* graph, because
             normalisation must use global degrees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from haloflow.errors import ConfigError

__all__ = ["PartitionBook", "Assignment", "GraphPart"]


@dataclass(frozen=True, eq=False)
class PartitionBook:
    """Contiguous id ranges, one per part. ``bounds`` is int64 (K+1,), non-decreasing, from 0 to N."""

    bounds: np.ndarray

    def __post_init__(self) -> None:
        b = self.bounds
        if b.ndim != 1 or b.size < 2 or b[0] != 0 or np.any(np.diff(b) < 0):
            raise ConfigError(f"partition bounds must be non-decreasing from 0 with >= 2 entries, got {b!r}")

    @property
    def num_parts(self) -> int:
        return int(self.bounds.size - 1)

    @property
    def num_nodes(self) -> int:
        return int(self.bounds[-1])

    def owner(self, gids: np.ndarray) -> np.ndarray:
        """Part that owns each new global id: one ``searchsorted`` (O(log K) per id)."""
        return np.searchsorted(self.bounds, gids, side="right") - 1

    def part_range(self, k: int) -> tuple[int, int]:
        return int(self.bounds[k]), int(self.bounds[k + 1])

    def part_sizes(self) -> np.ndarray:
        return np.diff(self.bounds)


@dataclass(frozen=True, eq=False)
class Assignment:
    """What a partitioning method returns: ``parts[v]`` in ``[0, K)`` for every original node v."""

    parts: np.ndarray  # int64 (N,)
    num_parts: int
    method: str
    seed: int = 0


@dataclass(eq=False)
class GraphPart:
    """Everything rank ``part_id`` needs to train on its share of the graph (see the module docstring).

    Node data (``features``, ``labels``, masks) cover the inner nodes only, in local order.
    """

    part_id: int
    book: PartitionBook
    n_inner: int
    n_halo: int
    indptr: np.ndarray  # int64 (n_inner+1,)
    indices: np.ndarray  # int64 (nnz,) local column ids in [0, n_inner+n_halo)
    halo_gids: np.ndarray  # int64 (n_halo,) new global ids of the halo nodes
    halo_offsets: np.ndarray  # int64 (K+1,)
    send_ids: np.ndarray  # int64 (sum send,) local inner ids, grouped by destination part
    send_offsets: np.ndarray  # int64 (K+1,)
    in_degree: np.ndarray  # int64 (n_inner+n_halo,) global in-degree
    out_degree: np.ndarray  # int64 (n_inner+n_halo,) global out-degree
    orig_ids: np.ndarray  # int64 (n_inner,) original id of each inner node
    features: np.ndarray | None = None  # float32 (n_inner, F)
    labels: np.ndarray | None = None  # int64 (n_inner,)
    train_mask: np.ndarray | None = None  # bool (n_inner,)
    val_mask: np.ndarray | None = None
    test_mask: np.ndarray | None = None
    num_classes: int = 0

    @property
    def num_parts(self) -> int:
        return self.book.num_parts

    @property
    def num_local(self) -> int:
        return self.n_inner + self.n_halo

    @property
    def inner_gids(self) -> np.ndarray:
        lo, hi = self.book.part_range(self.part_id)
        return np.arange(lo, hi, dtype=np.int64)

    def send_counts(self) -> np.ndarray:
        return np.diff(self.send_offsets)

    def recv_counts(self) -> np.ndarray:
        return np.diff(self.halo_offsets)
