"""Initial rows as a pure function of (seed, table, row, column): `keyed_uniform_rows`.

Row r of table t (n rows) starts as ``U(-1/sqrt(n), 1/sqrt(n))`` (the reference DLRM's init), drawn from a
counter-based hash instead of a stream::

    table t        cols 0 .. D-1
    row 0          u(seed, t, 0, 0)   u(seed, t, 0, 1)  ...        u = splitmix64 -> 24 bits -> [0, 1)
    ...                                                            value = (2u - 1) / sqrt(n)
    rows lo..hi    a row-wise shard          |  a column-wise shard takes cols lo..hi of every row
                   (any rectangle is computed on its own, bit-identical to the same cells of the whole table)

    key of table t   k   = mix(seed * G + (t + 1) * M1)
    key of row r     k_r = mix(k ^ ((r + 1) * G))
    draw of col c    z   = mix(k_r + (c >> 1) * M2);  24 high bits (c even) or the 24 bits below the low 16 (c odd)

So a single-device table, a data-parallel replica and the shards of any plan hold identical values, and no
process ever materialises rows it does not own. A table op (``keyed_uniform``): stock, int64 torch ops (the float
part in float64, rounded once); CPU, one parallel numba pass with one hash per two values. Bit for bit the same.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from haloflow.errors import ConfigError
from haloflow.host.threads import follow_torch_threads
from haloflow.kernels._registry import Op, register
from haloflow.kernels.keyed_dropout import _signed, _torch_mix
from haloflow.utils.splitmix import GOLDEN as _GOLDEN, M1 as _M1, M2 as _M2, mix as _mix, py_mix

__all__ = ["keyed_uniform_rows"]


def stock(key: int, rows: tuple[int, int], cols: tuple[int, int], bound: float) -> torch.Tensor:
    """float32 (rows, cols) by int64 torch ops; ``key`` the table's key (uint64 bits as a Python int)."""
    (r0, r1), (c0, c1) = rows, cols
    r = torch.arange(r0, r1, dtype=torch.int64)
    c = torch.arange(c0, c1, dtype=torch.int64)
    rk = _torch_mix(_signed(key) ^ ((r + 1) * _signed(int(_GOLDEN))))  # (R,)
    z = _torch_mix(rk[:, None] + (c >> 1)[None, :] * _signed(int(_M2)))  # (R, C)
    hi = (z >> 40) & 0xFFFFFF
    mid = (z >> 16) & 0xFFFFFF
    bits = torch.where((c & 1 == 0)[None, :], hi, mid)
    u = bits.to(torch.float64) * (1.0 / 16777216.0)  # [0, 1)
    return ((2.0 * u - 1.0) * bound).to(torch.float32)


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


def cpu(key: int, rows: tuple[int, int], cols: tuple[int, int], bound: float) -> torch.Tensor:
    (r0, r1), (c0, c1) = rows, cols
    out = np.empty((r1 - r0, c1 - c0), dtype=np.float32)
    if out.size:
        follow_torch_threads()
        _fill(out, np.uint64(key), r0, c0, bound)
    return torch.from_numpy(out)


OP = register(Op("keyed_uniform", stock=stock, cpu=cpu, bitwise=frozenset({"cpu"}),
                 doc="initial embedding rows keyed by (seed, table, row, column)"))


def keyed_uniform_rows(seed: int, table: int, num_rows: int, rows: tuple[int, int], cols: tuple[int, int]
                       ) -> torch.Tensor:
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
    m = 0xFFFFFFFFFFFFFFFF
    key = py_mix((seed * int(_GOLDEN) + (table + 1) * int(_M1)) & m)
    return OP.body(torch.device("cpu"))(key, rows, cols, 1.0 / math.sqrt(num_rows))
