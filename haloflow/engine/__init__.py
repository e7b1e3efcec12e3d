"""Distributed training: process groups, halo exchange and parallel GCN, sharded embeddings and DLRM, trainers.

Every module here imports torch (and some import each other), so the names below are imported on first use:
``from haloflow.engine import train_dlrm`` costs only what ``train_dlrm`` needs.
"""

from haloflow._lazy import lazy_getattr

# name -> module that defines it.
_LAZY = {
    # process groups and launching
    "DistContext": "haloflow.engine.dist",
    "init_from_env": "haloflow.engine.dist",
    "shutdown": "haloflow.engine.dist",
    "launch_torchrun": "haloflow.engine.dist",
    # GCN
    "HaloExchange": "haloflow.engine.halo",
    "HaloConfig": "haloflow.engine.parallelize",
    "ParallelGCN": "haloflow.engine.parallelize",
    "parallelize_gcn": "haloflow.engine.parallelize",
    "GradSyncConfig": "haloflow.engine.grad_sync",
    "BucketedGradSync": "haloflow.engine.grad_sync",
    "predict_epoch": "haloflow.engine.cost_model",
    "GCNTrainConfig": "haloflow.engine.train_gcn",
    "TrainResult": "haloflow.engine.train_gcn",
    "train_gcn": "haloflow.engine.train_gcn",
    # DLRM
    "EmbeddingLayout": "haloflow.engine.embedding_layout",
    "predict_step_bytes": "haloflow.engine.embedding_layout",
    "ShardedEmbeddingCollection": "haloflow.engine.sharded_embedding",
    "DistributedDLRM": "haloflow.engine.sharding",
    "shard_dlrm": "haloflow.engine.sharding",
    "DLRMTrainConfig": "haloflow.engine.train_dlrm",
    "DLRMTrainResult": "haloflow.engine.train_dlrm",
    "train_dlrm": "haloflow.engine.train_dlrm",
}
__all__ = list(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY)
