"""numba's thread pool, kept in step with torch's thread count.

numba keeps a pool of its own. With its OpenMP threading layer, the first parallel kernel starts the OpenMP
runtime that torch shares, and resets the OpenMP thread count torch reads to NUMBA_NUM_THREADS (all cores):
a torchrun rank given OMP_NUM_THREADS=1 then ran torch's ops on every core (seen as 2 ranks x 2 threads on
2 cores). ``follow_torch_threads()`` starts the pool once, gives torch its count back, and caps numba's kernels
at torch's count; call it before a parallel kernel (cheap after the first call).
"""

from __future__ import annotations

import numba
import numpy as np
import torch

__all__ = ["follow_torch_threads"]

_POOL_STARTED = False


@numba.njit(parallel=True, cache=True)
def _start_pool(x):  # pragma: no cover - compiled
    for i in numba.prange(x.shape[0]):
        x[i] = 0.0


def follow_torch_threads() -> None:
    global _POOL_STARTED
    if not _POOL_STARTED:
        threads = torch.get_num_threads()
        _start_pool(np.zeros(1))
        torch.set_num_threads(threads)
        _POOL_STARTED = True
    n = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
