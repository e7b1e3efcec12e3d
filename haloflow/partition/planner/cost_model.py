"""Per-rank cost of embedding shards: bytes looked up, sent and received in all-to-alls, all-reduced; memory held.

One training step of a global batch B on K ranks (each rank holds b = B/K samples)::

    shard s of table t (P ids per sample, c of its D columns, a share f of its lookups), on rank r:

      client rank j != r  --ids+lengths b(fP+1)·8 B-->  server rank r    lookup 3·B·f·P·c·e B
                          <--pooled     b·c·e B------                     (1x gather forward,
                          --grads       b·c·e B----->                      2x read+write backward)

      server r receives (K-1)·b(fP+1)·8 + (K-1)·b·c·e and sends (K-1)·b·c·e
      (row-wise shards send partial sums of all c = D columns for every sample: the reduce-scatter)

    data-parallel table (every rank a full copy): lookup 3·b·P·D·e, no all-to-all; gradients summed by
      dp_grad="sparse": all-gather of the u rows this rank touched, (K-1)·(8 + u·(8 + D·e)) bytes sent,
                        u = expected distinct ids among b·P draws (from the histogram, else uniform)
      dp_grad="dense":  ring all-reduce of the whole gradient, 2(K-1)/K · R·D·e bytes sent
      (the sharded engine's two modes, same names)

    memory of a shard: rows · (c · (1 + optimizer_slots) + row_slots) · e

    cached table (one shard, the whole table, on rank r; S of its R rows in device slots): the table-wise
      traffic, plus host <-> device traffic on r of 2·m·(D·(1 + optimizer_slots) + row_slots)·e bytes - every miss loads a
      row with its state, and evicts (writes back) a dirty one - for m = u·(1 - hit rate(S)) misses among the
      u distinct ids of the global batch; device memory S·(D·(1 + optimizer_slots) + row_slots)·e, host memory the table's
      plus the cache's maps and policy state, 2·8·(R + S) bytes (row -> slot and the policy's score per row,
      slot -> row and the free list per slot: ``SlotDirectory.nbytes``).
      hit rate(S): the table's miss-ratio curve (``TableSpec.cache_curve``) interpolated, or estimated from
      its id histogram as the S most frequent rows' share of distinct lookups (uniform ids: S / R)

Costs are additive, so a table's cost to rank j is ``base`` (the client side of every shard, paid by every rank,
or the whole data-parallel cost) plus, for each shard j holds, ``server - client`` — the form the partitioner
balances. Seconds = bytes / the topology's bandwidths (``Topology.seconds``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from haloflow.errors import ConfigError
from haloflow.partition.planner.types import (
    CostModel,
    RankCost,
    ShardingPlan,
    ShardingType,
    Storage,
    TableSpec,
    Topology,
    Traffic,
)

__all__ = ["EmbeddingCostModel", "PRECISIONS"]

PRECISIONS = {2: "fp16", 4: "fp32", 8: "fp64"}


@dataclass(frozen=True, kw_only=True)
class EmbeddingCostModel(CostModel):
    """Bytes per step of embedding shards, vectorised over shards (array arguments broadcast): the default
    `CostModel`.

    Args:
        batch_size: global batch B, split over the K ranks (2048: a typical multi-GPU DLRM step; the
            single-process Kaggle recipe uses 128 per step).
        element_bytes: bytes per weight (4 = fp32).
        optimizer_slots: optimizer state per weight, in weights: 0 for SGD, 1 for Adagrad, 2 for Adam.
        row_slots: optimizer state per row of every shard, in weights: 1 for row-wise Adagrad (one sum of squares
            per row, whatever its columns; a column-wise shard keeps its own), 0 otherwise.
        index_bytes: bytes per id and per length in the input all-to-all (int64).
        lookup_passes: gather forward (1) plus read and write of the sparse update backward (2).
        dp_grad: how the engine sums data-parallel gradients, "sparse" (its default) or "dense".
    """

    batch_size: int = 2048
    element_bytes: int = 4
    optimizer_slots: float = 0.0
    row_slots: float = 0.0
    index_bytes: int = 8
    lookup_passes: float = 3.0
    dp_grad: str = "sparse"

    def __post_init__(self) -> None:
        for key in ("batch_size", "element_bytes", "index_bytes"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{key} must be an integer >= 1, got {v!r}")
        if not self.optimizer_slots >= 0:
            raise ConfigError(f"optimizer_slots must be >= 0 (SGD 0, Adagrad 1, Adam 2), got {self.optimizer_slots}")
        if not self.row_slots >= 0:
            raise ConfigError(f"row_slots must be >= 0 (row-wise Adagrad 1), got {self.row_slots}")
        if self.dp_grad not in ("sparse", "dense"):
            raise ConfigError(f"dp_grad must be 'sparse' or 'dense', got {self.dp_grad!r}")
        if not self.lookup_passes > 0:
            raise ConfigError(f"lookup_passes must be > 0, got {self.lookup_passes}")

    # --- per shard, vectorised ---------------------------------------------------------------------------
    def server_traffic(self, k: int, pooling, share, cols) -> Traffic:
        """What serving one model-parallel shard costs its own rank. Shapes: broadcastable arrays -> same."""
        b, e = self.batch_size / k, self.element_bytes
        ids = b * (share * pooling + 1) * self.index_bytes  # ids + lengths one client sends this shard
        pooled = b * cols * e  # pooled (partial) vectors of one client's samples
        return Traffic(
            lookup=self.lookup_passes * self.batch_size * share * pooling * cols * e,
            a2a_in=(k - 1) * (ids + pooled),  # ids forward + pooled gradients backward
            a2a_out=(k - 1) * pooled,
        )

    def client_traffic(self, k: int, pooling, share, cols) -> Traffic:
        """What one model-parallel shard costs each rank that does not hold it (zero when K == 1)."""
        b, e = self.batch_size / k, self.element_bytes
        ids = b * (share * pooling + 1) * self.index_bytes
        pooled = b * cols * e
        on = 1.0 if k > 1 else 0.0
        return Traffic(lookup=0.0 * pooled, a2a_in=on * pooled, a2a_out=on * (ids + pooled))

    def replica_traffic(self, k: int, rows, dim, pooling, unique=None) -> Traffic:
        """What a data-parallel table costs every rank. ``unique``: distinct ids per rank per step (sparse mode;
        default ``expected_unique`` for uniform ids). Shapes: broadcastable arrays -> same."""
        e = self.element_bytes
        if self.dp_grad == "dense":
            sync = 2.0 * (k - 1) / k * rows * dim * e
        else:
            u = self.expected_unique(rows, self.batch_size / k * pooling) if unique is None else unique
            sync = (k - 1) * (self.index_bytes + u * (self.index_bytes + dim * e))
        return Traffic(lookup=self.lookup_passes * (self.batch_size / k) * pooling * dim * e, allreduce=sync)

    @staticmethod
    def expected_unique(rows, draws, probs: np.ndarray | None = None):
        """Expected distinct rows among ``draws`` ids: uniform over ``rows``, or with per-row ``probs``.

        sum over rows of 1 - (1 - p)^draws, in log space so that tiny p and huge draws stay exact.
        """
        if probs is None:
            rows = np.asarray(rows, dtype=np.float64)
            return rows * -np.expm1(draws * np.log1p(-1.0 / rows))
        return float(np.sum(-np.expm1(draws * np.log1p(-np.minimum(probs, 1.0)))))

    def replica_unique(self, tables, k: int) -> np.ndarray:
        """Expected distinct ids of each table a rank touches per step: float64 (T,), one array pass for the
        tables without a histogram (``table_unique`` for those with one)."""
        rows = np.array([t.num_rows for t in tables], dtype=np.int64)  # (T,)
        pool = np.array([t.pooling_factor for t in tables], dtype=np.float64)  # (T,)
        unique = self.expected_unique(rows, self.batch_size / k * pool)  # (T,) uniform ids
        for t, spec in enumerate(tables):
            if spec.id_frequencies is not None:
                unique[t] = self.table_unique(spec, k)
        return unique

    def table_unique(self, spec: TableSpec, k: int) -> float:
        """Expected distinct ids of ``spec`` a rank touches per step (histogram bins spread evenly over rows)."""
        draws = self.batch_size / k * spec.pooling_factor
        if spec.id_frequencies is None:
            return float(self.expected_unique(spec.num_rows, draws))
        h = spec.id_frequencies
        edges = np.floor(np.arange(h.size + 1) * spec.num_rows / h.size)
        per_bin = np.diff(edges)  # (H,) rows in each bin
        p = h / h.sum() / np.maximum(per_bin, 1)  # (H,) probability of each row in the bin
        return float(np.sum(per_bin * -np.expm1(draws * np.log1p(-np.minimum(p, 1.0)))))

    def shard_memory(self, rows, cols):
        """Device bytes of a shard's weights and optimizer state."""
        return rows * (cols * (1.0 + self.optimizer_slots) + self.row_slots) * self.element_bytes

    # --- cached tables -----------------------------------------------------------------------------------
    def hit_rate(self, spec: TableSpec, slots) -> np.ndarray:
        """Share of a step's distinct lookups of ``spec`` that a cache of ``slots`` rows serves (array -> array).

        From the table's miss-ratio curve when it has one (linear between its points and from (0, 0); flat past
        the last); otherwise from the id histogram, as the S most frequent rows' share of the distinct ids of a
        global batch (a static cache of the hottest rows, which the "frequency" policy approximates); uniform
        ids without either: S / R.
        """
        slots = np.asarray(slots, dtype=np.float64)
        if spec.cache_curve is not None:
            xs = [0.0] + [float(sl) for sl, _ in spec.cache_curve]
            ys = [0.0] + [h for _, h in spec.cache_curve]
            return np.interp(slots, xs, ys)
        if spec.id_frequencies is None:
            return np.minimum(slots / spec.num_rows, 1.0)
        h = spec.id_frequencies
        edges = np.floor(np.arange(h.size + 1) * spec.num_rows / h.size)
        per_bin = np.diff(edges)  # (H,) rows per bin
        p = h / h.sum() / np.maximum(per_bin, 1)  # (H,) probability of one row of the bin
        seen = -np.expm1(self.batch_size * spec.pooling_factor * np.log1p(-np.minimum(p, 1.0)))  # (H,) P(in batch)
        order = np.argsort(-p, kind="stable")  # hottest bins first
        rows_cum = np.concatenate([[0.0], np.cumsum(per_bin[order])])  # (H+1,) rows in the hottest bins
        seen_cum = np.concatenate([[0.0], np.cumsum((per_bin * seen)[order])])  # expected distinct ids there
        return np.interp(slots, rows_cum, seen_cum) / max(seen_cum[-1], 1e-300)

    @staticmethod
    def cache_index_bytes(rows, slots):
        """Host bytes of a cache's maps and policy state: int64 row -> slot and score per row, int64 slot -> row
        and free-list entry per slot (``haloflow.cache.SlotDirectory.nbytes``)."""
        return 16 * (np.asarray(rows) + np.asarray(slots))

    def cached_host_traffic(self, spec: TableSpec, slots) -> np.ndarray:
        """Host <-> device bytes per step of ``spec`` cached in ``slots`` device rows (on the rank holding it)."""
        u = self.table_unique(spec, 1)  # distinct ids of the global batch: the holder serves every rank
        misses = u * (1.0 - self.hit_rate(spec, slots))
        return 2.0 * misses * (spec.dim * (1.0 + self.optimizer_slots) + self.row_slots) * self.element_bytes

    # --- describing tables (for messages) ----------------------------------------------------------------
    def describe(self, spec: TableSpec) -> str:
        """``10,131,227 x 16 fp32 + optimizer state = 1.21 GiB``."""
        precision = PRECISIONS.get(self.element_bytes, f"{self.element_bytes}-byte")
        opt = " + optimizer state" if self.optimizer_slots > 0 or self.row_slots > 0 else ""
        return f"{spec.num_rows:,} x {spec.dim} {precision}{opt} = {gib(self.shard_memory(spec.num_rows, spec.dim))}"

    # --- a whole plan ------------------------------------------------------------------------------------
    def rank_costs(self, plan: ShardingPlan, specs, topology: Topology) -> tuple[RankCost, ...]:
        """Per-rank traffic, seconds and memory of ``plan`` (the planner's rating, recomputed from scratch).

        Every rank pays the client side of every model-parallel shard and each data-parallel table; the rank
        holding a shard pays ``server - client`` on top. One array pass over all shards.
        """
        k = plan.world_size
        rank, rows, cols, pool, share, dim, dp = [], [], [], [], [], [], []  # one entry per shard
        device_rows, host = [], []  # rows held on the device (a cached table's slots); host traffic per shard
        for tp, spec in zip(plan.tables, specs):
            rank += [s.rank for s in tp.shards]
            rows += [s.num_rows for s in tp.shards]
            cols += [s.num_cols for s in tp.shards]
            pool += [spec.pooling_factor] * len(tp.shards)
            dim += [spec.dim] * len(tp.shards)
            dp += [tp.sharding is ShardingType.DATA_PARALLEL] * len(tp.shards)
            share.append(self.shard_shares(tp, spec))
            cached = tp.sharding is ShardingType.CACHED
            device_rows += [tp.cache_rows if cached else s.num_rows for s in tp.shards]
            host += [float(self.cached_host_traffic(spec, tp.cache_rows)) if cached else 0.0 for _ in tp.shards]
        rank, rows, cols, dim = (np.array(x, np.int64) for x in (rank, rows, cols, dim))
        device_rows, host = np.array(device_rows, np.int64), np.array(host, np.float64)
        pool, dp = np.array(pool, np.float64), np.array(dp, bool)
        share = np.concatenate(share) if share else np.zeros(0)
        # Data-parallel replicas: shard on rank r costs r its replica traffic.
        unique = np.array([self.table_unique(spec, k) for tp, spec in zip(plan.tables, specs)
                           for _ in tp.shards if tp.sharding is ShardingType.DATA_PARALLEL])
        rep = self.replica_traffic(k, rows[dp], dim[dp], pool[dp], unique)
        # Model-parallel shards: client side everywhere, server - client where they live.
        mp = ~dp
        server = self.server_traffic(k, pool[mp], share[mp], cols[mp])
        client = self.client_traffic(k, pool[mp], share[mp], cols[mp])
        extra = server - client + Traffic(host=host[mp])

        def per_rank(rep_x, client_x, extra_x) -> np.ndarray:  # (K,); fields may be scalars (0.0)
            n_dp, n_mp = int(dp.sum()), int(mp.sum())
            return (np.bincount(rank[dp], np.broadcast_to(rep_x, n_dp), k)
                    + np.broadcast_to(client_x, n_mp).sum()
                    + np.bincount(rank[mp], np.broadcast_to(extra_x, n_mp), k))

        fields = {f: per_rank(getattr(rep, f), getattr(client, f), getattr(extra, f))
                  for f in ("lookup", "a2a_in", "a2a_out", "allreduce", "host")}
        memory = np.bincount(rank, self.shard_memory(device_rows, cols).astype(np.float64), k)  # (K,)
        cached = device_rows != rows
        host_rows = np.where(cached, rows, 0)  # a cached table: every row in host memory, and its cache's maps
        host_bytes = self.shard_memory(host_rows, cols) + self.cache_index_bytes(host_rows, np.where(cached, device_rows, 0))
        in_host = np.bincount(rank, np.asarray(host_bytes, dtype=np.float64), k)  # (K,)
        out = []
        for j in range(k):
            t = Traffic(**{f: float(v[j]) for f, v in fields.items()})
            out.append(RankCost(j, float(topology.seconds(t)), Storage(device=float(memory[j]),
                                                                       host=float(in_host[j])), t))
        return tuple(out)

    @staticmethod
    def shard_shares(tp, spec: TableSpec) -> np.ndarray:
        """Share of the table's lookups each shard serves: its rows' share (row-wise), else all of them."""
        if tp.sharding is not ShardingType.ROW_WISE:
            return np.ones(len(tp.shards))
        bounds = np.array([s.row_offset for s in tp.shards] + [spec.num_rows])
        return spec.lookup_share(bounds)


def gib(nbytes: float) -> str:
    """Bytes as ``1.21 GiB``; below 0.01 GiB in the largest unit that keeps a leading digit (``5.00 MiB``)."""
    if abs(nbytes) >= 0.01 * 2**30 or nbytes == 0:
        return f"{nbytes / 2**30:.2f} GiB"
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"
