"""Threads: numba's kernels kept at torch's thread count, and the ranks x threads a machine's cores must hold.

One OpenMP pool serves both. torch loads libtorch_global_deps.so with RTLD_GLOBAL, which puts its
torch/lib/libgomp.so.1 in the global scope; numba's omppool asks for libgomp.so.1.0.0 (so the system's copy is
mapped too, and stays unused) but resolves ``GOMP_parallel`` in that scope first: in gdb a numba prange runs on
torch's worker thread. numba's kernels and torch's ops share one team and one wait policy (``haloflow/_openmp.py``)::

    thread count      torch.set_num_threads(n) ----+---- numba.set_num_threads(<= n) per kernel launch
                                                   |
    the one runtime   torch/lib/libgomp.so.1: main thread + (n - 1) workers, bounded spin waits

Because the runtime is shared, numba's first parallel kernel sets the OpenMP thread count to NUMBA_NUM_THREADS
(all cores): a torchrun rank given OMP_NUM_THREADS=1 then ran torch's ops on every core (seen as 2 ranks x 2
threads on 2 cores). ``follow_torch_threads()`` starts the pool once, gives torch its count back, and caps
numba's kernels at torch's count; call it before a parallel kernel (cheap after the first call).

``ThreadBudget`` is the arithmetic said at start-up: ranks on this machine x threads each against its cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numba
import numpy as np
import torch

__all__ = ["follow_torch_threads", "cores_here", "ThreadBudget"]

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


def cores_here() -> int:
    """Cores this process may run on (its affinity mask: ``taskset`` and cpusets count, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ThreadBudget:
    """``ranks`` processes on this machine, ``threads`` compute threads each, ``cores`` to run them on.

    More threads than cores is oversubscription: the ranks' OpenMP barriers then wait for threads the scheduler
    has parked, and a step can take several times as long as with fewer threads.
    """

    ranks: int
    threads: int
    cores: int

    @property
    def total(self) -> int:
        return self.ranks * self.threads

    @property
    def oversubscribed(self) -> bool:
        return self.total > self.cores

    def describe(self) -> str:
        """``"2 ranks x 1 thread = 2 threads on 2 cores"``."""
        return (f"{_count(self.ranks, 'rank')} x {_count(self.threads, 'thread')} = "
                f"{_count(self.total, 'thread')} on {_count(self.cores, 'core')}")

    def advice(self) -> str:
        """What to change when oversubscribed (empty otherwise)."""
        if not self.oversubscribed:
            return ""
        fit = max(1, self.cores // self.ranks)
        return (f"{self.ranks} x {self.threads} = {self.total} threads > {self.cores} cores: set OMP_NUM_THREADS="
                f"{fit} (cores // ranks), or start fewer ranks")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"
