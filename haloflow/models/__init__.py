"""Single-device reference models (no distributed code): full-batch GCN / GraphSAGE, DLRM and TGN, and their parts.

Every name is imported on first use (``haloflow._lazy``): the configs (``haloflow.models.config``) need no torch,
and ``import haloflow.models.config`` runs this file, so that a command line is checked without importing torch.
"""

from haloflow._lazy import lazy_getattr

_MODULES = {
    "haloflow.models.config": ("GCNConfig", "TGNConfig", "CONVS", "MAX_LAYERS", "KERNELS", "DEFAULT_KERNEL"),
    "haloflow.models.aggregate": ("Aggregator", "LocalAggregator", "add_diagonal", "normalized_values",
                                  "self_loop_values"),
    "haloflow.models.dlrm": ("DLRM", "DLRMConfig", "EmbeddingTables", "dlrm_loss", "interaction"),
    "haloflow.models.gcn": ("GCN", "gcn_loss"),
    "haloflow.models.spmm": ("SparseOperator", "csr_transpose"),
    "haloflow.models.temporal_metrics": ("EdgeBank", "LinkMetrics", "average_precision", "mean_reciprocal_rank",
                                         "roc_auc"),
    "haloflow.models.tgn": ("TGN", "TGNBatch", "TGNOutput", "TemporalAttention", "TimeEncoder", "make_tgn_batch",
                            "tgn_batch_loss", "tgn_messages"),
    "haloflow.models.tgn_memory": ("MemoryRows", "MemoryUpdate", "TGNMemoryState"),
    "haloflow.models.tgn_train": ("LinkEval", "evaluate_tgn", "tgn_step", "train_tgn_epoch"),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

__all__ = list(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY)
