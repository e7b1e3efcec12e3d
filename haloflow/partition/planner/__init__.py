"""Embedding-table sharding planner: reserve -> enumerate -> propose -> partition -> rate (see ``types.py``)."""

from haloflow.partition.planner.types import (
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

__all__ = [
    "OptionSet",
    "Placement",
    "RankCost",
    "Shard",
    "ShardingOption",
    "ShardingPlan",
    "ShardingType",
    "Storage",
    "TablePlan",
    "TableSpec",
    "Topology",
    "Traffic",
]
