"""Miss-ratio curves: the hit rate a policy would get at each cache size, simulated on a trace of batches.

::

    trace  [ids of batch 0, ids of batch 1, ...]        sizes  [S_0, S_1, ...] slots
                       |
    simulate(trace, S, policy)  -- the store's own SlotDirectory, no rows moved --> CacheStats
                       |
    miss_ratio_curve -> [MRCPoint(slots=S_0, hit_rate=...), ...]     + Belady's bound at each size

A planner sizes a cache from it: the smallest S whose hit rate reaches a goal (`smallest_cache_for`). The
simulation runs the same ``SlotDirectory`` as `CachedStore` (without prefetch), so its hit rate is the one the
store will count on that trace. Cost: one ``SlotDirectory.plan`` per batch and size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from haloflow.cache.belady import belady_hits, flatten_trace
from haloflow.cache.directory import SlotDirectory
from haloflow.cache.types import CachePolicy, CacheStats
from haloflow.errors import ConfigError

__all__ = ["simulate", "miss_ratio_curve", "MRCPoint", "smallest_cache_for"]


def simulate(trace: Sequence[np.ndarray], num_slots: int, policy: CachePolicy, *, num_rows: int) -> CacheStats:
    """Run ``policy`` with ``num_slots`` slots over ``trace`` (batches of row ids < ``num_rows``); its counters."""
    if not 1 <= num_slots <= num_rows:
        raise ConfigError(f"num_slots must be in 1..{num_rows} (the table's rows), got {num_slots}", field="num_slots")
    d = SlotDirectory(num_rows, num_slots, policy)
    d.warm()
    batches = [np.unique(np.asarray(b, dtype=np.int64)) for b in trace]
    for b in batches[:policy.window]:  # a lookahead policy sees W batches ahead, as the store's driver shows it
        policy.upcoming(b)
    for i, batch in enumerate(batches):
        if i + policy.window < len(batches) and policy.window:
            policy.upcoming(batches[i + policy.window])
        d.plan(batch)
    return d.stats


@dataclass(frozen=True)
class MRCPoint:
    """One cache size: ``hit_rate`` of the policy and ``belady`` (the optimum), both hits / lookups."""

    slots: int
    hit_rate: float
    belady: float | None


def miss_ratio_curve(trace: Sequence[np.ndarray], sizes: Sequence[int], make: Callable[[], CachePolicy], *,
                     num_rows: int, with_belady: bool = True) -> list[MRCPoint]:
    """Hit rate of a fresh ``make()`` policy at every size in ``sizes`` (slots), and Belady's at the same size."""
    lookups = flatten_trace(trace).size
    out = []
    for s in sizes:
        stats = simulate(trace, int(s), make(), num_rows=num_rows)
        best = belady_hits(trace, int(s), num_rows=num_rows) / lookups if with_belady and lookups else None
        out.append(MRCPoint(int(s), stats.hit_rate, best))
    return out


def smallest_cache_for(curve: Sequence[MRCPoint], hit_rate: float) -> int | None:
    """The fewest slots on ``curve`` whose hit rate is at least ``hit_rate``; None when no size reaches it."""
    ok = [p.slots for p in curve if p.hit_rate >= hit_rate]
    return min(ok) if ok else None
