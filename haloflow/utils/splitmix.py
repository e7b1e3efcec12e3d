"""The splitmix64 finaliser: the one hash behind every counter-based draw in haloflow.

Dropout masks, initial embedding rows and negative samples are pure functions of keys (seed, epoch, global id,
...), each built from ``mix``: a draw never depends on how the work is split over processes. ``mix`` runs inside
numba kernels (on uint64 scalars, wrapping mod 2^64); ``py_mix`` is the same function on Python ints.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["GOLDEN", "M1", "M2", "mix", "py_mix"]

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
_MASK = 0xFFFFFFFFFFFFFFFF


@njit(inline="always", cache=True)
def mix(z):  # pragma: no cover - compiled
    z = (z ^ (z >> np.uint64(30))) * M1
    z = (z ^ (z >> np.uint64(27))) * M2
    return z ^ (z >> np.uint64(31))


def py_mix(z: int) -> int:
    """``mix`` on a Python int in [0, 2^64)."""
    z = ((z ^ (z >> 30)) * int(M1)) & _MASK
    z = ((z ^ (z >> 27)) * int(M2)) & _MASK
    return z ^ (z >> 31)
