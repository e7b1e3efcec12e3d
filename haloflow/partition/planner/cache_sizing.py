"""Cache sizes for the planner: each table's miss-ratio curve, simulated on a trace of its ids.

::

    traces   per table: [ids of batch 0, ids of batch 1, ...]      (from a preprocessed folder: folder_traces)
       |     haloflow.cache.mrc.miss_ratio_curve(trace, sizes, policy): the cache's own SlotDirectory, no rows moved
       v
    TableSpec.cache_curve = ((S_0, hit_0), (S_1, hit_1), ...)       S_i = ceil(fraction_i x rows)
       |
       v     the enumerator offers one CACHED option per S_i, costed by its misses; the search (and
             ``grow_caches``) keeps, per table, the largest cache its rank's budget holds

The trace should be cut into batches of the planner's batch size (the cost model's ``batch_size``): a hit is
counted per distinct id per batch, as the cache counts it. Cost: one ``SlotDirectory.plan`` per batch, size
and table, plus an (R,) slot map per simulation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from haloflow.cache.mrc import miss_ratio_curve
from haloflow.cache.policy import make_policy
from haloflow.errors import ConfigError
from haloflow.partition.planner.types import TableSpec

__all__ = ["with_cache_curves", "folder_traces", "CURVE_FRACTIONS"]

# the sizes `haloflow bench cache` measures, and a few larger ones (the enumerator's default fractions too)
CURVE_FRACTIONS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def with_cache_curves(specs: Sequence[TableSpec], traces: Sequence[Sequence[np.ndarray]], *, policy: str = "lru",
                      fractions: Sequence[float] = CURVE_FRACTIONS) -> tuple[TableSpec, ...]:
    """``specs`` with ``cache_curve`` filled from ``traces[t]`` (batches of table t's ids) for ``policy``.

    Sizes are ``ceil(f x rows)`` for f in ``fractions`` (below the table's rows; a table too small for any keeps
    no curve). ``policy``: "lru" or "lfu", or "frequency" for a table whose ``id_frequencies`` has one bin per
    row (its warm start).
    """
    if len(traces) != len(specs):
        raise ConfigError(f"{len(traces)} traces for {len(specs)} tables; expected one trace per table",
                          field="traces")
    if any(not 0 < f < 1 for f in fractions):
        raise ConfigError(f"fractions must be in (0, 1), got {list(fractions)}", field="fractions")
    out = []
    for spec, trace in zip(specs, traces):
        sizes = sorted({int(np.ceil(f * spec.num_rows)) for f in fractions} - {spec.num_rows})
        sizes = [s for s in sizes if 1 <= s < spec.num_rows]
        if not sizes or not trace:
            out.append(spec)
            continue
        histogram = None
        if policy == "frequency":
            h = spec.id_frequencies
            if h is None or h.size != spec.num_rows:
                raise ConfigError(f"table {spec.name}: policy 'frequency' needs id_frequencies with one bin per row "
                                  f"({spec.num_rows}); use 'lru' or 'lfu'", field="policy")
            histogram = h

        def fresh(histogram=histogram):
            return make_policy(policy, histogram=histogram)

        curve = miss_ratio_curve(trace, sizes, fresh, num_rows=spec.num_rows, with_belady=False)
        out.append(dataclasses.replace(spec, cache_curve=tuple((p.slots, p.hit_rate) for p in curve)))
    return tuple(out)


def folder_traces(folder: str | Path, *, batch_size: int, max_batches: int) -> list[list[np.ndarray]]:
    """The first ``max_batches`` train batches of a ``haloflow preprocess`` folder as one trace per table."""
    from haloflow.data.criteo_loader import ClickLoader, ClickLoaderConfig

    if max_batches < 1:
        raise ConfigError(f"max_batches must be >= 1, got {max_batches}", field="max_batches")
    loader = ClickLoader(folder, ClickLoaderConfig(batch_size=batch_size, split="train"))
    traces: list[list[np.ndarray]] = [[] for _ in loader.table_sizes]
    for i, batch in enumerate(loader):
        if i >= max_batches:
            break
        for t in range(batch.sparse.num_features):
            traces[t].append(batch.sparse.feature(t)[1].numpy())
    return traces
