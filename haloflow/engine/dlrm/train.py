"""Training loop of DLRM on click logs: one process, or K ranks with tables sharded by a plan.

::

    every rank reads the same global batch (B samples) -> takes its contiguous slice (split_sizes)
      forward  -> loss = BCE sum over the slice / B            (the K losses add up to the global mean)
      backward -> finish_grad_sync (MLP gradients, data-parallel tables) -> SGD step (sparse on the shards)
    evaluation on the validation split: logloss = sum of BCE / N; AUC exactly by rank-sum over all N
      scores, gathered from every rank
    rank 0: a tqdm bar while training and one JSON record per log interval / evaluation

Defaults follow the Criteo Kaggle DLRM (FACTS.md): SGD lr 0.1, batch 128, D = 16, bottom 512-256-64,
top 512-256.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from haloflow.data.clicks import CHUNK
from haloflow.data.jagged import ClickBatch, split_sizes
from haloflow.engine.dist import DistContext, init_from_env, shutdown
from haloflow.engine.sharding import shard_dlrm
from haloflow.errors import ConfigError
from haloflow.models.dlrm import DLRM, DLRMConfig, dlrm_loss
from haloflow.partition.planner.types import Shard, ShardingPlan, ShardingType, TablePlan
from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.progress import progress_bar

__all__ = ["DLRMTrainConfig", "DLRMTrainResult", "train_dlrm", "auc_rank_sum", "table_wise_plan"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DLRMTrainConfig:
    """One training run.

    Args:
        data: a folder written by ``haloflow preprocess criteo`` (or the synthetic writer); or None with
            ``synthetic``.
        synthetic: train on the synthetic Criteo-like log instead (``haloflow.data.clicks``).
        synthetic_scale / synthetic_max_rows: table sizes of the synthetic log (Kaggle cardinalities scaled,
            then capped).
        synthetic_train / synthetic_val: samples in its train and validation splits.
        plan: a ``ShardingPlan`` JSON file; None uses ``table_wise_plan`` (whole tables spread over ranks).
        batch_size: global batch B, split over the ranks.
        lr: SGD learning rate (MLPs and tables alike).
        epochs / max_steps: stop after ``epochs`` passes or ``max_steps`` steps, whichever comes first.
        log_every: steps between JSON training records.
        max_eval_batches: cap on validation batches (None: the whole split).
        embedding_dim, bottom_mlp, top_mlp, seed: the model (``DLRMConfig``).
        dp_grad: "sparse" or "dense" sum of data-parallel tables' gradients.
        metrics_path: rank 0 writes every JSON record here (one per line) at the end, atomically.
        progress: show the tqdm bar on rank 0 (only when stderr is a terminal).
        timeout_s: how long a collective may wait for a peer.
    """

    data: Path | None = None
    synthetic: bool = False
    synthetic_scale: float = 1e-3  # Kaggle's 33.8 M rows -> ~34 k rows: a laptop-sized run
    synthetic_max_rows: int | None = None
    synthetic_train: int = 65_536
    synthetic_val: int = 8_192
    plan: Path | None = None
    batch_size: int = 128  # FACTS.md: the Kaggle DLRM's batch
    lr: float = 0.1  # FACTS.md: SGD lr 0.1
    epochs: int = 1
    max_steps: int | None = None
    log_every: int = 100
    max_eval_batches: int | None = None
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (512, 256, 64)
    top_mlp: tuple[int, ...] = (512, 256)
    seed: int = 0
    dp_grad: str = "sparse"
    metrics_path: Path | None = None
    progress: bool = True
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if (self.data is None) == (not self.synthetic):
            raise ConfigError("give exactly one of data (a preprocessed folder) and synthetic=True")
        for name in ("batch_size", "epochs", "log_every", "synthetic_train"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.synthetic_val < 0:
            raise ConfigError(f"synthetic_val must be >= 0, got {self.synthetic_val}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1 or None, got {self.max_steps}")
        if self.max_eval_batches is not None and self.max_eval_batches < 0:
            raise ConfigError(f"max_eval_batches must be >= 0 or None, got {self.max_eval_batches}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a finite number > 0, got {self.lr}")
        if self.dp_grad not in ("sparse", "dense"):
            raise ConfigError(f"dp_grad must be 'sparse' or 'dense', got {self.dp_grad!r}")
        for name in ("data", "plan", "metrics_path"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if self.metrics_path is not None and self.metrics_path.is_dir():  # found now, not after training
            raise ConfigError(f"metrics_path {self.metrics_path} is a folder; expected a file name to write")
        object.__setattr__(self, "bottom_mlp", tuple(self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(self.top_mlp))


@dataclass
class DLRMTrainResult:
    """What a run measured (identical on every rank)."""

    steps: int = 0
    samples: int = 0
    train_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)  # global mean loss of every step
    val_logloss: float | None = None
    val_auc: float | None = None
    comm_bytes_per_step: float = 0.0  # this rank's average, all collectives
    records: list[dict] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.train_seconds if self.train_seconds > 0 else 0.0


def auc_rank_sum(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC by the Mann-Whitney rank sum, exact, ties given their average rank.

    ``AUC = (sum of the positives' ranks - P(P+1)/2) / (P N)``; one sort of the n scores.
    Shapes: scores (n,), labels (n,) in {0, 1}. Returns nan when one class is absent.
    """
    scores = scores.double().reshape(-1)
    pos = labels.reshape(-1) > 0.5
    P, n = int(pos.sum()), scores.numel()
    N = n - P
    if P == 0 or N == 0:
        return float("nan")
    sorted_scores, order = torch.sort(scores)
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()  # 1-based rank of the last member of each tie group
    avg_rank = ends - (counts.double() - 1) / 2  # (groups,)
    ranks = torch.empty(n, dtype=torch.float64)
    ranks[order] = avg_rank[inverse]
    return float((ranks[pos].sum() - P * (P + 1) / 2) / (P * N))


