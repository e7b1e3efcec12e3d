"""How OpenMP's idle threads wait, chosen by ``haloflow.host.apply()`` before torch loads its OpenMP runtime.

::

    host.apply()         GOMP_SPINCOUNT=10000, unless the environment already says how to wait
    (the CLI's entry)    (OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME set: left alone); ``import haloflow``
                         alone sets nothing
    import torch         torch's libgomp reads it once, as it loads
    numba prange         runs on that same runtime: numba's omppool resolves GOMP_parallel to the libgomp torch
                         put in the global scope, so its kernels use torch's worker threads (one pool, one policy;
                         haloflow/host/threads.py)
    child processes      torchrun's ranks, benchmark workers: inherit it, and HALOFLOW_OPENMP_DEFAULTS naming
                         it as haloflow's (so caller_environ() there still gives the caller's own environment)

Why. libgomp's default is to spin: a thread that has finished its share of a parallel region polls for the next
one for up to 300,000 pause instructions (20-30 ns each here, so 6-9 ms) before it sleeps on a futex. A DLRM
step of batch 128 opens about 90 parallel regions some 60 us apart, so torch's worker thread never sleeps:
/proc/self/task showed it with as much user time as the main thread (5.1-10.2 s each over 60 steps). Beside busy
processes it takes the timeslices the main thread needs, and the scheduler ranks a thread that never sleeps
behind the others, so every region's barrier waits for it: with other jobs on the machine (load average 4-8) and
two busy co-tenants a step took 120-780 ms spinning against 9-29 ms with OMP_WAIT_POLICY=PASSIVE, with 12.4 s of
user time against 0.4 s over 40 steps.

Passive is no default, though: woken for every region (a futex wake and, in this VM, an idle vCPU brought back,
about 90 us a region), the quiet DLRM step took 13.9-14.2 ms against 5.5-5.8 ms spinning, and TGN's 41 ms
against 22. 10,000 spins (0.2-0.3 ms) bridge the gaps inside a step, as the default does (quiet DLRM 5.9 ms),
and let a thread sleep soon after its step leaves it idle or the scheduler parks its partner; beside six busy
processes the step took 87-96 ms against the default's 120-265 ms (passive: 28-40 ms, one thread: 33 ms).

A process that imported torch before ``apply`` ran (a notebook calling the Python API) keeps torch's choice (a
runtime reads its environment once); ``wait_policy()`` says so, and the runtime's start-up line shows it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["apply_defaults", "wait_policy", "caller_environ"]

DEFAULTS = {"GOMP_SPINCOUNT": "10000"}  # libgomp's, the OpenMP of the torch wheels on Linux
# Any of these set by the caller means "the caller has chosen how OpenMP waits".
CHOSEN_BY = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
# The names apply_defaults set, so that a child process (a rank, a benchmark worker) knows its inherited values
# for haloflow's and not the caller's.
MARK = "HALOFLOW_OPENMP_DEFAULTS"

_added: dict[str, str] = {}  # what apply_defaults put into os.environ
_torch_first = False  # torch (and its OpenMP runtime) was loaded before apply_defaults ran


def apply_defaults() -> None:
    """Set GOMP_SPINCOUNT=10000 unless the environment has chosen; once, from ``haloflow.host.apply``."""
    global _torch_first
    if _added:
        return
    inherited = [n for n in os.environ.get(MARK, "").split(",") if n in DEFAULTS and os.environ.get(n) == DEFAULTS[n]]
    if inherited:  # set by a haloflow parent before this process (and its torch) started
        _added.update((n, DEFAULTS[n]) for n in inherited)
        return
    if any(name in os.environ for name in CHOSEN_BY):
        return
    _torch_first = "torch" in sys.modules
    for name, value in DEFAULTS.items():
        os.environ[name] = value
        _added[name] = value
    os.environ[MARK] = ",".join(_added)


def wait_policy() -> str:
    """How torch's OpenMP threads wait in this process, for the start-up line: haloflow's bounded spin, the
    caller's own setting (``"OMP_WAIT_POLICY=ACTIVE (the environment's)"``), or a note that torch came first."""
    if _torch_first:
        return ("spinning 300,000 pauses (torch was imported before haloflow.host.apply(); set GOMP_SPINCOUNT=10000 "
                "to bound it)")
    if _added:
        return "spin 10,000 pauses, then sleep"
    chosen = [f"{name}={os.environ[name]}" for name in CHOSEN_BY if name in os.environ]
    return f"{', '.join(chosen)} (the environment's)" if chosen else "OpenMP's default (spinning)"


def caller_environ() -> dict[str, str]:
    """``os.environ`` less what ``apply_defaults`` added: the environment a plain PyTorch program would see."""
    return {k: v for k, v in os.environ.items() if _added.get(k) != v and k != MARK}
