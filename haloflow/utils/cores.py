"""The cores a process may use, and the ranks x threads they must hold: `cores_here`, `ThreadBudget`.

No torch and no numba here: the launcher (``engine/launch.py``) divides the cores among the ranks it starts
before anything has imported torch. The thread pools themselves are ``threads.py``'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["cores_here", "ThreadBudget"]


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
