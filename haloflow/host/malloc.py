"""How freed memory is reused, chosen by ``haloflow.host.apply()``: glibc keeps big freed blocks for the next
allocation.

::

    host.apply()         mallopt(M_MMAP_THRESHOLD, 1 GiB), mallopt(M_TRIM_THRESHOLD, 2 GiB): blocks below 1 GiB
                         come from the heap, and up to 2 GiB freed at its top stays mapped for the next step
                         (unless the environment has chosen: MALLOC_*_ / GLIBC_TUNABLES set, another allocator
                         in LD_PRELOAD, or HALOFLOW_MALLOC=system)

Why. glibc serves a block of 32 MiB or more with its own ``mmap`` and unmaps it on ``free``, so every training
step's large activations (a 200k x 128 float32 tensor is 102 MB) start as fresh pages, each one a page fault
that the kernel zero-fills: 1.1 million minor faults in a run of 8 GCN epochs on ``bench gcn``'s graph, and an
epoch (dropout 0, Kipf's model) took 0.58-0.59 s against 0.35-0.43 s with the blocks reused (alone on the 2-core
VM, the same floats); in ``bench gcn`` haloflow's epoch went 0.71 -> 0.43 s and PyG's 2.99 -> 2.17 s (one process:
both reuse). The time is kernel time, which is also what a run beside busy co-tenants loses first. PyTorch's CPU guides say the
same and preload jemalloc or tcmalloc; this needs no extra library and leaves a caller's choice alone.

The cost: memory a step freed stays in the process (its RSS does not shrink between steps), which is the memory
the next step needs again; ``trim()`` gives it back (``reset_peak_rss`` does, before a measured phase). Blocks of 1 GiB or more (a full table) are still mapped and unmapped on their own.
A child process (a torchrun rank, a benchmark worker) sets it again at its own entry point (the CLI, or
``Runtime.start``); ``import haloflow`` alone sets nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["apply_defaults", "malloc_policy", "trim"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 1 << 30  # blocks below this come from the heap, and are reused
TRIM_THRESHOLD = (1 << 31) - 1  # freed bytes kept at the heap's top (mallopt takes an int)
OPT_OUT = "HALOFLOW_MALLOC"  # "system": leave glibc's defaults
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_GLIBC_NAMES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_state = "not set"  # what apply_defaults did, for malloc_policy()
_libc = None  # glibc, once apply_defaults found its mallopt


def _chosen_elsewhere() -> str | None:
    if os.environ.get(OPT_OUT, "").lower() == "system":
        return f"{OPT_OUT}=system"
    named = sorted(k for k in _GLIBC_NAMES if k in os.environ)
    if named:
        return f"{named[0]} (the environment's)"
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES (the environment's)"
    preload = os.environ.get("LD_PRELOAD", "")
    for name in _OTHER_ALLOCATORS:
        if name in preload:
            return f"{name} (LD_PRELOAD)"
    return None


def apply_defaults() -> None:
    """Set glibc's thresholds once, from ``haloflow.host.apply``; a no-op off glibc or when the caller has chosen."""
    global _state
    if _state != "not set":
        return
    other = _chosen_elsewhere()
    if other is not None:
        _state = other
        return
    if not sys.platform.startswith("linux"):
        _state = "the system's (not glibc)"
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        _state = "the system's (no mallopt)"
        return
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    global _libc
    _libc = libc if ok else None
    _state = "freed blocks below 1 GiB reused" if ok else "glibc's defaults (mallopt refused)"


def malloc_policy() -> str:
    """How this process reuses freed memory, for the start-up line."""
    return _state


def trim() -> None:
    """Give the freed memory kept for reuse back to the system now (``malloc_trim(0)``), for a caller about to
    measure the RSS of a new phase (``utils.memory.reset_peak_rss``); a no-op when nothing was changed here."""
    if _libc is not None:
        _libc.malloc_trim(0)
