"""Initial embedding rows as a pure function of (seed, table, row, column): any shard can be built alone.

Row r of table t (n rows) starts as ``U(-1/sqrt(n), 1/sqrt(n))`` (the reference DLRM's init), drawn from a
counter-based hash instead of a stream::

    table t        cols 0 .. D-1
    row 0          u(seed, t, 0, 0)   u(seed, t, 0, 1)  ...        u = splitmix64 -> 24 bits -> [0, 1)
    ...                                                            value = (2u - 1) / sqrt(n)
    rows lo..hi    a row-wise shard          |  a column-wise shard takes cols lo..hi of every row
                   (any rectangle is computed on its own, bit-identical to the same cells of the whole table)

So a single-device table, a data-parallel replica and the shards of any plan hold identical values, and no
process ever materialises rows it does not own. Cost: one hash per two values (a parallel numba pass).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from haloflow.errors import ConfigError
from haloflow.models.spmm import _sync_numba_threads
from haloflow.utils.splitmix import GOLDEN as _GOLDEN, M1 as _M1, M2 as _M2, mix as _mix, py_mix

__all__ = ["keyed_uniform_rows"]


@njit(parallel=True, cache=True)
def _fill(out, key, row_lo, col_lo, bound):  # pragma: no cover - compiled
    rows, cols = out.shape
    for i in prange(rows):
        rk = _mix(key ^ ((np.uint64(row_lo + i) + np.uint64(1)) * _GOLDEN))
        for j in range(cols):
            c = col_lo + j
            z = _mix(rk + np.uint64(c >> 1) * _M2)  # one hash serves two columns: 24 high or 24 middle bits
            bits = (z >> np.uint64(40)) if c & 1 == 0 else ((z >> np.uint64(16)) & np.uint64(0xFFFFFF))
            u = np.float64(bits) * (1.0 / 16777216.0)  # [0, 1)
            out[i, j] = np.float32((2.0 * u - 1.0) * bound)


def keyed_uniform_rows(seed: int, table: int, num_rows: int, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
    """Rows ``rows[0]..rows[1]-1``, columns ``cols[0]..cols[1]-1`` of table ``table`` (``num_rows`` rows in all).

    Shapes:
        -> float32 (rows[1] - rows[0], cols[1] - cols[0]) on the CPU.
    """
    (r0, r1), (c0, c1) = rows, cols
    if not (0 <= r0 <= r1 <= num_rows and 0 <= c0 <= c1):
        raise ConfigError(f"table {table}: rows [{r0}, {r1}) and columns [{c0}, {c1}) are not inside a table of "
                          f"{num_rows} rows")
    if seed < 0 or table < 0:
        raise ConfigError(f"seed and table must be >= 0, got {seed} and {table}")
    out = np.empty((r1 - r0, c1 - c0), dtype=np.float32)
    if out.size:
        m = 0xFFFFFFFFFFFFFFFF
        key = np.uint64(py_mix((seed * int(_GOLDEN) + (table + 1) * int(_M1)) & m))
        _sync_numba_threads()
        _fill(out, key, r0, c0, 1.0 / math.sqrt(num_rows))
    return torch.from_numpy(out)

