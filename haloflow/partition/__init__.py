"""haloflow.partition"""

from haloflow.partition.api import METHODS, PartitionConfig, partition_graph
from haloflow.partition.relabel import Relabelling, relabel

__all__ = ["METHODS", "PartitionConfig", "partition_graph", "Relabelling", "relabel"]
