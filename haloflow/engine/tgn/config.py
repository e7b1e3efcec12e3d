"""`TGNTrainConfig`: one TGN run, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from haloflow.data.paths import check_output_parent
from haloflow.engine.run_config import SCHEDULES, RuntimeConfig, check_units
from haloflow.errors import ConfigError
from haloflow.models.config import TGNConfig
from haloflow.utils.config_flags import hidden, nested, option

if TYPE_CHECKING:
    from haloflow.engine.logical import LogicalWorkers

__all__ = ["TGNTrainConfig", "default_logical_workers"]


def default_logical_workers(k: int) -> int:
    """V when neither ``--logical-workers`` nor a partition folder sets it: the smallest K * 2^j >= 4 (4 at K = 1,
    2 and 4; K from 4 ranks on; 6 at K = 3), so that runs at 1, 2 and 4 ranks share one V and resume at each other."""
    v = k
    while v < 4:
        v *= 2
    return v


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
        logical_workers: V, the run's logical workers (see ``workers``); None: the partition folder's parts, else
            ``default_logical_workers(K)``.
        k_invariant: False (``--no-k-invariance``): V = K, each rank one worker (the path before V existed).
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
    logical_workers: int | None = option(
        None, metavar="V", means="the --partitions folder's parts, else 4 (K when K > 4)",
        help="cut every batch into V fixed slices, each computed on its own in the same shapes and summed in one "
        "order fixed by V: the run computes the same bits at any --nproc K that divides V (V / K a power of two), "
        "and resumes bitwise at another such K. Price: each rank runs V / K smaller batches instead of one, about "
        "1.9-2.2x the step time at K = 1 and 1.2x at K = 2 for V = 4 (Wikipedia, batch 200, 2 cores), none at K = V; "
        "the same bytes")
    k_invariant: bool = option(
        True, "--no-k-invariance", negate=True,
        help="V = K: one slice per rank, as before logical workers; faster at K < V (no per-slice cost), but the "
        "floats (losses, weights, test AP) change with K and a resume at another K is not bitwise")
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
        if self.logical_workers is not None and self.logical_workers < 1:
            raise ConfigError(f"logical_workers must be >= 1, got {self.logical_workers}", field="logical_workers")
        if self.logical_workers is not None and not self.k_invariant:
            raise ConfigError(f"--logical-workers {self.logical_workers} with --no-k-invariance: that path runs "
                              "V = K (one slice per rank); drop one of the two", field="logical_workers")
        check_output_parent(self.runtime.log_jsonl, "--log-jsonl")  # checked now, not at the first record

    def logical_workers_for(self, k: int, parts: int | None = None) -> int:
        """V of a run on ``k`` ranks; ``parts``: the --partitions folder's (node memory is owned by the V logical
        parts, so a folder must have V of them). Torch-free, so that ``--nproc`` checks it before any rank starts.

        V is ``logical_workers``, else ``parts``, else ``default_logical_workers(k)``; with ``k_invariant`` False,
        V = K. Raises ConfigError when K cannot host V (K must divide V with V / K a power of two) or the folder
        has another number of parts than V."""
        v = k if not self.k_invariant else self.logical_workers or parts or default_logical_workers(k)
        if parts is not None and parts != v:
            fix = (f"give --logical-workers {parts}, or partition into {v} parts" if self.k_invariant
                   else f"start {parts} ranks (--nproc {parts}), or partition into {k} parts")
            raise ConfigError(f"{self.partitions} has {parts} parts, but the run has V = {v} logical workers (each "
                              f"owns one part's node memory): {fix}",
                              field="logical_workers" if self.k_invariant else "nproc")
        per = v // k
        if v % k or per & (per - 1):
            hosts = [d for d in range(1, v + 1) if v % d == 0 and not (v // d) & (v // d - 1)]
            raise ConfigError(f"V = {v} logical workers on {k} ranks: the ranks must divide V with a power of two "
                              f"per rank (V / K = {v} / {k}); for V = {v}: --nproc in {hosts}, or another "
                              f"--logical-workers", field="logical_workers")
        return v

    def workers(self, k: int, rank: int, parts: int | None = None) -> LogicalWorkers:
        """The run's logical workers (``logical_workers_for``) as rank ``rank`` of ``k`` sees them."""
        from haloflow.engine.logical import LogicalWorkers  # torch: not at import (the CLI's launcher reads this file)

        return LogicalWorkers(self.logical_workers_for(k, parts), k, rank)

    def model_config(self, edge_dim: int) -> TGNConfig:
        return TGNConfig(memory_dim=self.memory_dim, time_dim=self.time_dim, embedding_dim=self.embedding_dim,
                         edge_feat_dim=edge_dim, num_neighbors=self.num_neighbors, seed=self.seed)
