"""The models' configs and choices, with no torch in reach: `GCNConfig`, `TGNConfig` and the SpMM kernels' names.

The trainers' configs (``haloflow/engine/<family>/config.py``) nest these, and the CLI's launcher checks a command
line against them before any process starts (``tests/cli/test_runtime_args.py``), so this module imports no more
than the standard library and haloflow's errors. The models themselves are ``gcn.py``, ``tgn.py`` and ``spmm.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from haloflow.errors import ConfigError
from haloflow.kernels import DEFAULT_SPMM_KERNEL, SPMM_KERNELS

__all__ = ["GCNConfig", "CONVS", "MAX_LAYERS", "TGNConfig", "KERNELS", "DEFAULT_KERNEL"]

CONVS = ("gcn", "sage")
MAX_LAYERS = 1024  # deeper than the deepest GCNs trained (RevGNN's 1,001 layers); a million would take minutes to build
KERNELS = SPMM_KERNELS  # the SpMM bodies a GCN may run on the CPU (haloflow/kernels/spmm.py)
DEFAULT_KERNEL = DEFAULT_SPMM_KERNEL


@dataclass(frozen=True, kw_only=True)
class GCNConfig:
    """Architecture of a `GCN`. Defaults are Kipf & Welling's Cora setting (FACTS.md)."""

    in_dim: int
    out_dim: int
    hidden_dim: int = 16
    num_layers: int = 2
    dropout: float = 0.5
    conv: str = "gcn"  # "gcn" | "sage" (GraphSAGE-mean: h W_self + mean_neigh(h) W_neigh)
    seed: int = 0  # dropout key and weight init
    precompute_first: bool = True  # layer 0 aggregates the constant input once; its dropout then acts on A X

    def __post_init__(self) -> None:
        for name in ("in_dim", "out_dim", "hidden_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"GCNConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_layers > MAX_LAYERS:
            raise ConfigError(f"GCNConfig.num_layers must be <= {MAX_LAYERS:,}, got {self.num_layers:,}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"GCNConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.conv not in CONVS:
            raise ConfigError(f"GCNConfig.conv must be one of {CONVS}, got {self.conv!r}")
        if self.seed < 0:
            raise ConfigError(f"GCNConfig.seed must be >= 0, got {self.seed}")

    @property
    def norm(self) -> str:
        """The aggregation the conv expects: "gcn" (symmetric, self-loop) or "mean"."""
        return "gcn" if self.conv == "gcn" else "mean"

    @property
    def dims(self) -> list[int]:
        return [self.in_dim] + [self.hidden_dim] * (self.num_layers - 1) + [self.out_dim]

    def min_training_bytes(self, num_rows: int, optimizer_slots: int = 2) -> int:
        """A lower bound on the memory one training step holds on ``num_rows`` rows (inner + halo): float32
        weights with their gradients and ``optimizer_slots`` state tensors each (Adam: 2), and per layer the
        (rows, width) input that backward keeps plus the output. What autograd really keeps is more, so a run
        that this bound says cannot fit surely cannot."""
        d, mats = self.dims, 2 if self.conv == "sage" else 1
        weights = sum(mats * a * b + b for a, b in zip(d[:-1], d[1:]))
        activations = sum(num_rows * (a + b) for a, b in zip(d[:-1], d[1:]))
        return 4 * (weights * (2 + optimizer_slots) + activations)

    def transform_first(self, layer: int) -> bool:
        """Whether layer ``layer`` multiplies by its weight before aggregating (never the precomputed layer 0)."""
        d = self.dims
        return (layer > 0 or not self.precompute_first) and d[layer + 1] < d[layer]


@dataclass(frozen=True, kw_only=True)
class TGNConfig:
    """Architecture of a `TGN`. Defaults follow PyG's TGN example (FACTS.md: the paper uses M = 172)."""

    memory_dim: int = 100  # the paper sets 172, the width of Wikipedia's edge features
    time_dim: int = 100
    embedding_dim: int = 100
    edge_feat_dim: int = 0  # F; 0 when the stream has no edge features
    num_neighbors: int = 10  # k most recent neighbours in the attention layer
    heads: int = 2
    dropout: float = 0.1  # on the attention weights (TGN's nn.MultiheadAttention setting)
    learn_time: bool = True  # TGN trains w and b of the time encoding
    seed: int = 0  # weight init and dropout key

    def __post_init__(self) -> None:
        for name in ("memory_dim", "time_dim", "embedding_dim", "heads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TGNConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("edge_feat_dim", "num_neighbors", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"TGNConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"TGNConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.query_dim % self.heads:
            raise ConfigError(f"TGNConfig: memory_dim + time_dim = {self.memory_dim} + {self.time_dim} = "
                              f"{self.query_dim} must be divisible by heads = {self.heads}")

    @property
    def query_dim(self) -> int:
        return self.memory_dim + self.time_dim

    @property
    def key_dim(self) -> int:
        return self.memory_dim + self.edge_feat_dim + self.time_dim

    @property
    def message_dim(self) -> int:
        return 2 * self.memory_dim + self.edge_feat_dim + self.time_dim
