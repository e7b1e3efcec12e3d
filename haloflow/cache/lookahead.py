"""``LookaheadPolicy``: Belady within a window of the next W batches (BagPipe's "oracle cacher").

The data loader already holds the next batches, so whoever drives the cache can tell the policy their ids
(``upcoming``) before it asks the policy to plan. Within that window the policy knows every row's next use and
evicts like Belady's MIN; beyond it, it falls back on frequency::

    clock c (the batch being planned)        window: batches c+1 .. c+W, fed by the driver
      batch c+1   [3, 7, 9]                  next_use: 3 -> c+1, 7 -> c+1, 9 -> c+1, 2 -> c+2
      batch c+2   [2, 7]                     (the first batch after c holding the row; none: not in the window)
      ...
      batch c+W   [...]

    score of row i (higher = keep)
      next use in the window, d = next_use - c in 1..W    2^56 - d * 2^36 + freq(i)    sooner = higher
      not in the window                                   freq(i)                      below every row in it
    freq(i): the offline histogram's count when given (as ``frequency``), else the batches that looked i up so
    far (as ``lfu``); capped below 2^36, so it only breaks ties between equal next uses.

The slot directory evicts the lowest scores: a row not needed within the window goes first, the coldest of them
first, then the row needed furthest. With ``admit_all=False`` a miss takes a slot only from a victim that scores
lower, i.e. one used later than the miss (Belady's bypass). Scores never change which rows a batch reads, only
where they are, so training through the cache stays exact whatever the window holds.

The driver's protocol: ``upcoming(ids)`` once per batch, in batch order, starting with batch 0; before batch c is
planned it should have announced batches up to c + W (fewer: the window is shorter, the policy is still correct).
Cost: ``upcoming`` O(u) (sets the next use of rows not yet in the window); ``record`` of batch c one
``searchsorted`` per window batch for the rows whose next use was c (O(W u log u) at worst); host state: three
int64 per row.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from haloflow.cache.types import CachePolicy
from haloflow.errors import ConfigError
from haloflow.kernels.cache_plan import FREQ_CAP, MAX_AHEAD  # the device directory's score: the same constants

__all__ = ["LookaheadPolicy"]

_NEVER = np.iinfo(np.int64).max


class LookaheadPolicy(CachePolicy):
    """Evict the row whose next use is furthest (or beyond the next ``window`` batches), ties by frequency.

    Args:
        window: W, batches ahead that the driver announces with ``upcoming`` (1 .. 65536).
        histogram: (N,) offline count of every row id (as ``FrequencyPolicy``'s): ranks rows beyond the window
            and warm-starts the hottest; None counts lookups online instead (as LFU) and starts empty.
        admit_all: cache every miss (True), or only a miss used sooner than its victim (False, Belady's bypass).
    """

    name = "lookahead"

    def __init__(self, window: int, *, histogram: np.ndarray | None = None, admit_all: bool = False) -> None:
        if not 1 <= window <= MAX_AHEAD:
            raise ConfigError(f"LookaheadPolicy.window must be in 1..{MAX_AHEAD} batches, got {window}",
                              field="window")
        if histogram is not None:
            histogram = np.asarray(histogram)
            if histogram.ndim != 1 or (histogram.size and histogram.min() < 0):
                raise ConfigError("LookaheadPolicy.histogram must be a 1-D array of counts >= 0, got shape "
                                  f"{histogram.shape}", field="histogram")
            histogram = np.minimum(histogram.astype(np.int64), FREQ_CAP)
        self.window, self.admit_all = window, admit_all
        self._hist = histogram
        self._count = np.empty(0, dtype=np.int64)
        self._next = np.empty(0, dtype=np.int64)
        self._batches: deque[tuple[int, np.ndarray]] = deque()

    def reset(self, num_rows: int) -> None:
        if self._hist is not None and self._hist.size != num_rows:
            raise ConfigError(f"LookaheadPolicy.histogram has {self._hist.size} counts for a table of {num_rows} "
                              "rows; expected one count per row", field="histogram")
        self._count = np.zeros(0 if self._hist is not None else num_rows, dtype=np.int64)
        self._next = np.full(num_rows, _NEVER, dtype=np.int64)  # (N,) next announced batch using the row
        self._batches = deque()  # (batch number, distinct ids ascending) announced and not yet recorded
        self._fed = 0  # batches announced so far
        self._clock = -1  # the batch recorded last

    def upcoming(self, ids: np.ndarray) -> None:
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        nxt = self._next[ids]
        new = ids[(nxt == _NEVER) | (nxt <= self._clock)]  # rows already in the window keep their sooner use
        self._next[new] = self._fed
        self._batches.append((self._fed, ids))
        self._fed += 1

    def record(self, ids: np.ndarray, clock: int) -> None:
        self._clock = clock
        while self._batches and self._batches[0][0] <= clock:
            self._batches.popleft()
        if self._hist is None:
            self._count[ids] += 1  # ids are distinct
        # Rows whose next use was this batch (or an older one never recorded) move on to their next use in the
        # window; the rest of the table keeps its next use.
        due = ids[self._next[ids] <= clock]
        for b, batch in self._batches:
            if not due.size:
                break
            pos = np.minimum(np.searchsorted(batch, due), batch.size - 1)
            found = batch[pos] == due
            self._next[due[found]] = b
            due = due[~found]
        self._next[due] = _NEVER

    def scores(self, ids: np.ndarray) -> np.ndarray:
        freq = self._hist[ids] if self._hist is not None else np.minimum(self._count[ids], FREQ_CAP)
        nxt = self._next[ids]
        ahead = (nxt > self._clock) & (nxt != _NEVER)
        d = np.where(ahead, np.minimum(nxt - self._clock, MAX_AHEAD), 0)  # announced further: as far as W
        return np.where(ahead, (1 << 56) - (d << 36) + freq, freq)

    def warm_start(self, num_slots: int) -> np.ndarray:
        if self._hist is None:
            return np.empty(0, dtype=np.int64)
        order = np.argsort(-self._hist, kind="stable")  # hottest first, smaller id first among equals
        hot = order[:num_slots]
        return np.sort(hot[self._hist[hot] > 0])

    @property
    def nbytes(self) -> int:
        hist = self._hist.nbytes if self._hist is not None else 0
        return hist + self._count.nbytes + self._next.nbytes + sum(b.nbytes for _, b in self._batches)
