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

# Entry points of the heavier subpackages, imported on first use so `import haloflow` stays cheap.
_LAZY = {
    "train_gcn": "haloflow.engine.train_gcn",
    "GCNTrainConfig": "haloflow.engine.train_gcn",
}
__all__ += list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'haloflow' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
