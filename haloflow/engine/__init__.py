"""Distributed training: process groups, halo exchange and parallel GCN, sharded embeddings and DLRM, trainers.

Most modules here import torch (and some import each other), so the names below are imported on first use:
``from haloflow.engine import train_dlrm`` costs only what ``train_dlrm`` needs. The configs (``run_config.py``,
``<family>/config.py``) and the launcher (``launch.py``, ``families.py``) import no torch.
"""

from haloflow._lazy import lazy_getattr
from haloflow.engine.families import lazy_names

# name -> module that defines it.
_LAZY = {
    # process groups and launching
    "ParallelLayout": "haloflow.engine.runtime",
    "Runtime": "haloflow.engine.runtime",
    "RuntimeConfig": "haloflow.engine.run_config",
    "CheckpointConfig": "haloflow.engine.run_config",
    "init_from_env": "haloflow.engine.runtime",
    "shutdown": "haloflow.engine.runtime",
    "launch_torchrun": "haloflow.engine.launch",
    # GCN
    "HaloExchange": "haloflow.engine.gcn.halo",
    "HaloConfig": "haloflow.engine.gcn.config",
    "ParallelGCN": "haloflow.engine.gcn.parallelize",
    "parallelize_gcn": "haloflow.engine.gcn.parallelize",
    "GradSyncConfig": "haloflow.engine.run_config",
    "BucketedGradSync": "haloflow.engine.grad_sync",
    "predict_epoch": "haloflow.engine.gcn.cost_model",
    "TrainResult": "haloflow.engine.runtime",
    "CommStats": "haloflow.engine.comm",
    # DLRM
    "EmbeddingLayout": "haloflow.engine.dlrm.embedding_layout",
    "predict_step_bytes": "haloflow.engine.dlrm.embedding_layout",
    "ShardedEmbeddingCollection": "haloflow.engine.dlrm.sharded_embedding",
    "DistributedDLRM": "haloflow.engine.dlrm.parallelize",
    "parallelize_dlrm": "haloflow.engine.dlrm.parallelize",
    "shard_dlrm": "haloflow.engine.dlrm.parallelize",
    # every family's train_<name>, config and result, from the one registry
    **lazy_names(),
    "FAMILIES": "haloflow.engine.families",
}
__all__ = list(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY)
