"""haloflow: exact distributed training of GNNs and recommendation models on torch.distributed."""

from haloflow.errors import (
    ConfigError,
    DistributedError,
    HaloflowError,
    InputFormatError,
    PartitionFormatError,
    PlanError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DistributedError",
    "HaloflowError",
    "InputFormatError",
    "PartitionFormatError",
    "PlanError",
    "__version__",
]
