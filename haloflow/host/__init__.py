"""Process tuning in one place: how OpenMP's idle threads wait, how freed memory is reused, and how many threads
compute. A library leaves these to its entry points, so ``import haloflow`` changes none of them::

    haloflow CLI (``haloflow ...``, ``python -m haloflow``, every torchrun rank)
        host.apply()  first, before torch is imported: OpenMP's wait policy (openmp.py) and glibc's thresholds
                      (malloc.py), each left alone where the environment has chosen
    Runtime.start (the Python API's trainers: train_gcn, train_dlrm, train_tgn)
        host.apply()  the malloc thresholds take effect at once; the wait policy only for child processes when
                      torch is already loaded (its OpenMP runtime read the environment as it loaded), and the
                      start-up line says so
        threads.reproducible_blas(), threads.follow_torch_threads(), threads.warm_vector_math(), a ThreadGovernor

A notebook that imports haloflow beside PyG keeps glibc's, OpenMP's and torch's defaults until it starts a run.
"""

from __future__ import annotations

from haloflow.host import malloc, openmp

__all__ = ["apply", "describe"]


def apply() -> None:
    """Apply haloflow's process defaults (idempotent): OpenMP's bounded spin, then glibc's reuse of freed blocks.

    Call it before torch is imported for the wait policy to reach this process's OpenMP runtime; later, it still
    reaches child processes (torchrun's ranks, benchmark workers) and the malloc thresholds apply at once."""
    openmp.apply_defaults()
    malloc.apply_defaults()


def describe() -> str:
    """``"OpenMP threads wait: ...; memory: ..."`` for a start-up line."""
    return f"OpenMP threads wait: {openmp.wait_policy()}; memory: {malloc.malloc_policy()}"
