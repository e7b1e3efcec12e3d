"""Embedding-table sharding planner: reserve -> enumerate -> propose -> partition -> rate (see ``types.py``).

    plan = plan_tables(kaggle_tables(), Topology(world_size=4, memory_per_rank=2 * 2**30))
    save_plan(plan, "plan.json")
"""

from haloflow.partition.planner.cost_model import EmbeddingCostModel
from haloflow.partition.planner.enumerators import ShardingOptionEnumerator
from haloflow.partition.planner.partitioners import GreedyCostPartitioner
from haloflow.partition.planner.plan_io import load_plan, plan_from_json, plan_to_json, save_plan
from haloflow.partition.planner.planner import EmbeddingShardingPlanner, lower_bound, plan_tables, table_wise_plan
from haloflow.partition.planner.proposers import GreedyProposer
from haloflow.partition.planner.report import plan_report
from haloflow.partition.planner.specs import kaggle_tables, load_table_specs, parse_bytes
from haloflow.partition.planner.storage_reservations import FixedFractionReservation
from haloflow.partition.planner.types import (
    CostModel,
    OptionSet,
    Placement,
    RankCost,
    Shard,
    ShardingOption,
    ShardingPlan,
    ShardingType,
    Storage,
    TablePlan,
    TableSpec,
    Topology,
    Traffic,
)
from haloflow.partition.planner.validate import validate_plan

__all__ = [
    "load_plan",
    "plan_from_json",
    "plan_to_json",
    "save_plan",
    "table_wise_plan",
    "CostModel",
    "EmbeddingCostModel",
    "EmbeddingShardingPlanner",
    "FixedFractionReservation",
    "GreedyCostPartitioner",
    "GreedyProposer",
    "OptionSet",
    "Placement",
    "RankCost",
    "Shard",
    "ShardingOption",
    "ShardingOptionEnumerator",
    "ShardingPlan",
    "ShardingType",
    "Storage",
    "TablePlan",
    "TableSpec",
    "Topology",
    "Traffic",
    "kaggle_tables",
    "load_table_specs",
    "lower_bound",
    "parse_bytes",
    "plan_report",
    "plan_tables",
    "validate_plan",
]
