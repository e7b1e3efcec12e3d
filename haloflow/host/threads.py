"""Threads: numba's kernels kept at torch's thread count, and the ranks x threads a machine's cores must hold.

One OpenMP pool serves both. torch loads libtorch_global_deps.so with RTLD_GLOBAL, which puts its
torch/lib/libgomp.so.1 in the global scope; numba's omppool asks for libgomp.so.1.0.0 (so the system's copy is
mapped too, and stays unused) but resolves ``GOMP_parallel`` in that scope first: in gdb a numba prange runs on
torch's worker thread. numba's kernels and torch's ops share one team and one wait policy (``haloflow/host/openmp.py``)::

    thread count      torch.set_num_threads(n) ----+---- numba.set_num_threads(<= n) per kernel launch
                                                   |
    the one runtime   torch/lib/libgomp.so.1: main thread + (n - 1) workers, bounded spin waits

Because the runtime is shared, numba's first parallel kernel sets the OpenMP thread count to NUMBA_NUM_THREADS
(all cores): a torchrun rank given OMP_NUM_THREADS=1 then ran torch's ops on every core (seen as 2 ranks x 2
threads on 2 cores). ``follow_torch_threads()`` starts the pool once, gives torch its count back, and caps
numba's kernels at torch's count; call it before a parallel kernel (cheap after the first call).

``ThreadBudget`` (``cores.py``) is the arithmetic said at start-up: ranks on this machine x threads each against
its cores.
``ThreadGovernor`` (on by default; ``--fixed-threads`` turns it off) lowers the thread count while other processes
keep the cores busy. ``reproducible_blas()`` makes that change nothing but the time: MKL then sums a product's
inner dimension in the same order at any thread count (by default it splits a long inner dimension, such as a
weight gradient's batch, across the threads, and rounds by how many there were).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from collections.abc import Callable

import numba
import numpy as np
import torch

from haloflow.utils.cores import ThreadBudget, cores_here

__all__ = ["follow_torch_threads", "reproducible_blas", "warm_vector_math", "cores_here", "ThreadBudget",
           "ThreadGovernor", "BusyMeter", "fitting_threads", "read_cpu_ticks"]

_POOL_STARTED = False
_FOLLOWED: dict[int, int] = {}  # thread id -> torch's count numba was last set to there (numba's count is per thread)


@numba.njit(parallel=True, cache=True)
def _start_pool(x):  # pragma: no cover - compiled
    for i in numba.prange(x.shape[0]):
        x[i] = 0.0


def follow_torch_threads() -> None:
    global _POOL_STARTED
    threads = torch.get_num_threads()
    me = threading.get_ident()
    if _FOLLOWED.get(me) == threads:  # the common case, ~1 us (numba.get_num_threads alone took ~40 us a call)
        return
    if not _POOL_STARTED:
        _start_pool(np.zeros(1))
        torch.set_num_threads(threads)
        _POOL_STARTED = True
    n = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
    _FOLLOWED[me] = threads


_CBWR_AUTO, _CBWR_STRICT = 2, 0x10000  # mkl_service.h: MKL_CBWR_AUTO, MKL_CBWR_STRICT
_BLAS_REPRODUCIBLE: bool | None = None


def reproducible_blas() -> bool:
    """Put MKL in its strict reproducible mode (``MKL_CBWR=AUTO,STRICT``; a branch already chosen in ``MKL_CBWR`` is
    kept); True when matrix-matrix products now round the same at any thread count. Matrix-vector products are
    not covered (a (100 x 200) @ (200,) still differed at 1 and 2 threads): the models write those as row sums.

    MKL takes the mode only before its first call in the process: ``Runtime.start`` asks at once (unless the run
    keeps its threads fixed, ``--fixed-threads``: then its rounding cannot move and MKL keeps its fastest split),
    and in a process whose products ran earlier (or without MKL: another BLAS, a GPU-only build) this is False
    and the training loop keeps its thread count fixed. The mode costs where a product's output is small and its
    inner dimension long, the shape MKL splits the inner dimension of: a (512 x 2048) @ (2048 x 13) product took
    2.8x as long (0.18 -> 0.49 ms); 2 threads, the contention bench's steps, 7 rounds: GCN at 20,000 nodes 1.11x
    the time, at 200,000 nodes 1.03x; TGN 1.02x; DLRM 1.02x (2026-12-05, 2-core Xeon).
    """
    global _BLAS_REPRODUCIBLE
    if _BLAS_REPRODUCIBLE is None:
        _BLAS_REPRODUCIBLE = _set_strict_mkl()
        warm_vector_math()  # after the mode: a vector math call is an MKL call
    return _BLAS_REPRODUCIBLE


# torch's float unary ops whose CPU kernels call MKL's vector math (VML): their bits change with
# MKL_ENABLE_INSTRUCTIONS (sqrt, exp, log, log2, log10, tan, asin, acos, atan, tanh, erf, erfc, erfinv on the
# 2-core Xeon VM, torch 2.13.0); the rest of the family is warmed too, at no cost
_VECTOR_MATH = ("sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin",
                "acos", "atan", "sinh", "cosh", "tanh", "erf", "erfc", "erfinv")
_VECTOR_MATH_WARM = False


def warm_vector_math() -> None:
    """Call each of torch's unary ops that MKL's vector math computes once, here, on 8 elements (float32 and
    float64; below torch's grain, so on this thread alone). Idempotent.

    Why: MKL picks a vector math function's code path at its first call. When that first call comes from two
    threads at once (a parallel op's two chunks, the first ``sqrt`` of a process at 2 threads), one of them can run
    another path: the first DLRM step's Adagrad ``sqrt`` came out up to 3.2e-4 off (relative) in the first half of
    the batch's rows, in 1 process of 25-55 on 2 loaded cores with ``GOMP_SPINCOUNT=10000`` (2026-12-08;
    ``bench cache``'s rare ``weights = uncached: False``: its first contestant's first update). Called once before
    any parallel op, every later call takes the path the first one chose."""
    global _VECTOR_MATH_WARM
    if _VECTOR_MATH_WARM:
        return
    for dtype in (torch.float32, torch.float64):
        x = torch.full((8,), 0.5, dtype=dtype)
        for name in _VECTOR_MATH:
            getattr(torch, name)(x)
    _VECTOR_MATH_WARM = True


def _set_strict_mkl() -> bool:
    if not torch.backends.mkl.is_available():
        return False
    try:  # torch links MKL into libtorch_cpu and exports its service functions
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get, set_ = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
    except (OSError, AttributeError):
        return False
    now = get(-1)  # MKL_CBWR_ALL: the whole setting; 1 (BRANCH_OFF) while nothing was chosen
    if now & _CBWR_STRICT:
        return True
    branch = now & 0xFFFF
    return set_((branch if branch > 1 else _CBWR_AUTO) | _CBWR_STRICT) == 0  # nonzero: MKL already ran


def read_cpu_ticks(cpus: frozenset[int]) -> tuple[int, int]:
    """(busy clock ticks of ``cpus`` from /proc/stat, this process's own user + system ticks): both cumulative."""
    busy = 0
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit() and int(line.split()[0][3:]) in cpus:
                t = [int(x) for x in line.split()[1:9]]  # user nice system idle iowait irq softirq steal
                busy += sum(t) - t[3] - t[4]
    with open("/proc/self/stat") as f:
        mine = f.read().rsplit(")", 1)[1].split()
    return busy, int(mine[11]) + int(mine[12])


class ThreadGovernor:
    """Fewer compute threads while other processes keep this process's cores busy; back up when they leave.

    A thread that the scheduler parks stalls every parallel region until it runs again, so beside two busy
    co-tenants 2 fixed threads took 1.5-2.2x as long a step as 1 (GCN, DLRM, TGN; plain PyTorch 1.1-2.1x)::

        at most every every_s (0.1 s), at a unit boundary:
            others = (busy ticks of my cores - my own ticks) / elapsed ticks          in cores
            want   = floor(cores - others + 0.25), within [1, limit]
        two readings in a row want the same n != now:  torch.set_num_threads(n), numba follows

    The thread count then depends on the machine's other work; the runtime starts a governor only where the
    numbers cannot depend on it (``reproducible_blas()``, and ops that are cut the same way at any count: see
    ``models/tgn._tail_free``). ``read`` and ``clock`` are injectable for tests.
    """

    def __init__(self, limit: int, *, cpus: frozenset[int] | None = None, every_s: float = 0.1,
                 read: Callable[[frozenset[int]], tuple[int, int]] = read_cpu_ticks,
                 clock: Callable[[], float] = time.monotonic, hz: int | None = None):
        self.limit, self.threads, self.every_s = limit, limit, every_s
        self.meter = BusyMeter(cpus=cpus, read=read, clock=clock, hz=hz)
        self.cpus = self.meter.cpus
        self.others: float | None = None  # cores busy with other processes over the last interval
        self._pending: int | None = None

    def tick(self) -> int | None:
        """Look again if ``every_s`` has passed; returns the new thread count when it changed, else None."""
        if self.meter.elapsed() < self.every_s:
            return None
        self.others = self.meter.others()
        want = min(self.limit, fitting_threads(len(self.cpus), self.others))
        self.threads = torch.get_num_threads()  # what torch runs now, whoever set it
        if want == self.threads:
            self._pending = None
            return None
        if self._pending != want:  # one reading could be a burst: wait for a second
            self._pending = want
            return None
        self._pending, self.threads = None, want
        torch.set_num_threads(want)
        follow_torch_threads()
        return want


def fitting_threads(cores: int, others: float) -> int:
    """Threads that fit beside ``others`` cores busy with other processes: ``floor(cores - others + 0.25)``, at
    least 1 (a core three-quarters free still takes a thread)."""
    return max(1, math.floor(cores - others + 0.25))


class BusyMeter:
    """Cores kept busy by other processes on ``cpus`` since the last look (``/proc/stat`` and ``/proc/self/stat``
    ticks: all of the cores' busy time less this process's own)."""

    def __init__(self, *, cpus: frozenset[int] | None = None,
                 read: Callable[[frozenset[int]], tuple[int, int]] = read_cpu_ticks,
                 clock: Callable[[], float] = time.monotonic, hz: int | None = None):
        self.cpus = frozenset(os.sched_getaffinity(0)) if cpus is None else cpus
        self.read, self.clock = read, clock
        self.hz = hz or os.sysconf("SC_CLK_TCK")
        self._last = (self.clock(), *self.read(self.cpus))

    def elapsed(self) -> float:
        """Seconds since the last look."""
        return self.clock() - self._last[0]

    def others(self) -> float:
        """Cores busy with other processes since the last look, on average; starts the next interval."""
        then, busy0, mine0 = self._last
        now, (busy, mine) = self.clock(), self.read(self.cpus)
        self._last = (now, busy, mine)
        if now <= then:
            return 0.0
        return max(0.0, (busy - busy0 - (mine - mine0)) / (self.hz * (now - then)))
