"""Eviction and admission policies: each scores row ids (higher = keep); the slot directory evicts the lowest.

::

    policy        score of row i                         warm start               a miss is cached
    -----------   ------------------------------------   ----------------------   --------------------------
    lru           last batch that looked i up (-1)        none                     always
    lfu           batches that looked i up so far         none                     always
    frequency     hist[i], an offline count of i          the hottest rows         always (Colossal-AI), or
                  in the training data                    (num_slots of them)      only when hotter than the
                                                                                   coldest evictable row
    lookahead     next use within the next W batches      as frequency, with a     always, or only when used
                  (sooner = higher), then frequency        histogram; else none     sooner than its victim
                  (lookahead.py: fed the batches to come)

``frequency`` is Colossal-AI's frequency-aware cache (FACTS.md): rows ranked by their count in the data set,
the hottest preloaded, the coldest evicted first. With ``admit_all=False`` it keeps the static hot set and
serves colder misses from the backing store, which never evicts a hot row for a one-off id. LFU counts keep
their history when a row leaves the cache (FBGEMM's LFU), so a returning hot row is recognised.

Scores are per row id, so every policy holds one int64 per row of the table (8 bytes x N on the host).
"""

from __future__ import annotations

import numpy as np

from haloflow.cache.lookahead import LookaheadPolicy
from haloflow.cache.types import CachePolicy
from haloflow.errors import ConfigError

__all__ = ["LRUPolicy", "LFUPolicy", "FrequencyPolicy", "make_policy", "POLICIES"]

POLICIES = ("lru", "lfu", "frequency", "lookahead")
DEFAULT_WINDOW = 16  # batches ahead: on the bench's Zipf traces at 1 % of rows, 1.9 % below Belady (8: 4.6 %)


class LRUPolicy(CachePolicy):
    """Least recently used: evict the row whose last lookup is oldest."""

    name = "lru"

    def __init__(self) -> None:
        self._last = np.empty(0, dtype=np.int64)

    def reset(self, num_rows: int) -> None:
        self._last = np.full(num_rows, -1, dtype=np.int64)

    def record(self, ids: np.ndarray, clock: int) -> None:
        self._last[ids] = clock

    def scores(self, ids: np.ndarray) -> np.ndarray:
        return self._last[ids]

    def score_table(self) -> np.ndarray:
        return self._last

    @property
    def nbytes(self) -> int:
        return self._last.nbytes


class LFUPolicy(CachePolicy):
    """Least frequently used: evict the row looked up in the fewest batches so far."""

    name = "lfu"

    def __init__(self) -> None:
        self._count = np.empty(0, dtype=np.int64)

    def reset(self, num_rows: int) -> None:
        self._count = np.zeros(num_rows, dtype=np.int64)

    def record(self, ids: np.ndarray, clock: int) -> None:
        self._count[ids] += 1  # ids are distinct, so fancy-index += counts each once

    def scores(self, ids: np.ndarray) -> np.ndarray:
        return self._count[ids]

    def score_table(self) -> np.ndarray:
        return self._count

    @property
    def nbytes(self) -> int:
        return self._count.nbytes


class FrequencyPolicy(CachePolicy):
    """Colossal-AI's frequency-aware cache: a static rank from an offline id histogram, hottest preloaded.

    Args:
        histogram: (N,) count of every row id in the training data (``np.bincount(ids, minlength=N)``).
        admit_all: True (Colossal-AI) caches every miss, evicting the coldest row; False caches a miss only
            when it is hotter than the coldest evictable row.
    """

    name = "frequency"

    def __init__(self, histogram: np.ndarray, *, admit_all: bool = True) -> None:
        hist = np.asarray(histogram)
        if hist.ndim != 1 or (hist.size and hist.min() < 0):
            raise ConfigError(f"FrequencyPolicy.histogram must be a 1-D array of counts >= 0, got shape {hist.shape}",
                              field="histogram")
        self._hist = hist.astype(np.int64)
        self.admit_all = admit_all

    def reset(self, num_rows: int) -> None:
        if num_rows != self._hist.size:
            raise ConfigError(f"FrequencyPolicy.histogram has {self._hist.size} counts for a table of {num_rows} "
                              "rows; expected one count per row", field="histogram")

    def record(self, ids: np.ndarray, clock: int) -> None:
        pass

    def scores(self, ids: np.ndarray) -> np.ndarray:
        return self._hist[ids]

    def score_table(self) -> np.ndarray:
        return self._hist

    @property
    def nbytes(self) -> int:
        return self._hist.nbytes

    def warm_start(self, num_slots: int) -> np.ndarray:
        order = np.argsort(-self._hist, kind="stable")  # hottest first, smaller id first among equals
        hot = order[:num_slots]
        return np.sort(hot[self._hist[hot] > 0])


def make_policy(name: str, *, histogram: np.ndarray | None = None, admit_all: bool = True,
                window: int = DEFAULT_WINDOW) -> CachePolicy:
    """A fresh policy by name: ``"lru"``, ``"lfu"``, ``"frequency"`` (which needs ``histogram``) or ``"lookahead"``
    (`LookaheadPolicy` over ``window`` batches; ``histogram`` optional)."""
    if name == "lru":
        return LRUPolicy()
    if name == "lfu":
        return LFUPolicy()
    if name == "frequency":
        if histogram is None:
            raise ConfigError("policy 'frequency' needs histogram= (the count of every row id in the data)",
                              field="histogram")
        return FrequencyPolicy(histogram, admit_all=admit_all)
    if name == "lookahead":
        return LookaheadPolicy(window, histogram=histogram, admit_all=admit_all)
    raise ConfigError(f"policy must be one of {POLICIES}, got {name!r}", field="policy")
