"""Full-batch GCN training, single-process or one rank per part: `GCNTrainConfig`, `train_gcn`, `TrainResult`.

One epoch on every rank (the same steps whatever K, so K = 1 and K = 4 compute the same numbers)::

    train   logits = model(x, agg, ids, epoch)      halo exchanges overlap the inner SpMMs
            loss = CE(train rows) / GLOBAL #train    so per-rank losses sum to the single-process loss
            loss.backward()                          weight gradients start their all-gathers from hooks
            grad_sync.wait(); optimizer.step()       summed in rank order: identical weights everywhere
    eval    logits = model(x, agg, ids, epoch)       no dropout, exact halos
            one all_gather of [loss, correct counts, bytes, times] -> global accuracy, summed bytes

Rank 0 shows a progress bar (only on a terminal), writes one JSON line per epoch (``log_jsonl``) and saves the
final weights (``save``, written to a temporary file and renamed).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from haloflow.data.graph import GraphDataset
from haloflow.engine.dist import DistContext, init_from_env, shutdown
from haloflow.engine.grad_sync import BucketedGradSync, GradSyncConfig
from haloflow.engine.halo import CommStats
from haloflow.engine.parallelize import HaloConfig, parallelize_gcn
from haloflow.errors import ConfigError, DistributedError
from haloflow.models.aggregate import LocalAggregator
from haloflow.models.gcn import CONVS, GCN, GCNConfig, gcn_loss
from haloflow.models.spmm import DEFAULT_KERNEL, KERNELS
from haloflow.partition.types import GraphPart
from haloflow.utils.progress import progress_bar

__all__ = ["GCNTrainConfig", "EpochLog", "TrainResult", "train_gcn"]

log = logging.getLogger(__name__)

OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True, kw_only=True)
class GCNTrainConfig:
    """Everything a GCN training run needs. Defaults are Kipf & Welling's Cora setting (FACTS.md).

    Exactly one input: ``dataset`` (a path any ``haloflow.data.read_dataset`` format; single process) or
    ``partitions`` (a folder written by ``haloflow partition``; rank r of K loads part r).
    """

    dataset: str | None = None
    partitions: str | None = None
    dataset_format: str = "auto"
    symmetrize: bool = True  # GCN expects an undirected graph; `haloflow partition` symmetrises the same way
    normalize_features: bool = True  # divide each row by its sum (the GCN paper's preprocessing); per node, so any K
    # model
    hidden_dim: int = 16
    num_layers: int = 2
    dropout: float = 0.5
    conv: str = "gcn"
    seed: int = 0  # weights, dropout masks and halo sampling
    precompute_first: bool = True
    # optimisation
    epochs: int = 200
    lr: float = 0.01
    weight_decay: float = 5e-4  # on layer 0's weights only, as in the GCN paper
    optimizer: str = "adam"
    # distribution
    staleness: int = 0  # 1: PipeGCN-style stale halos
    halo_keep: float = 1.0  # < 1: BNS-GCN halo sampling
    timeout_s: float = 120.0  # a dead or silent peer raises after this long instead of hanging
    bucket_bytes: int = 1 << 20
    kernel: str = DEFAULT_KERNEL
    # output
    log_jsonl: str | None = None
    save: str | None = None
    progress: bool = True  # the bar still only shows on a terminal

    def __post_init__(self) -> None:
        if (self.dataset is None) == (self.partitions is None):
            raise ConfigError("give exactly one input: a dataset path (single process) or a partitions folder")
        for name in ("epochs", "hidden_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.conv not in CONVS:
            raise ConfigError(f"conv must be one of {CONVS}, got {self.conv!r}")
        if self.kernel not in KERNELS:
            raise ConfigError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s}")
        self.halo_config()  # validates staleness / halo_keep

    def halo_config(self) -> HaloConfig:
        return HaloConfig(staleness=self.staleness, halo_keep=self.halo_keep, seed=self.seed, kernel=self.kernel)

    def model_config(self, in_dim: int, out_dim: int) -> GCNConfig:
        return GCNConfig(in_dim=in_dim, out_dim=out_dim, hidden_dim=self.hidden_dim, num_layers=self.num_layers,
                         dropout=self.dropout, conv=self.conv, seed=self.seed, precompute_first=self.precompute_first)


@dataclass(frozen=True)
class EpochLog:
    """One epoch, global over ranks: accuracies from summed counts, bytes summed, times of the slowest rank."""

    epoch: int
    loss: float
    train_acc: float
    val_acc: float
    test_acc: float
    epoch_s: float  # forward + backward + gradient sync + optimizer step
    eval_s: float
    halo_bytes: int  # halo rows and halo gradients sent by all ranks during the training step
    grad_bytes: int
    blocked_s: float  # time the slowest rank spent waiting for communication in the training step
    halo_blocked_s: float = 0.0  # the part of it spent waiting for halo exchanges (slowest rank)


@dataclass(eq=False)
class TrainResult:
    """What `train_gcn` returns on every rank.

    Shapes:
        logits: (n_own, C) evaluation logits of this rank's nodes after the last epoch; node_ids: int64 (n_own,)
        their ORIGINAL ids (so results of any K can be compared row by row).
    """

    history: list[EpochLog]
    logits: torch.Tensor
    node_ids: torch.Tensor
    state_dict: dict[str, torch.Tensor]
    rank: int = 0
    world_size: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def final(self) -> EpochLog:
        return self.history[-1]


@dataclass(eq=False)
class _Local:
    """The rows this process trains on, whatever the input."""

    x: torch.Tensor  # (n_own, F)
    labels: torch.Tensor  # (n_own,)
    masks: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # train, val, test, bool (n_own,)
    node_ids: torch.Tensor  # (n_own,) original ids
    num_classes: int


def _local_from(features, labels, train, val, test, node_ids, num_classes: int, normalize: bool) -> _Local:
    if features is None or labels is None or train is None:
        raise ConfigError("GCN training needs node features, labels and a train mask; the input has "
                          f"features={features is not None}, labels={labels is not None}, train_mask={train is not None}")
    n = labels.shape[0]
    none = np.zeros(n, dtype=bool)

    def mask(m):
        return torch.from_numpy(np.array(none if m is None else m, dtype=bool))

    x = np.array(features, dtype=np.float32)  # a private, writable copy (parts are memory-mapped)
    if normalize:
        sums = x.sum(axis=1, keepdims=True, dtype=np.float64)  # (n, 1)
        x = (x / np.where(sums == 0, 1.0, sums)).astype(np.float32)
    return _Local(
        x=torch.from_numpy(x),
        labels=torch.from_numpy(np.array(labels, dtype=np.int64)),
        masks=(mask(train), mask(val), mask(test)),
        node_ids=torch.from_numpy(np.array(node_ids, dtype=np.int64)),
        num_classes=int(num_classes),
    )


def _load_dataset(config: GCNTrainConfig) -> GraphDataset:
    from haloflow.partition.pipeline import read_input

    return read_input(config.dataset, format=config.dataset_format, symmetrize=config.symmetrize)


def _load_part(config: GCNTrainConfig, ctx: DistContext) -> GraphPart:
    from haloflow.partition.format import load_meta, load_partition

    meta = load_meta(config.partitions)
    if meta.num_parts != ctx.world_size:
        raise ConfigError(f"{config.partitions} has {meta.num_parts} parts but {ctx.world_size} processes run: "
                          f"start {meta.num_parts} (torchrun --nproc-per-node {meta.num_parts}, or --nproc {meta.num_parts})")
    return load_partition(config.partitions, ctx.rank, meta=meta)


def _all_gather(values: list[float], ctx: DistContext, what: str) -> torch.Tensor:
    """(K, len(values)) float64 rows of every rank; one small collective."""
    row = torch.tensor(values, dtype=torch.float64)
    if not ctx.distributed:
        return row[None]
    rows = torch.empty(ctx.world_size, row.numel(), dtype=torch.float64)
    try:
        dist.all_gather(list(rows.unbind(0)), row, group=ctx.group)
    except RuntimeError as err:
        raise DistributedError(f"rank {ctx.rank}: {what} failed - a peer process died or did not answer within "
                               f"the timeout ({str(err).splitlines()[0][:300]})") from err
    return rows


def _correct(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> float:
    return float((logits[mask].argmax(1) == labels[mask]).sum())


def _save_atomic(path: str, payload: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def train_gcn(config: GCNTrainConfig, *, dataset: GraphDataset | None = None, part: GraphPart | None = None) -> TrainResult:
    """Train a GCN as ``config`` says; under torchrun each rank trains on its part.

    Args:
        config: see `GCNTrainConfig`.
        dataset / part: in-memory input instead of ``config.dataset`` / ``config.partitions`` (tests, notebooks).

    Raises:
        ConfigError: bad settings, or a partition whose K differs from the number of processes.
        DistributedError: a peer died or timed out.
    """
    owns_group = not dist.is_initialized()
    ctx = init_from_env(timeout_s=config.timeout_s, device="cpu") if (config.partitions or part is not None) \
        else DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    try:
        result = _train(config, ctx, dataset, part)
    except BaseException:
        if owns_group and ctx.distributed:
            shutdown(barrier=False)  # a peer may be gone: do not wait for it again
        raise
    if owns_group and ctx.distributed:
        shutdown()
    return result


def _setup(config: GCNTrainConfig, ctx: DistContext, dataset: GraphDataset | None, part: GraphPart | None):
    """Model, aggregator, gradient sync and local rows for either input."""
    stats = CommStats()
    if config.dataset is not None and part is None:
        dataset = dataset if dataset is not None else _load_dataset(config)
        local = _local_from(dataset.features, dataset.labels, dataset.train_mask, dataset.val_mask,
                            dataset.test_mask, np.arange(dataset.num_nodes), dataset.num_classes,
                            config.normalize_features)
        model = GCN(config.model_config(local.x.shape[1], local.num_classes))
        agg = LocalAggregator(dataset.graph, model.config.norm, kernel=config.kernel)
        return model, agg, BucketedGradSync(model.parameters(), None), local, stats
    part = part if part is not None else _load_part(config, ctx)
    if part.num_parts != ctx.world_size:
        raise ConfigError(f"the partition has {part.num_parts} parts but {ctx.world_size} processes run")
    local = _local_from(part.features, part.labels, part.train_mask, part.val_mask, part.test_mask,
                        part.orig_ids, part.num_classes, config.normalize_features)
    model = GCN(config.model_config(local.x.shape[1], local.num_classes))
    _, agg, sync = parallelize_gcn(model, part, ctx.group, halo=config.halo_config(),
                                   grad_sync=GradSyncConfig(bucket_bytes=config.bucket_bytes), stats=stats)
    return model, agg, sync, local, stats


def _train(config, ctx, dataset, part) -> TrainResult:
    model, agg, sync, local, stats = _setup(config, ctx, dataset, part)
    counts = _all_gather([float(m.sum()) for m in local.masks], ctx, "counting training nodes").sum(0)  # (3,)
    n_train, n_val, n_test = (int(c) for c in counts)
    if n_train == 0:
        raise ConfigError("the train mask selects no node: nothing to train on")
    groups = model.param_groups(config.weight_decay)
    opt = (torch.optim.Adam(groups, lr=config.lr) if config.optimizer == "adam"
           else torch.optim.SGD(groups, lr=config.lr))
    set_epoch = getattr(agg, "set_epoch", lambda epoch, training: None)
    jsonl = open(config.log_jsonl, "w") if (config.log_jsonl and ctx.is_main) else None
    history: list[EpochLog] = []
    bar = progress_bar(total=config.epochs, desc=f"train gcn (K={ctx.world_size})", unit="epoch",
                       enabled=config.progress and ctx.is_main)
    try:
        if config.precompute_first:
            model.precompute(local.x, agg)  # layer 0's aggregation of the constant input, once (exact)
        for epoch in range(config.epochs):
            # ---- training step
            model.train()
            set_epoch(epoch, True)
            stats.reset()
            t0 = time.perf_counter()
            logits = model(local.x, agg, local.node_ids, epoch)  # (n_own, C)
            loss = gcn_loss(logits, local.labels, local.masks[0], n_train)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # gradient all-gathers start from hooks while backward runs
            sync.wait()  # every rank now holds the same summed gradients
            opt.step()
            epoch_s = time.perf_counter() - t0
            step = (stats.halo_bytes, stats.grad_bytes, stats.blocked_s, stats.halo_blocked_s)
            # ---- evaluation (exact halos, no dropout)
            model.eval()
            set_epoch(epoch, False)
            t1 = time.perf_counter()
            with torch.no_grad():
                logits = model(local.x, agg, local.node_ids, epoch)
            eval_s = time.perf_counter() - t1
            row = [float(loss.detach()), *(_correct(logits, local.labels, m) for m in local.masks),
                   float(step[0]), float(step[1]), step[2], epoch_s, eval_s, step[3]]
            rows = _all_gather(row, ctx, f"epoch {epoch} metrics")  # (K, 10)
            total, slowest = rows.sum(0), rows.max(0).values  # loss summed in rank order 0..K-1
            entry = EpochLog(
                epoch=epoch, loss=float(total[0]),
                train_acc=float(total[1]) / n_train,
                val_acc=float(total[2]) / max(n_val, 1),
                test_acc=float(total[3]) / max(n_test, 1),
                epoch_s=float(slowest[7]), eval_s=float(slowest[8]),
                halo_bytes=int(total[4]), grad_bytes=int(total[5]), blocked_s=float(slowest[6]),
                halo_blocked_s=float(slowest[9]),
            )
            history.append(entry)
            if jsonl is not None:
                jsonl.write(json.dumps(asdict(entry)) + "\n")
                jsonl.flush()
            bar.set_postfix(loss=f"{entry.loss:.4f}", val=f"{entry.val_acc:.3f}", test=f"{entry.test_acc:.3f}")
            bar.update(1)
        finish = getattr(agg, "finish", None)
        if finish is not None:
            finish()  # stale mode leaves one exchange per layer in flight
    finally:
        bar.close()
        if jsonl is not None:
            jsonl.close()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if config.save and ctx.is_main:
        _save_atomic(config.save, {"model_config": asdict(model.config), "state_dict": state,
                                   "train_config": asdict(config), "final": asdict(history[-1])})
    log.info("trained %d epochs on %d rank(s): loss %.4f, test accuracy %.4f", config.epochs, ctx.world_size,
             history[-1].loss, history[-1].test_acc)
    return TrainResult(history=history, logits=logits, node_ids=local.node_ids, state_dict=state,
                       rank=ctx.rank, world_size=ctx.world_size)
