"""haloflow: exact distributed training of GNNs and recommendation models on torch.distributed.

The errors are imported here; the entry points of the heavier subpackages (torch, pyarrow, numba) are imported
on first use, so ``import haloflow`` stays cheap::

    import haloflow
    summary = haloflow.partition_dataset(dataset, haloflow.PartitionConfig(num_parts=4), "parts")
    result = haloflow.train_gcn(haloflow.GCNTrainConfig(partitions="parts"))

Importing it changes no process setting (OpenMP's wait policy, glibc's malloc thresholds, torch's thread count):
the CLI and ``Runtime.start`` apply those (``haloflow.host``).
"""

from haloflow._lazy import lazy_getattr
from haloflow.engine.families import lazy_names
from haloflow.errors import (
    CheckpointError,
    ConfigError,
    DistributedError,
    HaloflowError,
    InputFormatError,
    OutputExistsError,
    PartitionFormatError,
    PlanError,
)

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DistributedError",
    "HaloflowError",
    "InputFormatError",
    "OutputExistsError",
    "PartitionFormatError",
    "PlanError",
    "__version__",
]

# name -> module that defines it, imported on first use.
_LAZY = {
    "read_dataset": "haloflow.data.readers",
    "PartitionConfig": "haloflow.partition.api",
    "partition_graph": "haloflow.partition.api",
    "partition_dataset": "haloflow.partition.pipeline",
    "load_partition": "haloflow.partition.format",
    "plan_tables": "haloflow.partition.planner.planner",
    **lazy_names(),  # every family's train_<name>, config and result (haloflow/engine/families.py)
    "CheckpointConfig": "haloflow.engine.run_config",
    "RuntimeConfig": "haloflow.engine.run_config",
}
__all__ += list(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY)
