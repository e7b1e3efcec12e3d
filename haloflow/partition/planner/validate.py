"""Checking a sharding plan against its tables, and reading one back from JSON.

``validate_plan`` enforces the layout rules of ``types.py`` (one rule per branch, each failure a ``PlanError``
naming the table and what was found versus expected); ``plan_from_dict`` parses the JSON form with messages that
name the field.
"""

from __future__ import annotations

from haloflow.errors import ConfigError, PlanError
from haloflow.partition.planner.types import (
    PLAN_FORMAT,
    PLAN_VERSION,
    RankCost,
    Shard,
    ShardingPlan,
    ShardingType,
    Storage,
    TablePlan,
    TableSpec,
    Traffic,
)

__all__ = ["validate_plan", "plan_from_dict"]


def validate_plan(plan: ShardingPlan, specs: list[TableSpec] | tuple[TableSpec, ...]) -> None:
    """Raise ``PlanError`` unless ``plan`` shards exactly ``specs`` (same order) by the rules of its types."""
    k = plan.world_size
    if len(plan.tables) != len(specs):
        raise PlanError(f"plan has {len(plan.tables)} tables but the model has {len(specs)}")
    for i, (tp, spec) in enumerate(zip(plan.tables, specs)):
        if tp.table_index != i or tp.table != spec.name:
            raise PlanError(f"plan entry {i} is table {tp.table!r} (index {tp.table_index}); "
                            f"expected {spec.name!r} (index {i})")
        where = f"table {spec.name} ({tp.sharding.value})"
        bad = [s.rank for s in tp.shards if not 0 <= s.rank < k]
        if bad:
            raise PlanError(f"{where}: ranks {bad} outside 0..{k - 1}")
        full = [s for s in tp.shards if (s.row_offset, s.num_rows, s.col_offset, s.num_cols)
                == (0, spec.num_rows, 0, spec.dim)]
        if tp.sharding is ShardingType.DATA_PARALLEL:
            if len(full) != len(tp.shards) or sorted(tp.ranks) != list(range(k)):
                raise PlanError(f"{where}: needs one full {spec.num_rows} x {spec.dim} shard on every rank "
                                f"0..{k - 1}, got {_describe(tp.shards)}")
        elif tp.sharding in (ShardingType.TABLE_WISE, ShardingType.CACHED):
            if len(tp.shards) != 1 or len(full) != 1:
                raise PlanError(f"{where}: needs exactly one full {spec.num_rows} x {spec.dim} shard, "
                                f"got {_describe(tp.shards)}")
            if tp.sharding is ShardingType.CACHED and not 1 <= tp.cache_rows <= spec.num_rows:
                raise PlanError(f"{where}: cache_rows {tp.cache_rows} outside 1..{spec.num_rows} (the table's rows)")
        else:
            rows = tp.sharding is ShardingType.ROW_WISE
            _check_ranges(where, tp.shards, rows, spec.num_rows if rows else spec.dim,
                          spec.dim if rows else spec.num_rows)
            if len(set(tp.ranks)) != len(tp.shards):
                raise PlanError(f"{where}: shards must be on distinct ranks, got ranks {list(tp.ranks)}")


def _check_ranges(where: str, shards: tuple[Shard, ...], rows: bool, extent: int, other: int) -> None:
    """Row (or column) ranges contiguous, ascending and covering ``0..extent-1``; the other axis whole."""
    axis, other_axis = ("row", "column") if rows else ("column", "row")
    pos = 0
    for s in shards:
        off, n = (s.row_offset, s.num_rows) if rows else (s.col_offset, s.num_cols)
        o_off, o_n = (s.col_offset, s.num_cols) if rows else (s.row_offset, s.num_rows)
        if off != pos:
            raise PlanError(f"{where}: {axis} ranges must be contiguous and ascending from 0; shard on rank "
                            f"{s.rank} starts at {axis} {off}, expected {pos}")
        if (o_off, o_n) != (0, other):
            raise PlanError(f"{where}: every shard must hold all {other} {other_axis}s; shard on rank {s.rank} "
                            f"holds {other_axis}s {o_off}..{o_off + o_n - 1}")
        pos += n
    if pos != extent:
        raise PlanError(f"{where}: shards cover {axis}s 0..{pos - 1}, expected 0..{extent - 1}")


def _describe(shards: tuple[Shard, ...]) -> str:
    return ", ".join(f"rank {s.rank}: rows {s.row_offset}+{s.num_rows} cols {s.col_offset}+{s.num_cols}"
                     for s in shards)


def plan_from_dict(d: object, source: str = "<plan>") -> ShardingPlan:
    """Parse the dict of ``ShardingPlan.to_dict``; every mistake is a ``PlanError`` naming ``source`` and field."""
    if not isinstance(d, dict):
        raise PlanError(f"{source}: expected a JSON object, got {type(d).__name__}")
    if d.get("format") != PLAN_FORMAT:
        raise PlanError(f"{source}: 'format' is {d.get('format')!r}, expected {PLAN_FORMAT!r}")
    if d.get("version") != PLAN_VERSION:
        raise PlanError(f"{source}: plan format version {d.get('version')!r}, this haloflow reads {PLAN_VERSION}")
    try:
        tables = []
        for i, t in enumerate(_get(d, "tables", list, source)):
            where = f"{source}: tables[{i}]"
            shards = tuple(Shard(**{k: _get(s, k, int, where) for k in
                                    ("rank", "row_offset", "num_rows", "col_offset", "num_cols")})
                           for s in _get(t, "shards", list, where))
            kind = _get(t, "sharding", str, where)
            if kind not in {k.value for k in ShardingType}:
                raise PlanError(f"{where}: field 'sharding' is {kind!r}, expected one of "
                                f"{[k.value for k in ShardingType]}")
            cache_rows = _get(t, "cache_rows", int, where) if "cache_rows" in t else None
            tables.append(TablePlan(_get(t, "table", str, where), _get(t, "table_index", int, where),
                                    ShardingType(kind), shards, cache_rows))
        per_rank = []
        for i, c in enumerate(_get(d, "per_rank", list, source)):
            where = f"{source}: per_rank[{i}]"
            per_rank.append(RankCost(_get(c, "rank", int, where), float(_get(c, "cost_s", (int, float), where)),
                                     Storage(**_get(c, "memory", dict, where)),
                                     Traffic(**_get(c, "traffic", dict, where))))
        return ShardingPlan(_get(d, "world_size", int, source), tuple(tables), tuple(per_rank))
    except (ConfigError, TypeError, ValueError) as err:
        if isinstance(err, PlanError):
            raise
        raise PlanError(f"{source}: {err}") from None


def _get(d: object, key: str, kind, where: str):
    if not isinstance(d, dict) or key not in d:
        raise PlanError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise PlanError(f"{where}: field {key!r} is {v!r}, expected {getattr(kind, '__name__', kind)}")
    return v
