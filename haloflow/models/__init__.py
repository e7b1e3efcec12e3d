"""Single-device reference models (no distributed code): full-batch GCN / GraphSAGE and DLRM, and their parts."""

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
]
