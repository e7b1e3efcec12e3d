"""``RowMover``: runs a cache's row copies (write-backs and loads) one job at a time, off the training thread.

::

    training thread                     mover thread (CUDA: inside a side stream)
    ---------------                     ----------------------------------------
    prefetch(i+1): plan, submit(job) -> write back dirty victims, read admitted rows, copy them into slots
    forward / backward of batch i       ...
    apply_gradients(i)                  ...
    gather(i+1): wait()  <------------- done (the side stream synchronised before the job returns)

On CPU the job is a background thread: the copies are numpy/torch memcpy and index ops that release the GIL.
On CUDA the side stream first waits for the work already queued on the current stream (a job may read slots
that earlier kernels write) and the job synchronises its stream before it returns, so the pinned host buffers it
copied from stay alive until the copies are done; ``wait()`` then makes the current stream wait for the side one.

On a CPU with few cores, give torch one intra-op thread fewer than the cores: torch's OpenMP pool and this thread
otherwise oversubscribe them and every small op waits at a barrier (2 cores, 2 intra-op threads: 200 steps of
the cache benchmark took 8.8 s; with 1 thread 1.0 s).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext

import torch

__all__ = ["RowMover"]


class RowMover:
    """One background worker for one cache; ``submit`` a job, ``wait`` for it (re-raising its exception)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None

    @property
    def busy(self) -> bool:
        return self._future is not None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` in the background; the previous job must have been waited for."""
        assert self._future is None, "RowMover.submit while a job is in flight"
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="haloflow-cache")
        stream = self._stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))

        def run() -> None:
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                job()
            if stream is not None:
                stream.synchronize()

        self._future = self._pool.submit(run)

    def wait(self) -> None:
        """Block until the job in flight (if any) is done; its rows are then visible to the current stream."""
        future, self._future = self._future, None
        if future is None:
            return
        future.result()
        if self._stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
