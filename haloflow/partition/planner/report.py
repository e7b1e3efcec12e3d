"""A sharding plan as text: one line per table, then one per rank with its cost and memory.

::

    table  rows        dim  sharding     ranks        | rank  cost (us)  lookup  a2a in  a2a out  sync   memory
    C3     10,131,227  16   column_wise  0,1          | 0     112.7      ...
"""

from __future__ import annotations

from haloflow.partition.planner.cost_model import gib
from haloflow.partition.planner.types import ShardingPlan, TableSpec

__all__ = ["plan_report"]


def plan_report(plan: ShardingPlan, specs: tuple[TableSpec, ...], max_tables: int = 40) -> str:
    """Tables (the first ``max_tables``; the rest summed up by kind) and per-rank cost and memory."""
    lines = [f"{'table':<10} {'rows':>12} {'dim':>5} {'pool':>6}  {'sharding':<13} ranks"]
    for tp, spec in list(zip(plan.tables, specs))[:max_tables]:
        ranks = ",".join(str(r) for r in tp.ranks) if len(tp.shards) < plan.world_size or plan.world_size == 1 \
            else "all"
        lines.append(f"{tp.table:<10} {spec.num_rows:>12,} {spec.dim:>5} {spec.pooling_factor:>6.3g}  "
                     f"{tp.sharding.value:<13} {ranks}")
    if len(plan.tables) > max_tables:
        lines.append(f"... {len(plan.tables) - max_tables} more tables")
    kinds: dict[str, int] = {}
    for tp in plan.tables:
        kinds[tp.sharding.value] = kinds.get(tp.sharding.value, 0) + 1
    lines.append("sharding: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    lines.append("")
    lines.append(f"{'rank':>4} {'cost (us)':>10} {'lookup MB':>10} {'a2a in MB':>10} {'a2a out MB':>11} "
                 f"{'sync MB':>8} {'memory':>11}")
    for c in plan.per_rank:
        t = c.traffic
        lines.append(f"{c.rank:>4} {c.cost * 1e6:>10.1f} {t.lookup / 1e6:>10.3f} {t.a2a_in / 1e6:>10.3f} "
                     f"{t.a2a_out / 1e6:>11.3f} {t.allreduce / 1e6:>8.3f} {gib(c.memory.device):>11}")
    if plan.per_rank:
        costs = [c.cost for c in plan.per_rank]
        lines.append(f"slowest rank {max(costs) * 1e6:.1f} us per step; slowest / mean "
                     f"{max(costs) / (sum(costs) / len(costs)):.3f}")
    return "\n".join(lines)
