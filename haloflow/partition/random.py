"""The random partitioner: a seeded permutation cut into K near-equal pieces.

::

    perm = permutation(N)            (seeded)
    parts[perm[i]] = i * K // N      piece sizes are floor(N/K) or ceil(N/K)

A baseline for the edge cut (about (K-1)/K of all edges are cut) and the partition with the fewest assumptions.
"""

from __future__ import annotations

import numpy as np

__all__ = ["random_partition"]


def random_partition(num_nodes: int, num_parts: int, *, seed: int = 0) -> np.ndarray:
    """int64 (N,) part of each vertex; every part gets ``floor(N/K)`` or ``ceil(N/K)`` vertices."""
    perm = np.random.default_rng(seed).permutation(num_nodes)  # (N,)
    parts = np.empty(num_nodes, dtype=np.int64)
    parts[perm] = np.arange(num_nodes, dtype=np.int64) * num_parts // max(num_nodes, 1)
    return parts
