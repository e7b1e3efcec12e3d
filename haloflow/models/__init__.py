"""haloflow.models"""

from haloflow.models.dlrm import DLRM, DLRMConfig, EmbeddingTables, dlrm_loss, interaction

__all__ = [*globals().get("__all__", []), "DLRM", "DLRMConfig", "EmbeddingTables", "dlrm_loss", "interaction"]
