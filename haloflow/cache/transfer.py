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

On a CPU the thread only pays when a core is free for it: beside busy co-tenants on 2 cores, a prefetched step
of the cache benchmark took 6.0 ms against 5.3 ms without prefetch (the job's copies and page faults compete
with the step for the core and the memory bus, and each hand-over costs a GIL switch). So on a CPU an
``OverlapChooser`` times whole steps (gather to gather) and picks whichever way gave the shorter step: the
prefetch in the thread, or no prefetch at all (``background()`` False: the cache skips it, and the step is a
plain one; planning a prefetch and copying inline cost 5 % more than that, measured)::

    steps   | probe none P | probe thread P | hold the faster H | probe the other P | hold the faster 2H | ...
    decided on the medians of the latest P steps of each way; each time the same way wins again its hold doubles,
    up to 8H, and a change of the winner starts again from H

The probes of the slower way cost about P / (P + hold) x (its step / the faster step - 1) of the run: with a fixed
hold of 128 and a background copy three times slower than none beside busy co-tenants, prefetch ran 0.88x no
prefetch over 1,000 steps (``bench cache``); the doubling hold brings that share to ~1 % once the winner is settled.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext

import torch

__all__ = ["RowMover", "OverlapChooser"]


class OverlapChooser:
    """Chooses, step by step, whether background jobs shorten a step; see the module docstring.

    Args:
        probe: P, steps each way is tried before a decision (their median step time decides).
        hold: H, steps the faster way then runs before the other is tried again (loads change); doubled, up to
            8H, each time the same way wins again.
        clock: seconds, monotonic (``time.perf_counter``).
    """

    def __init__(self, *, probe: int = 8, hold: int = 128, clock: Callable[[], float] = time.perf_counter):
        self.probe, self.hold, self._clock = probe, hold, clock
        self.max_hold = 8 * hold
        self._hold = hold  # the current hold: doubled each time the same way wins again
        self._decided = False  # a winner has been chosen once
        self.background = False  # the way of the next step: without a job first
        self._best = False  # the faster way so far
        self._times: dict[bool, deque[float]] = {False: deque(maxlen=probe), True: deque(maxlen=probe)}
        self._used: bool | None = None  # the way a job ran since the last step began (None: no job)
        self._last: float | None = None
        self._left = probe  # steps left in the current phase
        self._probing = True

    def job(self) -> bool:
        """A job may run in this step; returns True to run it in the background, False for no job (the step is
        timed as that way either way)."""
        self._used = self.background
        return self.background

    def step(self) -> None:
        """A training step begins (the cache's ``gather``): the step that just ended is timed for the way its
        job ran, and the schedule moves on."""
        now, last = self._clock(), self._last
        if last is not None and self._used is not None:
            self._times[self._used].append(now - last)
        self._last, self._used = now, None
        if last is None:  # the first step begins: nothing has been timed yet
            return
        self._left -= 1
        if self._left > 0:
            return
        if self._probing and not self._times[True]:  # the first probe of the thread follows the inline one
            self.background, self._left = True, self.probe
            return
        if self._probing:
            inline, thread = (statistics.median(self._times[k]) for k in (False, True))
            best = thread < inline
            again = self._decided and best == self._best
            self._hold = min(2 * self._hold, self.max_hold) if again else self.hold
            self._best, self._decided = best, True
            self.background, self._left, self._probing = best, self._hold, False
        else:
            self.background, self._left, self._probing = not self._best, self.probe, True


class RowMover:
    """One background worker for one cache; ``submit`` a job, ``wait`` for it (re-raising its exception).

    Args:
        device: the cache's device.
        overlap: True runs every job in the background, False every job inline in ``submit`` (and
            ``background()`` says False); None (default): the background on CUDA (a side stream), on a CPU as a
            fresh `OverlapChooser` decides.
    """

    def __init__(self, device: torch.device, overlap: bool | None = None):
        self.device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._overlap = True if overlap is None and self._stream is not None else overlap
        self.chooser = OverlapChooser() if self._overlap is None else None
        self._jobs = False  # a job was submitted (a cache that never prefetches times nothing)

    def background(self) -> bool:
        """Whether a job offered now should run in the background: always on CUDA or with ``overlap=True``, never
        with ``overlap=False``, else as the chooser says (False: skip the job, if it is optional as a prefetch
        is; ``submit`` would run it inline)."""
        self._jobs = True
        return self._overlap if self.chooser is None else self.chooser.job()

    def step(self) -> None:
        """A training step begins (timed by the chooser, when there is one and a job has come)."""
        if self.chooser is not None and self._jobs:
            self.chooser.step()

    @property
    def busy(self) -> bool:
        return self._future is not None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` in the background (or, when the chooser says so, now); the previous job must have been
        waited for."""
        assert self._future is None, "RowMover.submit while a job is in flight"
        if not (self._overlap if self.chooser is None else self.chooser.background):
            self._future = Future()  # done now; wait() re-raises its error as for a background job
            try:
                job()
                self._future.set_result(None)
            except Exception as err:
                self._future.set_exception(err)
            return
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
