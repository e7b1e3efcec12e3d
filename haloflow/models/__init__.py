"""Single-device reference models (no distributed code): full-batch GCN / GraphSAGE, DLRM and TGN, and their parts."""

from haloflow.models.aggregate import (
    Aggregator,
    LocalAggregator,
    add_diagonal,
    normalized_values,
    self_loop_values,
)
from haloflow.models.dlrm import DLRM, DLRMConfig, EmbeddingTables, dlrm_loss, interaction
from haloflow.models.dropout import dropout_mask, keyed_dropout
from haloflow.models.gcn import GCN, GCNConfig, gcn_loss
from haloflow.models.spmm import DEFAULT_KERNEL, KERNELS, SparseOperator, csr_transpose
from haloflow.models.temporal_metrics import EdgeBank, LinkMetrics, average_precision, mean_reciprocal_rank, roc_auc
from haloflow.models.tgn import (
    TGN,
    TGNBatch,
    TGNConfig,
    TGNOutput,
    TemporalAttention,
    TimeEncoder,
    make_tgn_batch,
    tgn_batch_loss,
    tgn_messages,
)
from haloflow.models.tgn_memory import MemoryRows, MemoryUpdate, TGNMemoryState
from haloflow.models.tgn_train import LinkEval, evaluate_tgn, tgn_step, train_tgn_epoch

__all__ = [
    "Aggregator",
    "LocalAggregator",
    "add_diagonal",
    "normalized_values",
    "self_loop_values",
    "dropout_mask",
    "keyed_dropout",
    "GCN",
    "GCNConfig",
    "gcn_loss",
    "DEFAULT_KERNEL",
    "KERNELS",
    "SparseOperator",
    "csr_transpose",
    "DLRM",
    "DLRMConfig",
    "EmbeddingTables",
    "dlrm_loss",
    "interaction",
    "TGN",
    "TGNConfig",
    "TGNBatch",
    "TGNOutput",
    "TimeEncoder",
    "TemporalAttention",
    "make_tgn_batch",
    "tgn_batch_loss",
    "tgn_messages",
    "TGNMemoryState",
    "MemoryRows",
    "MemoryUpdate",
    "tgn_step",
    "train_tgn_epoch",
    "evaluate_tgn",
    "LinkEval",
    "average_precision",
    "roc_auc",
    "mean_reciprocal_rank",
    "EdgeBank",
    "LinkMetrics",
]
