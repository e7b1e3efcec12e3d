"""Graph partitioning: assign nodes to K parts, relabel, build each part's halo, write and read partition folders.

The embedding-table sharding planner is the subpackage ``haloflow.partition.planner``.
"""

from haloflow.partition.api import METHODS, PartitionConfig, partition_graph
from haloflow.partition.format import (
    PartitionMeta,
    load_meta,
    load_new_to_orig,
    load_partition,
    part_loads,
    save_partitioned,
    verify_partition,
)
from haloflow.partition.halo import HaloBuilder, HaloIndex, build_parts
from haloflow.partition.pipeline import PartitionSummary, partition_dataset, read_input
from haloflow.partition.relabel import Relabelling, relabel
from haloflow.partition.stats import PartitionStats, format_stats, partition_stats
from haloflow.partition.types import Assignment, GraphPart, PartitionBook

__all__ = [
    "METHODS",
    "PartitionConfig",
    "partition_graph",
    "Relabelling",
    "relabel",
    "Assignment",
    "GraphPart",
    "PartitionBook",
    "HaloBuilder",
    "HaloIndex",
    "build_parts",
    "PartitionMeta",
    "save_partitioned",
    "load_meta",
    "load_partition",
    "load_new_to_orig",
    "part_loads",
    "verify_partition",
    "PartitionStats",
    "partition_stats",
    "format_stats",
    "PartitionSummary",
    "partition_dataset",
    "read_input",
]
