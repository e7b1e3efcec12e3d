"""`TGNTrainConfig`: one TGN run, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from haloflow.data.paths import check_output_parent
from haloflow.engine.runtime import RuntimeConfig
from haloflow.errors import ConfigError
from haloflow.models.tgn import TGNConfig

__all__ = ["TGNTrainConfig", "SCHEDULES"]

SCHEDULES = ("overlap", "wait_first")


@dataclass(frozen=True, kw_only=True)
class TGNTrainConfig:
    """One TGN run. Defaults: TGN's (FACTS.md) with PyG's example widths (memory, time, embedding 100).

    Args:
        events: a JODIE CSV (``u,i,ts,label[,features]``) or a SNAP temporal edge list (``src dst time``).
        partitions: a ``haloflow partition`` folder of the same stream: node v's memory lives with its part
            (default: contiguous blocks of node ids).
        max_train_batches: stop each epoch after this many batches (tests, quick looks).
        eval: evaluate on validation and test after the last epoch.
        mrr_negatives / mrr_events: fixed negatives per event for the MRR (0: no MRR), scored on the first
            ``mrr_events`` test events (each negative costs one more pass over them).
        inductive_fraction: share of the nodes held out of training for the inductive test.
        schedule: "overlap" (fetch rows while sampling) or "wait_first" (the benchmark's control).
    """

    events: str | Path
    partitions: str | Path | None = None
    batch_size: int = 200
    epochs: int = 1
    lr: float = 1e-4
    memory_dim: int = 100
    time_dim: int = 100
    embedding_dim: int = 100
    num_neighbors: int = 10
    seed: int = 0
    max_train_batches: int | None = None
    eval: bool = True
    mrr_negatives: int = 20
    mrr_events: int = 2000
    inductive_fraction: float = 0.1
    schedule: str = "overlap"
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        for name in ("batch_size", "epochs", "memory_dim", "time_dim", "embedding_dim", "num_neighbors"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}", field=name)
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a finite number > 0, got {self.lr}", field="lr")
        if self.max_train_batches is not None and self.max_train_batches < 1:
            raise ConfigError(f"max_train_batches must be >= 1, got {self.max_train_batches}",
                              field="max_train_batches")
        if self.mrr_negatives < 0:
            raise ConfigError(f"mrr_negatives must be >= 0, got {self.mrr_negatives}", field="mrr_negatives")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}", field="schedule")
        check_output_parent(self.runtime.log_jsonl, "--log-jsonl")  # checked now, not at the first record

    def model_config(self, edge_dim: int) -> TGNConfig:
        return TGNConfig(memory_dim=self.memory_dim, time_dim=self.time_dim, embedding_dim=self.embedding_dim,
                         edge_feat_dim=edge_dim, num_neighbors=self.num_neighbors, seed=self.seed)
