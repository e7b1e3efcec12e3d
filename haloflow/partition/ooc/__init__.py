"""The out-of-core partition pipeline: a partition folder for graphs larger than memory, in O(nodes) memory.

Passes (each streaming; see ``pipeline.py``): count rows (``disk_csr.count_rows``), bucket-sort the edges into an
on-disk CSR (``disk_csr.build_disk_csr``), Fennel or random over it (``stream.py``), relabel and route to per-part
buckets (``route.py``), then each part's halo, send lists and arrays (``build.py``). ``budget.py`` plans the chunk
sizes from ``--memory-budget``; ``scratch.py`` owns the temporary files.
"""

from haloflow.partition.ooc.budget import MemoryPlan, OutOfCoreConfig, plan_memory
from haloflow.partition.ooc.pipeline import OutOfCoreSummary, partition_out_of_core

__all__ = ["OutOfCoreConfig", "MemoryPlan", "plan_memory", "OutOfCoreSummary", "partition_out_of_core"]