def table_wise_plan(table_sizes: tuple[int, ...], dim: int, world_size: int) -> ShardingPlan:
    """Whole tables on ranks, largest first to the rank with the fewest rows (the default without a plan)."""
    load = [0] * world_size
    owner = {}
    for t in sorted(range(len(table_sizes)), key=lambda t: -table_sizes[t]):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[t] = r
        load[r] += table_sizes[t]
    tables = tuple(TablePlan(f"t{t}", t, ShardingType.TABLE_WISE, (Shard(owner[t], 0, n, 0, dim),))
                   for t, n in enumerate(table_sizes))
    return ShardingPlan(world_size, tables)


# ------------------------------------------------------------------------------------------------ data
class _Data:
    """Global batches of the train and validation splits, from a folder or the synthetic generator."""

    def __init__(self, config: DLRMTrainConfig):
        self.config = config
        if config.synthetic:
            from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator

            self.gen = ClickLogGenerator(ClickLogConfig(scale=config.synthetic_scale,
                                                        max_rows=config.synthetic_max_rows, seed=config.seed))
            self.table_sizes, self.num_dense = self.gen.sizes, self.gen.config.num_dense
        else:
            from haloflow.data.criteo_loader import ClickLoader, ClickLoaderConfig

            self.loaders = {s: ClickLoader(config.data, ClickLoaderConfig(batch_size=config.batch_size, split=s))
                            for s in ("train", "val")}
            self.table_sizes = tuple(self.loaders["train"].table_sizes)
            self.num_dense = self.loaders["train"].num_dense

    def num_batches(self, split: str) -> int:
        B = self.config.batch_size
        if self.config.synthetic:
            n = self.config.synthetic_train if split == "train" else self.config.synthetic_val
            return -(-n // B)
        return len(self.loaders[split])

    def batches(self, split: str) -> Iterator[ClickBatch]:
        if not self.config.synthetic:
            yield from self.loaders[split]
            return
        B, n_train = self.config.batch_size, self.config.synthetic_train
        lo, n = (0, n_train) if split == "train" else (n_train, self.config.synthetic_val)
        # Drawn in pieces of many batches: the generator draws whole chunks of its stream at a time.
        piece = max(B, (CHUNK // B) * B)
        for start in range(lo, lo + n, piece):
            block = self.gen.samples(start, min(piece, lo + n - start))
            q, r = divmod(block.batch_size, B)
            yield from block.split_batch([B] * q + ([r] if r else []))


# ------------------------------------------------------------------------------------------------ loop
def _build_model(config: DLRMTrainConfig, data: _Data, ctx: DistContext):
    model = DLRM(DLRMConfig(table_sizes=data.table_sizes, num_dense=data.num_dense,
                            embedding_dim=config.embedding_dim, bottom_mlp=config.bottom_mlp,
                            top_mlp=config.top_mlp, seed=config.seed))
    if config.plan is not None:
        plan = ShardingPlan.load(config.plan)
    elif ctx.world_size > 1:
        plan = table_wise_plan(data.table_sizes, config.embedding_dim, ctx.world_size)
    else:
        return model, None  # the single-device model itself
    return model, shard_dlrm(model, plan, ctx.group, dp_grad=config.dp_grad)


def _local(batch: ClickBatch, ctx: DistContext) -> tuple[ClickBatch, list[int]]:
    sizes = split_sizes(batch.batch_size, ctx.world_size)
    return batch.split_batch(sizes)[ctx.rank], sizes


def _all_sum(x: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.group is not None:
        dist.all_reduce(x, group=ctx.group)  # waits for every rank
    return x


def _gather(x: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Concatenate every rank's 1-D tensor in rank order (uneven sizes: pad to the longest)."""
    if ctx.group is None:
        return x
    n = torch.tensor([x.numel()])
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, n, group=ctx.group)
    longest = int(max(sizes))
    padded = torch.zeros(longest, dtype=x.dtype)
    padded[: x.numel()] = x
    out = [torch.empty_like(padded) for _ in range(ctx.world_size)]
    dist.all_gather(out, padded, group=ctx.group)
    return torch.cat([o[: int(s)] for o, s in zip(out, sizes)])


@torch.no_grad()
def _evaluate(model, dist_model, data: _Data, ctx: DistContext, config: DLRMTrainConfig) -> tuple[float, float]:
    scores, labels, loss_sum, count = [], [], torch.zeros(1, dtype=torch.float64), 0
    for i, batch in enumerate(data.batches("val")):
        if config.max_eval_batches is not None and i >= config.max_eval_batches:
            break
        mine, sizes = _local(batch, ctx)
        if dist_model is None:
            logits = model(mine.dense, mine.sparse)
        else:
            logits = dist_model(mine.dense, mine.sparse, sizes)  # (B_r,)
        loss_sum += dlrm_loss(logits, mine.labels, global_batch_size=1).double()  # the sum over the slice
        count += batch.batch_size
        scores.append(logits)
        labels.append(mine.labels)
    if count == 0:
        return float("nan"), float("nan")
    loss_sum = _all_sum(loss_sum, ctx)
    all_scores = _gather(torch.cat(scores), ctx)
    all_labels = _gather(torch.cat(labels), ctx)
    return float(loss_sum) / count, auc_rank_sum(all_scores, all_labels)


def train_dlrm(config: DLRMTrainConfig, ctx: DistContext | None = None,
               on_record: Callable[[dict], None] | None = None) -> DLRMTrainResult:
    """Train and evaluate; every rank returns the same ``DLRMTrainResult``.

    Args:
        config: the run.
        ctx: the process group (default: ``init_from_env``, one process without torchrun).
        on_record: called on rank 0 with every JSON record as it is made (the CLI prints them).
    """
    owns_group = ctx is None and not dist.is_initialized()
    ctx = ctx or init_from_env(timeout_s=config.timeout_s, device="cpu")
    try:
        result = _train(config, ctx, on_record)
    except BaseException:
        if owns_group:
            shutdown(barrier=False)  # a peer may be gone: do not wait for it again
        raise
    if owns_group:
        shutdown()
    return result


def _train(config: DLRMTrainConfig, ctx: DistContext, on_record) -> DLRMTrainResult:
    data = _Data(config)
    model, dist_model = _build_model(config, data, ctx)
    net = dist_model if dist_model is not None else model
    opt = torch.optim.SGD(net.parameters(), lr=config.lr)
    result = DLRMTrainResult()

    def emit(record: dict) -> None:
        result.records.append(record)
        if ctx.is_main and on_record is not None:
            on_record(record)

    total = data.num_batches("train") * config.epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    bar = progress_bar(total=total, desc="train dlrm", unit="step", enabled=config.progress and ctx.is_main)
    comm = 0
    t0 = time.perf_counter()
    while result.steps < total:
        for batch in data.batches("train"):
            if result.steps >= total:
                break
            mine, sizes = _local(batch, ctx)
            opt.zero_grad(set_to_none=True)
            if dist_model is None:
                logits = model(mine.dense, mine.sparse)
            else:
                dist_model.stats.reset()
                logits = dist_model(mine.dense, mine.sparse, sizes)
            loss = dlrm_loss(logits, mine.labels, global_batch_size=batch.batch_size)
            loss.backward()
            if dist_model is not None:
                dist_model.finish_grad_sync()
                comm += dist_model.stats.total()
            opt.step()
            step_loss = float(_all_sum(loss.detach().clone(), ctx))  # the global mean (a sync, for the log)
            result.losses.append(step_loss)
            result.steps += 1
            result.samples += batch.batch_size
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.4f}", refresh=False)
            if result.steps % config.log_every == 0 or result.steps == total:
                window = result.losses[-config.log_every:]
                emit({"kind": "train", "step": result.steps, "loss": sum(window) / len(window),
                      "samples_per_s": result.samples / (time.perf_counter() - t0)})
    result.train_seconds = time.perf_counter() - t0
    bar.close()
    result.comm_bytes_per_step = comm / max(result.steps, 1)
    result.val_logloss, result.val_auc = _evaluate(model, dist_model, data, ctx, config)
    emit({"kind": "eval", "step": result.steps, "val_logloss": result.val_logloss, "val_auc": result.val_auc,
          "samples_per_s": result.samples_per_s, "world_size": ctx.world_size,
          "comm_bytes_per_step": result.comm_bytes_per_step})
    if ctx.is_main and config.metrics_path is not None:
        atomic_write_text(config.metrics_path, "".join(json.dumps(r) + "\n" for r in result.records))
    return result
