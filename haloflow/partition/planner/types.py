"""Value types and stage interfaces of the embedding-table sharding planner.

A plan says, for every embedding table, how it is cut into shards and which rank holds each shard::

    table t: num_rows x dim                      sharding types (K = world size)

         col 0 ........ dim-1
    row 0 +----------------+                     DATA_PARALLEL  one full shard on every rank 0..K-1;
          |                |                                    gradients all-reduced
          |   TABLE_WISE   |  -> rank r          TABLE_WISE     one full shard on one rank
          |                |
          +----------------+                     ROW_WISE       row ranges on distinct ranks, all columns:
          | rows a..b-1    |  -> rank p                         contiguous, ascending, covering every row;
          +----------------+                                    ids are bucketised by row range, each shard
          | rows b..R-1    |  -> rank q                         returns partial sums (reduce-scatter)
          +----------------+
                                                 COLUMN_WISE    column ranges on distinct ranks, all rows:
          +--------+-------+                                    contiguous, ascending, covering every column;
          | cols   | cols  |                                    every shard sees every id
          | 0..c-1 | c..D-1|
          +--------+-------+
            rank p   rank q

    Shard(rank, row_offset, num_rows, col_offset, num_cols)   one rectangle of the table
    TablePlan(table, table_index, sharding, shards)           one table
    ShardingPlan(world_size, tables, per_rank)                tables in table_index order, 0..T-1

    CACHED         one full shard on one rank, like TABLE_WISE, but its rows and optimizer state live in host
                   memory (``Storage.host``) and only ``cache_rows`` hot rows on the device (``Storage.device``);
                   the trainer builds a ``haloflow.cache.CachedStore`` of that many slots for it

    TablePlan(..., cache_rows=S)                              S >= 1 for a cached table, None for every other

The search runs as a pipeline of small stages, each an abstract class here with one default strategy per file::

    reserve (StorageReservation) -> enumerate (ShardingOptionEnumerator) -> propose (Proposer)
        -> partition (Partitioner) -> rate (slowest rank's cost), feedback to the proposer, repeat

    CostModel (default EmbeddingCostModel, cost_model.py) prices what the stages compare: the enumerator asks it
    for every option's traffic and memory, messages for a table's size, the planner for the final plan's
    per-rank cost
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from haloflow.errors import ConfigError, PlanError

__all__ = [
    "ShardingType",
    "DEFAULT_SHARDING_TYPES",
    "TableSpec",
    "Shard",
    "TablePlan",
    "Storage",
    "Traffic",
    "RankCost",
    "ShardingPlan",
    "Topology",
    "ShardingOption",
    "OptionSet",
    "Placement",
    "CostModel",
    "StorageReservation",
    "Enumerator",
    "Proposer",
    "Partitioner",
    "PLAN_FORMAT",
    "PLAN_VERSION",
]

PLAN_FORMAT = "haloflow.sharding_plan"
_MAX_WEIGHTS = 2**62  # rows x dim of one table: its bytes (x 4, x optimizer slots) stay within an int64
PLAN_VERSION = 1


class ShardingType(str, Enum):
    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    CACHED = "cached"


# The kinds a plan may use unless told otherwise; ``CACHED`` is opt-in (it trades step time for device memory).
DEFAULT_SHARDING_TYPES = (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.ROW_WISE,
                          ShardingType.COLUMN_WISE)


@dataclass(frozen=True, kw_only=True, eq=False)
class TableSpec:
    """One embedding table as the planner sees it.

    Args:
        name: unique table name (``"t0"``, ``"C7"``).
        num_rows: rows (the feature's cardinality), >= 1.
        dim: embedding dimension, >= 1.
        pooling_factor: mean ids per sample for this feature (1.0 for one-hot Criteo), > 0.
        id_frequencies: optional lookup histogram, float (H,), 1 <= H <= num_rows, non-negative, not all zero:
            bin h counts lookups of rows ``floor(h*R/H) .. floor((h+1)*R/H)-1``; H == num_rows is per-row counts.
            Row-wise shards then carry the lookup share of their rows instead of a uniform share.
        cache_curve: optional miss-ratio curve of the table, ``((slots, hit_rate), ...)`` with slots ascending in
            1..num_rows and hit rates in [0, 1] (``haloflow.cache.mrc.miss_ratio_curve`` on a trace of the table's
            ids; ``cache_sizing.with_cache_curves`` fills it): the sizes a ``CACHED`` option may take and their
            hit rates. Without one, the planner estimates hit rates from ``id_frequencies`` (or uniform ids).

    ``eq=False``: a table holds an array, so equality is identity (compare ``name`` when that is meant).
    """

    name: str
    num_rows: int
    dim: int
    pooling_factor: float = 1.0
    id_frequencies: np.ndarray | None = None
    cache_curve: tuple[tuple[int, float], ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"table name must be a non-empty string, got {self.name!r}")
        for key in ("num_rows", "dim"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"table {self.name}: {key} must be an integer >= 1, got {v!r}")
        if self.num_rows * self.dim > _MAX_WEIGHTS:  # past any machine; also past the int64 the cost model uses
            raise ConfigError(f"table {self.name}: {self.num_rows:,} rows x {self.dim:,} columns is more weights than "
                              f"a 64-bit index reaches (at most {_MAX_WEIGHTS:,})")
        pf = self.pooling_factor
        if isinstance(pf, bool) or not isinstance(pf, (int, float, np.floating, np.integer)) or not pf > 0 \
                or not math.isfinite(pf):
            raise ConfigError(f"table {self.name}: pooling_factor must be a finite number > 0, got {pf!r}")
        if self.id_frequencies is not None:
            h = np.asarray(self.id_frequencies, dtype=np.float64)
            if h.ndim != 1 or not 1 <= h.size <= self.num_rows:
                raise ConfigError(
                    f"table {self.name}: id_frequencies must be 1-D with 1..num_rows={self.num_rows} bins, "
                    f"got shape {h.shape}"
                )
            if not np.all(np.isfinite(h)) or np.any(h < 0) or h.sum() <= 0:
                raise ConfigError(f"table {self.name}: id_frequencies must be finite, >= 0 and not all zero")
            object.__setattr__(self, "id_frequencies", h)
        if self.cache_curve is not None:
            object.__setattr__(self, "cache_curve", _check_curve(self.name, self.num_rows, self.cache_curve))

    def lookup_share(self, row_bounds: np.ndarray) -> np.ndarray:
        """Fraction of this table's lookups that fall in each row range ``[bounds[i], bounds[i+1])``.

        Uniform over rows without a histogram; otherwise the histogram mass, a bin split linearly when a range
        boundary cuts through it. Shapes: row_bounds int64 (S+1,) from 0 to num_rows -> float64 (S,).
        """
        b = np.asarray(row_bounds, dtype=np.float64)
        if self.id_frequencies is None:
            return np.diff(b) / self.num_rows
        h = self.id_frequencies
        edges = np.floor(np.arange(h.size + 1) * self.num_rows / h.size)  # (H+1,) bin row edges
        cum = np.concatenate([[0.0], np.cumsum(h)]) / h.sum()  # (H+1,) lookup share below each edge
        return np.diff(np.interp(b, edges, cum))


def _check_curve(name: str, num_rows: int, curve) -> tuple[tuple[int, float], ...]:
    try:
        points = tuple((int(sl), float(h)) for sl, h in curve)
    except (TypeError, ValueError):
        raise ConfigError(f"table {name}: cache_curve must be pairs (slots, hit_rate), got {curve!r}",
                          field="cache_curve") from None
    slots = [sl for sl, _ in points]
    if not points or slots != sorted(set(slots)) or slots[0] < 1 or slots[-1] > num_rows:
        raise ConfigError(f"table {name}: cache_curve slots must ascend, without repeats, within 1..{num_rows}; "
                          f"got {slots}", field="cache_curve")
    if any(not 0.0 <= h <= 1.0 for _, h in points):
        raise ConfigError(f"table {name}: cache_curve hit rates must be in [0, 1], got {[h for _, h in points]}",
                          field="cache_curve")
    return points


@dataclass(frozen=True)
class Shard:
    """Rows ``row_offset .. row_offset+num_rows-1`` x columns ``col_offset .. col_offset+num_cols-1`` on ``rank``."""

    rank: int
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int

    def __post_init__(self) -> None:
        if self.rank < 0 or self.row_offset < 0 or self.col_offset < 0 or self.num_rows < 1 or self.num_cols < 1:
            raise ConfigError(f"shard fields must be rank/offsets >= 0 and sizes >= 1, got {self}")


@dataclass(frozen=True)
class TablePlan:
    """How one table is sharded (see the module docstring for what each ``sharding`` requires of ``shards``).

    ``cache_rows``: device slots of a ``CACHED`` table (its hot rows); None for every other kind.
    """

    table: str
    table_index: int
    sharding: ShardingType
    shards: tuple[Shard, ...]
    cache_rows: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharding", ShardingType(self.sharding))
        object.__setattr__(self, "shards", tuple(self.shards))
        if not self.shards:
            raise ConfigError(f"table {self.table}: a table plan needs at least one shard")
        cached = self.sharding is ShardingType.CACHED
        c = self.cache_rows
        if cached and (isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1):
            raise ConfigError(f"table {self.table}: a cached table needs cache_rows, an integer >= 1 (its device "
                              f"slots), got {c!r}", field="cache_rows")
        if not cached and c is not None:
            raise ConfigError(f"table {self.table}: cache_rows {c!r} is only for sharding 'cached', not "
                              f"{self.sharding.value!r}", field="cache_rows")
        if cached:
            object.__setattr__(self, "cache_rows", int(c))

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(s.rank for s in self.shards)


@dataclass(frozen=True)
class Storage:
    """Bytes held on the device and in host memory; adds, subtracts and compares like a vector.

    ``fits_in(budget)``: every component <= the budget's.
    """

    device: float = 0
    host: float = 0

    def __add__(self, other: Storage) -> Storage:
        return Storage(self.device + other.device, self.host + other.host)

    def __sub__(self, other: Storage) -> Storage:
        return Storage(self.device - other.device, self.host - other.host)

    def __mul__(self, k: float) -> Storage:
        return Storage(self.device * k, self.host * k)

    __rmul__ = __mul__

    def fits_in(self, budget: Storage) -> bool:
        return self.device <= budget.device and self.host <= budget.host


@dataclass(frozen=True)
class Traffic:
    """Bytes one rank moves per training step (forward + backward) for its embedding work.

    lookup: bytes read from and written to its tables (gather forward, scatter-add of gradients backward);
    a2a_in / a2a_out: bytes received / sent in the all-to-alls (ids, pooled vectors, their gradients);
    allreduce: bytes each rank sends in the ring all-reduce of data-parallel tables' gradients;
    host: bytes a cached table moves between host memory and its device cache (misses loaded, victims written
    back, with their optimizer state).
    Fields may be floats or equal-shaped arrays (the enumerator evaluates many shards at once).
    """

    lookup: float = 0.0
    a2a_in: float = 0.0
    a2a_out: float = 0.0
    allreduce: float = 0.0
    host: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.lookup + other.lookup, self.a2a_in + other.a2a_in, self.a2a_out + other.a2a_out,
                       self.allreduce + other.allreduce, self.host + other.host)

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(self.lookup - other.lookup, self.a2a_in - other.a2a_in, self.a2a_out - other.a2a_out,
                       self.allreduce - other.allreduce, self.host - other.host)

    def __mul__(self, k) -> Traffic:
        return Traffic(self.lookup * k, self.a2a_in * k, self.a2a_out * k, self.allreduce * k, self.host * k)

    __rmul__ = __mul__


@dataclass(frozen=True)
class RankCost:
    """Estimated per-step cost of one rank: ``cost`` seconds, ``memory`` held, and the ``traffic`` behind it."""

    rank: int
    cost: float
    memory: Storage = field(default_factory=Storage)
    traffic: Traffic = field(default_factory=Traffic)


@dataclass(frozen=True)
class ShardingPlan:
    """The planner's answer: one ``TablePlan`` per table in table order, and the estimated cost of every rank.

    ``per_rank`` may be empty for a hand-made plan. Reading, writing and checking a plan are functions of
    ``plan_io.py`` and ``validate.py`` (``save_plan`` writes a temporary file and renames it).
    """

    world_size: int
    tables: tuple[TablePlan, ...]
    per_rank: tuple[RankCost, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "per_rank", tuple(self.per_rank))
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ConfigError(f"world_size must be an integer >= 1, got {self.world_size!r}")
        ranks = [c.rank for c in self.per_rank]  # compared by length first: a huge world_size builds no list
        if self.per_rank and (len(ranks) != self.world_size or ranks != list(range(len(ranks)))):
            raise ConfigError(f"per_rank must list ranks 0..{self.world_size - 1} in order, "
                              f"got {[c.rank for c in self.per_rank]}")

    # --- queries the sharded engine needs ---------------------------------------------------------------
    def table_plan(self, name: str) -> TablePlan:
        for tp in self.tables:
            if tp.table == name:
                return tp
        raise PlanError(f"plan has no table {name!r}; it has {[tp.table for tp in self.tables]}")

    def shards_on(self, rank: int) -> list[tuple[TablePlan, Shard]]:
        """Every (table plan, shard) held by ``rank``, in table order."""
        return [(tp, s) for tp in self.tables for s in tp.shards if s.rank == rank]

    @property
    def max_cost(self) -> float:
        return max((c.cost for c in self.per_rank), default=0.0)


MAX_WORLD_SIZE = 16_384  # ranks a plan may have: beyond, the planner's search time (linear in K) reaches minutes


@dataclass(frozen=True, kw_only=True)
class Topology:
    """The machines: how many ranks, what memory each may give to embedding tables, and how fast they move bytes.

    Args:
        world_size: ranks K >= 1.
        memory_per_rank: device bytes per rank for tables and optimizer state; one number for all ranks or K.
        lookup_bandwidth: bytes/s a rank reads/writes in embedding lookups (device memory; the default is an
            A100's HBM at a realistic ~60% of its 2 TB/s peak, since gathers are irregular).
        a2a_bandwidth: bytes/s a rank sends plus receives in an all-to-all (default: 25 GB/s, one 200 Gb/s NIC).
        allreduce_bandwidth: bus bandwidth of the ring all-reduce in bytes/s (default: same NIC).
        host_bandwidth: bytes/s between host memory and the device, both ways together, for cached tables'
            misses and write-backs (default: PCIe 4.0 x16 at a realistic ~25 GB/s).
    """

    world_size: int
    memory_per_rank: tuple[float, ...]
    lookup_bandwidth: float = 1.2e12
    a2a_bandwidth: float = 25e9
    allreduce_bandwidth: float = 25e9
    host_bandwidth: float = 25e9

    def __post_init__(self) -> None:
        k = self.world_size
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ConfigError(f"world_size must be an integer >= 1, got {k!r}")
        if k > MAX_WORLD_SIZE:
            raise ConfigError(f"world_size must be <= {MAX_WORLD_SIZE:,}, got {k:,}: the planner's search grows with "
                              f"the ranks (about 1 ms each on 2 cores; a million would take a quarter of an hour)")
        mem = self.memory_per_rank
        mem = (mem,) * k if isinstance(mem, (int, float, np.number)) else tuple(mem)
        if len(mem) == 1 and k > 1:
            mem = mem * k
        if len(mem) != k:
            raise ConfigError(f"memory_per_rank has {len(mem)} entries but world_size is {k}")
        if any(not (m >= 0 and math.isfinite(m)) for m in mem):
            raise ConfigError(f"memory_per_rank must be a finite number of bytes >= 0, got {mem[:4]}")
        object.__setattr__(self, "memory_per_rank", tuple(float(m) for m in mem))
        for key in ("lookup_bandwidth", "a2a_bandwidth", "allreduce_bandwidth", "host_bandwidth"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ConfigError(f"{key} must be a finite number of bytes/s > 0, got {v!r}")

    def seconds(self, t: Traffic):
        """Time for ``t`` (float or array, like ``t``'s fields). Half-duplex links: bytes in and out add up."""
        return (t.lookup / self.lookup_bandwidth + (t.a2a_in + t.a2a_out) / self.a2a_bandwidth
                + t.allreduce / self.allreduce_bandwidth + t.host / self.host_bandwidth)

    @property
    def budgets(self) -> tuple[Storage, ...]:
        return tuple(Storage(device=m, host=0.0) for m in self.memory_per_rank)


@dataclass(frozen=True, eq=False)
class ShardingOption:
    """One way to shard one table, costed but not yet placed.

    The cost of a table to rank j is ``base_cost`` (paid by every rank: data-parallel work, or sending ids to
    and receiving pooled vectors from remote shards) plus ``shard_cost[s]`` for every shard s that j holds
    (the extra work of serving it). Costs are seconds per step; memory is device bytes per shard.

    Shapes: rows, cols, row_offsets, col_offsets, shard_cost, shard_memory: (S,).
    Data-parallel options have S == K with shard s fixed on rank s; others are placed by the partitioner on
    distinct ranks. A ``CACHED`` option has one shard (the whole table) and ``cache_rows`` device slots; its
    ``shard_memory`` is the slots' device bytes (the table itself is in host memory).
    """

    table_index: int
    sharding: ShardingType
    world_size: int
    row_offsets: np.ndarray  # int64 (S,)
    rows: np.ndarray  # int64 (S,)
    col_offsets: np.ndarray  # int64 (S,)
    cols: np.ndarray  # int64 (S,)
    base_cost: float
    shard_cost: np.ndarray  # float64 (S,)
    shard_memory: np.ndarray  # float64 (S,)
    # Derived (the enumerator passes them in, computed for all tables at once; None = compute here):
    total_cost: float | None = None  # sum over all K ranks: K * base + sum of shard costs
    peak_cost: float | None = None  # the most this option alone puts on one rank: base + max shard cost
    max_memory: float | None = None  # largest shard's bytes
    cache_rows: int | None = None  # device slots of a CACHED option

    def __post_init__(self) -> None:
        if self.total_cost is None:
            object.__setattr__(self, "total_cost", float(self.world_size * self.base_cost + self.shard_cost.sum()))
        if self.peak_cost is None:
            object.__setattr__(self, "peak_cost", float(self.base_cost + self.shard_cost.max()))
        if self.max_memory is None:
            object.__setattr__(self, "max_memory", float(self.shard_memory.max()))
        object.__setattr__(self, "fixed_ranks", self.sharding is ShardingType.DATA_PARALLEL)

    fixed_ranks: bool = field(init=False, default=False)  # data-parallel: shard s stays on rank s

    @property
    def num_shards(self) -> int:
        return int(self.rows.size)


@dataclass(frozen=True, eq=False)
class OptionSet:
    """Every costed option of every table: ``options[t]`` lists table t's options, cheapest total cost first."""

    tables: tuple[TableSpec, ...]
    options: tuple[tuple[ShardingOption, ...], ...]
    topology: Topology
    cost_model: CostModel

    def describe(self, t: int) -> str:
        """``t7 (10,131,227 x 16 fp32 + optimizer state = 1.21 GiB)``."""
        return f"{self.tables[t].name} ({self.cost_model.describe(self.tables[t])})"


@dataclass(frozen=True, eq=False)
class Placement:
    """A proposal placed on ranks: ``choice[t]`` indexes ``options[t]``; ``ranks[t]`` (S_t,) holds its shards.

    ``load`` (K,) seconds per rank and ``memory`` (K,) device bytes per rank follow from the two.
    """

    choice: np.ndarray  # int64 (T,)
    ranks: tuple[np.ndarray, ...]  # T arrays, int64 (S_t,)
    load: np.ndarray  # float64 (K,)
    memory: np.ndarray  # float64 (K,)

    @property
    def max_load(self) -> float:
        return float(self.load.max())

    def better_than(self, other: Placement, rtol: float = 1e-9) -> bool:
        """Lower slowest rank; on a tie, lower second-slowest, and so on (so plateaus still make progress)."""
        a, b = np.sort(self.load)[::-1], np.sort(other.load)[::-1]  # (K,) slowest first
        eps = rtol * max(float(b[0]), 1e-300)
        for x, y in zip(a, b):
            if x < y - eps:
                return True
            if x > y + eps:
                return False
        return False


class CostModel(abc.ABC):
    """Prices shards for the stages: bytes per training step and bytes held (``cost_model.py`` has the formulas).

    Traffic and memory methods are vectorised: array arguments broadcast, and the result has their shape, so
    the enumerator costs one (sharding, shard count) family of every table in one call. ``k`` is the world size.
    """

    @abc.abstractmethod
    def server_traffic(self, k: int, pooling, share, cols) -> Traffic:
        """What serving one model-parallel shard (``share`` of the lookups, ``cols`` columns) costs its rank."""

    @abc.abstractmethod
    def client_traffic(self, k: int, pooling, share, cols) -> Traffic:
        """What the same shard costs each rank that does not hold it."""

    @abc.abstractmethod
    def replica_unique(self, tables: tuple[TableSpec, ...], k: int) -> np.ndarray:
        """Expected distinct ids of each table a rank touches per step: float64 (T,) (``replica_traffic``'s
        ``unique``)."""

    @abc.abstractmethod
    def replica_traffic(self, k: int, rows, dim, pooling, unique=None) -> Traffic:
        """What a data-parallel table costs every rank (``unique`` distinct ids per rank per step)."""

    @abc.abstractmethod
    def cached_host_traffic(self, spec: TableSpec, slots) -> np.ndarray:
        """Host <-> device bytes per step of ``spec`` cached in ``slots`` device rows, on the rank holding it."""

    @abc.abstractmethod
    def shard_memory(self, rows, cols):
        """Bytes of a shard's weights and optimizer state."""

    @abc.abstractmethod
    def describe(self, spec: TableSpec) -> str:
        """The table's size for messages: ``10,131,227 x 16 fp32 + optimizer state = 1.21 GiB``."""

    @abc.abstractmethod
    def rank_costs(self, plan: ShardingPlan, specs, topology: Topology) -> tuple[RankCost, ...]:
        """Per-rank traffic, seconds and memory of a whole plan (the planner's rating of its answer)."""


class StorageReservation(abc.ABC):
    """Stage 1: set aside memory that tables may not use; returns the topology with the budgets left."""

    @abc.abstractmethod
    def reserve(self, topology: Topology, tables: tuple[TableSpec, ...]) -> Topology: ...


class Enumerator(abc.ABC):
    """Stage 2: every sharding option of every table, costed (vectorised over tables)."""

    @abc.abstractmethod
    def enumerate(self, tables: tuple[TableSpec, ...], topology: Topology) -> OptionSet: ...


class Proposer(abc.ABC):
    """Stage 3: proposes which option each table uses, learning from how the last proposal was rated."""

    @abc.abstractmethod
    def load(self, options: OptionSet) -> None: ...

    @abc.abstractmethod
    def propose(self) -> np.ndarray | None:
        """Option index per table (int64 (T,)), or None when the search is over."""

    @abc.abstractmethod
    def feedback(self, placement: Placement | None, failure: PlanError | None = None) -> None:
        """The partitioned proposal (None with ``failure`` when it could not be placed)."""


class Partitioner(abc.ABC):
    """Stage 4: put every shard of a proposal on a rank within memory, balancing the per-rank cost."""

    @abc.abstractmethod
    def partition(self, options: OptionSet, choice: np.ndarray) -> Placement:
        """Raises ``PlanError`` when some shard fits nowhere."""
