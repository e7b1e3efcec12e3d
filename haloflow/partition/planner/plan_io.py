"""A ``ShardingPlan`` as JSON: ``plan_to_json`` / ``plan_from_json``, and files (``save_plan`` / ``load_plan``).

::

    {"format": "haloflow.sharding_plan", "version": 1, "world_size": K,
     "tables": [{"table": NAME, "table_index": i, "sharding": "row_wise",
                 "shards": [{"rank": r, "row_offset": .., "num_rows": .., "col_offset": .., "num_cols": ..}]},
                {"table": NAME, "table_index": j, "sharding": "cached", "cache_rows": S, "shards": [one full]}],
     "per_rank": [{"rank": r, "cost_s": .., "memory": {...}, "traffic": {...}}]}

Parsing lives in ``validate.plan_from_dict`` (every mistake names the file and the field); writing goes to a
temporary file that is renamed, so a reader never sees half a plan. Kept apart from ``types.py`` so that the
value types import nothing that imports them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from haloflow.errors import PlanError
from haloflow.partition.planner.types import PLAN_FORMAT, PLAN_VERSION, ShardingPlan
from haloflow.partition.planner.validate import plan_from_dict
from haloflow.utils.atomic import atomic_write_text

__all__ = ["plan_to_dict", "plan_to_json", "plan_from_json", "save_plan", "load_plan"]


def plan_to_dict(plan: ShardingPlan) -> dict:
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "world_size": plan.world_size,
        "tables": [
            {"table": tp.table, "table_index": tp.table_index, "sharding": tp.sharding.value,
             **({"cache_rows": tp.cache_rows} if tp.cache_rows is not None else {}),
             "shards": [s.__dict__.copy() for s in tp.shards]}
            for tp in plan.tables
        ],
        "per_rank": [
            {"rank": c.rank, "cost_s": c.cost, "memory": c.memory.__dict__.copy(), "traffic": c.traffic.__dict__.copy()}
            for c in plan.per_rank
        ],
    }


def plan_to_json(plan: ShardingPlan) -> str:
    return json.dumps(_plain(plan_to_dict(plan)), indent=1)


def plan_from_json(text: str, source: str = "<plan>") -> ShardingPlan:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as err:
        raise PlanError(f"{source}:{err.lineno}: not valid JSON ({err.msg})") from None
    return plan_from_dict(d, source)


def save_plan(plan: ShardingPlan, path: str | os.PathLike) -> Path:
    return atomic_write_text(path, plan_to_json(plan) + "\n")


def load_plan(path: str | os.PathLike) -> ShardingPlan:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"plan file {path} not found; expected a JSON plan from `haloflow plan-tables --out`")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise PlanError(f"{path}: not text ({err.reason} at byte {err.start}): expected a JSON plan") from None
    return plan_from_json(text, source=str(path))


def _plain(x):
    """numpy scalars -> Python numbers, so ``json.dumps`` accepts them."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x
