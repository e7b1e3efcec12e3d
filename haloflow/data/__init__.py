"""Graph data: the CSR format, readers for the formats users hold, and generators."""

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.data.paths import data_root

__all__ = ["CSRGraph", "GraphDataset", "data_root"]
from haloflow.data.jagged import JaggedBatch

__all__ += ["JaggedBatch"]
