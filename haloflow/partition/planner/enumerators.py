"""ShardingOptionEnumerator: every way to shard every table, costed in a few array passes.

Options per table (K ranks), each split evenly unless said otherwise::

    DATA_PARALLEL   one copy per rank (K > 1 only, unless it is the only kind allowed)
    TABLE_WISE      one shard
    ROW_WISE        S in {2, 4, 8, ...} and K (S <= K, S <= rows) row blocks; with an id-frequency histogram
                    also S blocks of equal lookup share (hot rows get short blocks)
    COLUMN_WISE     S in {2, 4, ...} and K column blocks of at least ``min_shard_cols`` columns
    CACHED          (opt-in) the whole table on one rank in host memory, with S hot rows on the device: one
                    option per size of the table's miss-ratio curve (``TableSpec.cache_curve``), or per
                    ``cache_fractions`` of its rows without one; each costs the table-wise traffic plus its
                    misses' host <-> device bytes, and holds only the S slots in device memory, so the search
                    picks, per table, the largest cache the budget leaves room for

The cost of one (table, sharding, S) family is computed for all tables at once: arrays (T, S) of lookup share
and columns go through the cost model's vectorised formulas, so 1,000 tables cost a handful of numpy calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from haloflow.errors import ConfigError
from haloflow.partition.planner.cost_model import EmbeddingCostModel
from haloflow.partition.planner.types import (
    DEFAULT_SHARDING_TYPES,
    CostModel,
    Enumerator,
    OptionSet,
    ShardingOption,
    ShardingType,
    TableSpec,
    Topology,
    Traffic,
)

__all__ = ["ShardingOptionEnumerator"]


@dataclass(frozen=True, kw_only=True)
class ShardingOptionEnumerator(Enumerator):
    """Args:
    cost_model: prices each shard, any `CostModel` (default: ``EmbeddingCostModel()``).
    sharding_types: the kinds the plan may use (all four by default).
    min_shard_cols: narrowest column-wise shard (4: narrower pooled vectors waste the all-to-all's bandwidth).
    cache_fractions: cache sizes, as fractions of a table's rows, offered for a ``CACHED`` table that has no
        miss-ratio curve.
    """

    cost_model: CostModel = EmbeddingCostModel()
    sharding_types: tuple[ShardingType, ...] = DEFAULT_SHARDING_TYPES
    min_shard_cols: int = 4
    # the sizes `haloflow bench cache` measures hit rates at, and a few larger ones
    cache_fractions: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharding_types", tuple(ShardingType(s) for s in self.sharding_types))
        if not self.sharding_types:
            raise ConfigError("sharding_types must name at least one of " + ", ".join(s.value for s in ShardingType))
        if self.min_shard_cols < 1:
            raise ConfigError(f"min_shard_cols must be >= 1, got {self.min_shard_cols}")
        object.__setattr__(self, "cache_fractions", tuple(float(f) for f in self.cache_fractions))
        if not self.cache_fractions or any(not 0 < f < 1 for f in self.cache_fractions):
            raise ConfigError(f"cache_fractions must be fractions in (0, 1), got {self.cache_fractions}",
                              field="cache_fractions")

    def enumerate(self, tables: tuple[TableSpec, ...], topology: Topology) -> OptionSet:
        tables = tuple(tables)
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(f"table names must be unique, got duplicates {dup}")
        k = topology.world_size
        rows = np.array([t.num_rows for t in tables], dtype=np.int64)  # (T,)
        dims = np.array([t.dim for t in tables], dtype=np.int64)  # (T,)
        pool = np.array([t.pooling_factor for t in tables], dtype=np.float64)  # (T,)
        per_table: list[list[ShardingOption]] = [[] for _ in tables]
        kinds = self.sharding_types
        if ShardingType.DATA_PARALLEL in kinds and (k > 1 or kinds == (ShardingType.DATA_PARALLEL,)):
            # (on one rank a replica is the table-wise shard under another name)
            self._replicas(per_table, tables, k, rows, dims, pool, topology)
        if ShardingType.TABLE_WISE in kinds:
            self._split(per_table, ShardingType.TABLE_WISE, k, _even(rows, 1), _even(dims, 1), tables, pool,
                        topology, np.ones(len(tables), bool))
        counts = sorted({s for s in [2**i for i in range(1, k.bit_length())] + [k] if 2 <= s <= k})
        for s in counts:
            if ShardingType.ROW_WISE in kinds:
                ok = rows >= s
                self._split(per_table, ShardingType.ROW_WISE, k, _even(rows, s), _whole(dims, s), tables, pool,
                            topology, ok)
                hot = np.array([t.id_frequencies is not None for t in tables]) & ok
                if hot.any():
                    self._split(per_table, ShardingType.ROW_WISE, k, _balanced(tables, rows, s, hot),
                                _whole(dims, s), tables, pool, topology, hot)
            if ShardingType.COLUMN_WISE in kinds:
                self._split(per_table, ShardingType.COLUMN_WISE, k, _whole(rows, s), _even(dims, s), tables, pool,
                            topology, dims >= s * self.min_shard_cols)
        if ShardingType.CACHED in kinds:
            self._cached(per_table, tables, k, topology)
        for t, opts in enumerate(per_table):
            if not opts:
                raise ConfigError(f"table {tables[t].name}: no sharding among {[s.value for s in kinds]} applies "
                                  f"({tables[t].num_rows} rows x {tables[t].dim} columns, {k} ranks)")
            opts.sort(key=lambda o: (o.total_cost, o.rows.size))
        return OptionSet(tables=tables, options=tuple(tuple(o) for o in per_table), topology=topology,
                         cost_model=self.cost_model)

    def _replicas(self, per_table, per_table_specs, k, rows, dims, pool, topology) -> None:
        cm = self.cost_model
        unique = cm.replica_unique(per_table_specs, k)  # (T,) distinct ids per rank per step
        base = topology.seconds(cm.replica_traffic(k, rows, dims, pool, unique))  # (T,) paid by every rank
        mem = cm.shard_memory(rows, dims)  # (T,)
        zeros, no_cost = np.zeros(k, dtype=np.int64), np.zeros(k)
        full_rows, full_cols = np.repeat(rows[:, None], k, 1), np.repeat(dims[:, None], k, 1)  # (T, K)
        full_mem = np.repeat(mem[:, None], k, 1)  # (T, K)
        for t in range(rows.size):
            per_table[t].append(ShardingOption(
                table_index=t, sharding=ShardingType.DATA_PARALLEL, world_size=k, row_offsets=zeros,
                rows=full_rows[t], col_offsets=zeros, cols=full_cols[t], base_cost=float(base[t]),
                shard_cost=no_cost, shard_memory=full_mem[t], total_cost=float(k * base[t]),
                peak_cost=float(base[t]), max_memory=float(mem[t])))

    def _cached(self, per_table, tables, k, topology) -> None:
        """One ``CACHED`` option per cache size of each table (sizes below its rows; see the module docstring)."""
        cm = self.cost_model
        for t, spec in enumerate(tables):
            if spec.cache_curve is not None:
                sizes = np.array([sl for sl, _ in spec.cache_curve if sl < spec.num_rows], np.int64)
            else:
                sizes = np.unique(np.ceil(np.array(self.cache_fractions) * spec.num_rows).astype(np.int64))
                sizes = sizes[(sizes >= 1) & (sizes < spec.num_rows)]
            if sizes.size == 0:
                continue
            p, d = spec.pooling_factor, spec.dim
            server = float(topology.seconds(cm.server_traffic(k, p, 1.0, d)))
            client = float(topology.seconds(cm.client_traffic(k, p, 1.0, d)))
            host = topology.seconds(Traffic(host=cm.cached_host_traffic(spec, sizes)))  # (n_sizes,)
            zero, whole = np.zeros(1, np.int64), np.array([spec.num_rows], np.int64)
            for size, h in zip(sizes.tolist(), np.atleast_1d(host).tolist()):
                per_table[t].append(ShardingOption(
                    table_index=t, sharding=ShardingType.CACHED, world_size=k, row_offsets=zero, rows=whole,
                    col_offsets=zero, cols=np.array([d], np.int64), base_cost=client,
                    shard_cost=np.array([server - client + h]), shard_memory=np.array([cm.shard_memory(size, d)]),
                    cache_rows=int(size)))

    def _split(self, per_table, kind, k, row_ranges, col_ranges, tables, pool, topology, ok) -> None:
        """Options of one kind and shard count for the tables where ``ok``.

        Shapes: row_ranges, col_ranges = (offsets, sizes), each int64 (T, S).
        """
        cm = self.cost_model
        (row_off, n_rows), (col_off, n_cols) = row_ranges, col_ranges  # (T, S) each
        share = np.ones(n_rows.shape)  # (T, S) every shard sees every id ...
        if kind is ShardingType.ROW_WISE:  # ... except row blocks, which see their rows' share
            share = n_rows / np.array([t.num_rows for t in tables], dtype=np.float64)[:, None]
            for t in np.flatnonzero(ok):
                if tables[t].id_frequencies is not None:
                    share[t] = tables[t].lookup_share(np.append(row_off[t], tables[t].num_rows))
        p = pool[:, None]  # (T, 1)
        server = topology.seconds(cm.server_traffic(k, p, share, n_cols))  # (T, S)
        client = topology.seconds(cm.client_traffic(k, p, share, n_cols))  # (T, S)
        base = client.sum(axis=1)  # (T,) every rank is a client of every shard ...
        delta = server - client  # (T, S) ... except the one that serves it
        mem = cm.shard_memory(n_rows, n_cols)  # (T, S)
        total = (k * base + delta.sum(axis=1)).tolist()  # (T,)
        peak = (base + delta.max(axis=1)).tolist()  # (T,)
        max_mem = mem.max(axis=1).tolist()  # (T,)
        base = base.tolist()
        for t in np.flatnonzero(ok).tolist():
            per_table[t].append(ShardingOption(
                table_index=t, sharding=kind, world_size=k, row_offsets=row_off[t], rows=n_rows[t],
                col_offsets=col_off[t], cols=n_cols[t], base_cost=base[t], shard_cost=delta[t],
                shard_memory=mem[t], total_cost=total[t], peak_cost=peak[t], max_memory=max_mem[t]))


def _even(n: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """s near-equal consecutive blocks of each n: (offsets, sizes). Shapes: (T,) -> (T, s), (T, s)."""
    bounds = (n[:, None] * np.arange(s + 1)[None, :]) // s  # (T, s+1)
    return bounds[:, :-1], np.diff(bounds, axis=1)


def _whole(n: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """s copies of the whole range 0..n-1: (offsets 0, sizes n). Shapes: (T,) -> (T, s), (T, s)."""
    return np.zeros((n.size, s), dtype=np.int64), np.repeat(n[:, None], s, axis=1)


def _balanced(tables, rows: np.ndarray, s: int, hot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s row blocks with equal shares of the lookups (even rows where no histogram): (offsets, sizes) (T, s)."""
    out = (rows[:, None] * np.arange(s + 1)[None, :]) // s  # (T, s+1) bounds
    for t in np.flatnonzero(hot):
        spec = tables[t]
        h = spec.id_frequencies
        edges = np.floor(np.arange(h.size + 1) * spec.num_rows / h.size)
        cum = np.concatenate([[0.0], np.cumsum(h)]) / h.sum()
        b = np.round(np.interp(np.arange(s + 1) / s, cum, edges)).astype(np.int64)
        b[0], b[-1] = 0, spec.num_rows
        b = np.maximum.accumulate(b)
        # every block keeps at least one row: push bounds apart from the left, then clip from the right
        b = np.maximum(b, np.arange(s + 1))
        b = np.minimum(b, spec.num_rows - (s - np.arange(s + 1)))
        out[t] = b
    return out[:, :-1], np.diff(out, axis=1)
