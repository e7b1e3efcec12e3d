"""A sharding plan as text: one line per table, then one per rank with its cost and memory (and, when a table is
cached, its cache rows, and each rank's host traffic and host memory).

::

    table        rows  dim  pool  sharding     ranks
    -----  ----------  ---  ----  -----------  -----
    C3     10,131,227   16     1  column_wise  0,1
    ...
    sharding: 3 column_wise, 23 data_parallel

    rank  cost (us)  lookup MB  ...  memory
    ----  ---------  ---------  ...  --------
       0      112.7      5.112  ...  0.31 GiB
"""

from __future__ import annotations

from collections import Counter

from haloflow.partition.planner.cost_model import gib
from haloflow.partition.planner.types import ShardingPlan, TableSpec
from haloflow.utils.table import format_table

__all__ = ["plan_report"]


def plan_report(plan: ShardingPlan, specs: tuple[TableSpec, ...], max_tables: int = 40) -> str:
    """Tables (the first ``max_tables``; the rest summed up by kind) and per-rank cost and memory."""
    cached = any(tp.cache_rows is not None for tp in plan.tables)
    rows = []
    for tp, spec in list(zip(plan.tables, specs))[:max_tables]:
        every_rank = len(tp.shards) >= plan.world_size and plan.world_size > 1
        ranks = "all" if every_rank else ",".join(str(r) for r in tp.ranks)
        rows.append([tp.table, spec.num_rows, spec.dim, spec.pooling_factor, tp.sharding.value, ranks]
                    + ([tp.cache_rows if tp.cache_rows is not None else ""] if cached else []))
    headers = ["table", "rows", "dim", "pool", "sharding", "ranks"] + (["cache rows"] if cached else [])
    lines = [format_table(headers, rows, float_fmt=".3g")]
    if len(plan.tables) > max_tables:
        lines.append(f"... {len(plan.tables) - max_tables} more tables")
    kinds = Counter(tp.sharding.value for tp in plan.tables)
    lines.append("sharding: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    lines.append("")
    headers = ["rank", "cost (us)", "lookup MB", "a2a in MB", "a2a out MB", "sync MB", "memory"]
    rows = [[c.rank, c.cost * 1e6, c.traffic.lookup / 1e6, c.traffic.a2a_in / 1e6, c.traffic.a2a_out / 1e6,
             c.traffic.allreduce / 1e6, gib(c.memory.device)] for c in plan.per_rank]
    if any(c.memory.host for c in plan.per_rank):  # cached tables: their misses' traffic and host-held rows
        headers += ["host MB", "host memory"]
        for row, c in zip(rows, plan.per_rank):
            row += [c.traffic.host / 1e6, gib(c.memory.host)]
    fmts = [".3f", ".1f", ".3f", ".3f", ".3f", ".3f", ".3f", ".3f", ".3f"][:len(headers)]
    lines.append(format_table(headers, rows, float_fmt=fmts))
    if plan.per_rank:
        costs = [c.cost for c in plan.per_rank]
        lines.append(f"slowest rank {max(costs) * 1e6:.1f} us per step; slowest / mean "
                     f"{max(costs) / (sum(costs) / len(costs)):.3f}")
    return "\n".join(lines)
