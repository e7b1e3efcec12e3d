"""`TGNTrainConfig`: one TGN run, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from haloflow.data.paths import check_output_parent
from haloflow.engine.run_config import SCHEDULES, RuntimeConfig, check_units
from haloflow.errors import ConfigError
from haloflow.models.config import TGNConfig
from haloflow.utils.config_flags import hidden, nested, option

__all__ = ["TGNTrainConfig"]


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

    events: str | Path = option(metavar="FILE", help="JODIE CSV (u,i,ts,label[,features]) or SNAP temporal edge "
                                "list (src dst time)")
    partitions: str | Path | None = option(None, metavar="DIR", means="contiguous blocks of node ids",
                                           help="`haloflow partition` folder of the same stream: node memory lives "
                                           "with its part")
    batch_size: int = option(200, help="events per batch")
    epochs: int = option(1, help="passes over the training events")
    lr: float = option(1e-4, help="Adam learning rate")
    memory_dim: int = option(100, help="width of a node's memory")
    time_dim: int = option(100, help="width of the time encoding")
    embedding_dim: int = option(100, help="width of a node's embedding")
    num_neighbors: int = option(10, "--neighbors", help="most recent neighbours attended to")
    seed: int = option(0, help="weights, negatives and the held-out nodes")
    max_train_batches: int | None = option(None, "--max-batches", means="the whole epoch",
                                           help="stop each epoch after this many batches")
    eval: bool = option(True, "--no-eval", negate=True, help="skip the validation and test passes")
    mrr_negatives: int = option(20, help="fixed negatives per test event for the MRR (0: none)")
    mrr_events: int = hidden(2000, why="a property of the benchmark's MRR, set from Python")
    inductive_fraction: float = hidden(0.1, why="TGN's inductive split, set from Python")
    schedule: str = hidden("overlap", why="the control `haloflow bench tgn` times the overlap against")
    runtime: RuntimeConfig = nested(RuntimeConfig, "running")

    def __post_init__(self) -> None:
        for name in ("batch_size", "epochs", "memory_dim", "time_dim", "embedding_dim", "num_neighbors"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}", field=name)
        for name in ("epochs", "max_train_batches"):
            check_units(getattr(self, name), name)
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
