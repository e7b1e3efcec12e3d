"""Full-batch GCN as a family of the one training loop: `GCNFamily`, `train_gcn`, `GCNTrainResult`.

A run is defined by V, the partition folder's parts (a data set: one part); K ranks (``--nproc``, any K that
divides V with a power of two per rank) host V / K parts each, and every part computes what it computes alone, so
the run gives the same floats at every such K (``engine/logical.py``). One epoch on every rank (one process is the
distributed path on a group of one)::

    train   views = fanout(weights, V/K)            each hosted part its own views of the weights
            logits_p = model.forward_blocks(...)     per part, layer by layer; halo exchanges overlap the inner SpMMs
            loss_p = CE(part p's train rows) / GLOBAL #train;  loss = tree_sum(loss_p over hosted parts)
            loss.backward()                          a weight's gradient: the pairwise tree over the hosted parts;
                                                     weight-gradient buckets start their reduce-scatters from hooks
            grad_sync.wait(); optimizer.step()       the ranks' tree on top: the V-tree, identical weights everywhere
    eval    logits_p = model.forward_blocks(...)     no dropout, exact halos
            RankEpoch.reduce: one all-gather of this rank's sums (each the tree over its parts), bytes and times;
            the sums by the pairwise tree over ranks (= the V-tree, so the logged loss is the same at any K)

Start-up, resume, checkpoints, progress and the summary are the loop's (``engine/trainer.py``); rank 0 saves
the final weights (``save``, written atomically) when the loop finishes.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from haloflow.data.graph import GraphDataset
from haloflow.engine.checkpoint import cpu_state
from haloflow.engine.comm import CommStats, all_gather_rows
from haloflow.engine.gcn.config import GCNTrainConfig
from haloflow.engine.gcn.parallelize import parallelize_gcn
from haloflow.engine.logical import LogicalWorkers, fanout, tree_sum
from haloflow.engine.optimizers import make_dense_optimizer
from haloflow.engine.runtime import Runtime, TrainResult, save_atomic, synchronize
from haloflow.engine.trainer import Exported, RunInfo, run
from haloflow.errors import ConfigError
from haloflow.models.gcn import GCN, gcn_loss
from haloflow.partition.types import GraphPart
from haloflow.utils.memory import available_bytes, format_bytes

__all__ = ["GCNTrainConfig", "EpochLog", "GCNTrainResult", "GCNFamily", "train_gcn", "whole_graph_part"]

log = logging.getLogger(__name__)


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
    grad_buckets_in_backward: int = 0  # gradient buckets whose reduce-scatter started while backward ran

    def progress(self) -> dict[str, float]:
        return {"loss": self.loss, "val": self.val_acc, "test": self.test_acc, "epoch_s": self.epoch_s}

    def record(self) -> dict:
        return {"kind": "epoch", **asdict(self)}


@dataclass(frozen=True)
class RankEpoch:
    """One rank's share of an epoch, before the ranks are combined (``reduce``)."""

    loss: float  # this rank's part of the global loss (its parts' CE / global #train, the tree over its parts)
    train_correct: float
    val_correct: float
    test_correct: float
    halo_bytes: float
    grad_bytes: float
    blocked_s: float
    epoch_s: float
    eval_s: float
    halo_blocked_s: float

    SLOWEST = ("blocked_s", "epoch_s", "eval_s", "halo_blocked_s")  # the rest are summed over the ranks

    def reduce(self, group, epoch: int, counts: "_Counts", buckets: int) -> EpochLog:
        """All ranks' rows in one all-gather; sums by the pairwise tree over ranks (each rank's value is already
        the tree over its parts, so the loss is the V-tree: the same bits at any K, and on every rank)."""
        names = [f.name for f in fields(self)]
        rows = all_gather_rows([getattr(self, n) for n in names], group, f"epoch {epoch} metrics")  # (K, 10)
        total, slowest = tree_sum(rows.unbind(0)), rows.max(0).values
        v = {n: float(slowest[i] if n in self.SLOWEST else total[i]) for i, n in enumerate(names)}
        return EpochLog(epoch=epoch, loss=v["loss"], train_acc=v["train_correct"] / counts.train,
                        val_acc=_accuracy(v["val_correct"], counts.val),
                        test_acc=_accuracy(v["test_correct"], counts.test),
                        epoch_s=v["epoch_s"], eval_s=v["eval_s"], halo_bytes=int(v["halo_bytes"]),
                        grad_bytes=int(v["grad_bytes"]), blocked_s=v["blocked_s"], halo_blocked_s=v["halo_blocked_s"],
                        grad_buckets_in_backward=buckets)


@dataclass(frozen=True)
class _Counts:
    """Global node counts (summed over the ranks once, at start-up)."""

    train: int
    val: int
    test: int
    nodes: int


@dataclass(eq=False)
class GCNTrainResult(TrainResult):
    """What `train_gcn` returns on every rank.

    Shapes:
        logits: (n_own, C) evaluation logits of this rank's nodes after the last epoch; node_ids: int64 (n_own,)
        their ORIGINAL ids (so results of any K can be compared row by row).
    """

    history: list[EpochLog] = field(default_factory=list)  # every epoch, those before a resume included
    logits: torch.Tensor | None = None
    node_ids: torch.Tensor | None = None
    resumed_at: int = 0  # epochs done by the checkpoint this run resumed from

    @property
    def final(self) -> EpochLog:
        return self.history[-1]

    def summary(self) -> str:
        f = self.final
        rows = [["loss", f.loss], ["train accuracy", f.train_acc], ["val accuracy", _shown(f.val_acc, "val")],
                ["test accuracy", _shown(f.test_acc, "test")]]
        rows += [["resumed after epoch", self.resumed_at]] if self.resumed_at else []
        return self.format_summary(f"GCN, {len(self.history)} epochs", rows,
                                   epochs=len(self.history) - self.resumed_at)


def _accuracy(correct: float, nodes: int) -> float:
    """Accuracy over a split; NaN (null in the JSON log) for a split without nodes: nothing was measured, and a
    0.0 would read as a model that got every node wrong."""
    return correct / nodes if nodes else float("nan")


def _shown(accuracy: float, split: str) -> float | str:
    return f"skipped (no {split} nodes)" if math.isnan(accuracy) else accuracy


@dataclass(eq=False)
class _Local:
    """The rows this process trains on, on the run's device: one block per hosted part, in part order."""

    xs: list[torch.Tensor]  # (n_inner_p, F) each
    labels: list[torch.Tensor]  # (n_inner_p,)
    masks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # train, val, test, bool (n_inner_p,)
    node_ids: list[torch.Tensor]  # (n_inner_p,) original ids
    num_classes: int

    @classmethod
    def from_parts(cls, parts: list[GraphPart], normalize: bool, device: torch.device) -> "_Local":
        blocks = [_block(p, normalize, device) for p in parts]
        return cls(*(list(col) for col in zip(*blocks)), num_classes=int(parts[0].num_classes))

    @property
    def in_dim(self) -> int:
        return self.xs[0].shape[1]

    def cat_ids(self) -> torch.Tensor:
        """(n_own,) the original ids of every hosted row, in part order."""
        return torch.cat(self.node_ids)

    def cat_labels(self) -> torch.Tensor:
        return torch.cat(self.labels)

    def cat_mask(self, split: int) -> torch.Tensor:
        """(n_own,) split 0 train, 1 val, 2 test."""
        return torch.cat([m[split] for m in self.masks])


def _block(part: GraphPart, normalize: bool, device: torch.device) -> tuple:
    """One part's rows: features, labels, the three masks, original ids."""
    if part.features is None or part.labels is None or part.train_mask is None:
        raise ConfigError("GCN training needs node features, labels and a train mask; the input has "
                          f"features={part.features is not None}, labels={part.labels is not None}, "
                          f"train_mask={part.train_mask is not None}")
    none = np.zeros(part.labels.shape[0], dtype=bool)

    def tensor(a, dtype) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=dtype)).to(device)  # a private copy (parts are memory-mapped)

    x = np.array(part.features, dtype=np.float32)
    if normalize:
        sums = x.sum(axis=1, keepdims=True, dtype=np.float64)  # (n, 1)
        x = (x / np.where(sums == 0, 1.0, sums)).astype(np.float32)
    return (tensor(x, np.float32), tensor(part.labels, np.int64),
            tuple(tensor(none if m is None else m, bool) for m in (part.train_mask, part.val_mask, part.test_mask)),
            tensor(part.orig_ids, np.int64))


def whole_graph_part(dataset: GraphDataset) -> GraphPart:
    """The whole data set as part 0 of a one-part partition (no halo): what one process trains on, so that it
    runs the distributed path on a group of one. Node ids keep their order (the relabelling is the identity)."""
    from haloflow.partition.halo import build_part
    from haloflow.partition.relabel import relabel
    from haloflow.partition.types import Assignment

    one = Assignment(parts=np.zeros(dataset.num_nodes, dtype=np.int64), num_parts=1, method="whole")
    return build_part(dataset.graph, relabel(one), 0, dataset)


def _correct(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> float:
    return float((logits.argmax(1)[mask] == labels[mask]).sum())  # a device sync on CUDA


def _parts_sum(values: list[float]) -> float:
    """The pairwise tree over a rank's parts, in float64 (the ranks' tree continues it: the V-tree)."""
    return float(tree_sum(torch.tensor(values, dtype=torch.float64).unbind(0)))


class GCNFamily:
    """GCN for ``engine/trainer.run``: one unit is one epoch (a training step, then an exact evaluation).

    ``dataset`` / ``part``: in-memory input instead of ``config.dataset`` / ``config.partitions`` (``part``: a
    partition of one part per rank). ``logical_workers`` (V, after ``setup``): the partition's parts.
    """

    # The thread count stays as it started, whatever the load (the governor is not consulted): the first layer's
    # weight gradient, X^T G with a short inner dimension (the nodes of a small graph), rounds by MKL's thread
    # count even in its strict reproducible mode (a (120 x 8)^T (120 x 16) product differed at 1 and 2 threads,
    # 2026-12-07), so a change mid-run changed a run's bits under load (two identical runs beside two busy
    # processes: 1 pair in 6 differed; with fixed threads 0 in 6).
    adapts_threads = False

    kind, unit, more_flag = "gcn", "epoch", "--epochs"

    def __init__(self, config: GCNTrainConfig, *, dataset: GraphDataset | None = None,
                 part: GraphPart | None = None):
        self.config, self._dataset, self._part = config, dataset, part
        # A data set trains in this process alone; a partition joins torchrun's group (if there is one).
        self.join = config.partitions is not None or part is not None
        self.history: list[EpochLog] = []
        self.logits: list[torch.Tensor] | None = None  # the hosted parts' evaluation logits of the last epoch
        self.logical_workers: int | None = None  # V, the summary's; set by setup

    # ------------------------------------------------------------------------------------------ setup
    def setup(self, rt: Runtime) -> None:
        """Model, aggregator, gradient sync and this rank's rows, on the run's device."""
        cfg, lay = self.config, rt.layout
        self.rt, self.stats = rt, CommStats()
        parts = self._load(lay)
        self.logical_workers = self.workers.v
        self.local = _Local.from_parts(parts, cfg.normalize_features, lay.device)
        self.model = self._new_model(sum(p.num_local for p in parts), lay.device)
        _, self.agg, self.sync = parallelize_gcn(self.model, parts, lay.group, workers=self.workers, halo=cfg.halo,
                                                 grad_sync=cfg.grad_sync, stats=self.stats, kernel=cfg.kernel)
        local = self.local
        mine = [sum(float(m[s].sum()) for m in local.masks) for s in range(3)] + [sum(len(i) for i in local.node_ids)]
        counts = all_gather_rows(mine, lay.group, "counting training nodes").sum(0)
        self.counts = _Counts(*(int(c) for c in counts))
        if self.counts.train == 0:
            raise ConfigError("the train mask selects no node: nothing to train on")
        groups = self.model.param_groups(cfg.weight_decay)
        self.opt = make_dense_optimizer(cfg.optimizer, groups, lr=cfg.lr)  # torch.optim's, unguarded

    def _load(self, layout) -> list[GraphPart]:
        """This rank's parts (``self.workers.mine``): given, read from the folder (its metadata and those parts
        only), or the whole data set as one part. The ranks are checked against the partition's V here, once."""
        if self._part is not None:
            self.workers = LogicalWorkers(self._part.num_parts, layout.world_size, layout.rank,
                                          what="the partition's parts:")
            if self.workers.per_rank != 1:
                raise ConfigError(f"an in-memory part is one part per rank, but {self.workers.describe()}: give "
                                  "the partition folder (partitions=) to host several", field="partitions")
            return [self._part]
        if self.config.partitions is not None:
            from haloflow.partition.format import load_meta, load_partition

            meta = load_meta(self.config.partitions)
            self.workers = LogicalWorkers(meta.num_parts, layout.world_size, layout.rank,
                                          what=f"{self.config.partitions}: parts")
            return [load_partition(self.config.partitions, p, meta=meta) for p in self.workers.mine]
        if self._dataset is None:
            from haloflow.partition.pipeline import read_input

            cfg = self.config
            self._dataset = read_input(cfg.dataset, format=cfg.dataset_format, symmetrize=cfg.symmetrize,
                                       **dict(cfg.reader_options))
        self.workers = LogicalWorkers(1, layout.world_size, layout.rank, what="a data set: parts")
        return [whole_graph_part(self._dataset)]

    def _new_model(self, num_rows: int, device: torch.device) -> GCN:
        """The model on ``device``, once a lower bound on a training step's memory over ``num_rows`` rows (inner +
        halo) fits what the device has free: ``--hidden 1000000000`` is one clear error, not an allocation failure."""
        cfg, local = self.config, self.local
        model_config = cfg.model_config(local.in_dim, local.num_classes)
        need = model_config.min_training_bytes(num_rows, optimizer_slots=2 if cfg.optimizer == "adam" else 0)
        have = available_bytes(device)
        if have is not None and need > have:
            raise ConfigError(f"hidden_dim {cfg.hidden_dim} (--hidden) with num_layers {cfg.num_layers} on "
                              f"{num_rows:,} rows of {local.in_dim} features needs at least {format_bytes(need)} "
                              f"to train, but {device} has {format_bytes(have)} free: expected a smaller hidden_dim "
                              "(or more ranks, each holding fewer rows)", field="hidden_dim")
        return GCN(model_config).to(device)

    # ------------------------------------------------------------------------------------------ checkpoints
    def total_units(self) -> int:
        return self.config.epochs

    def identity(self) -> dict:
        c = self.counts
        return {"model": asdict(self.model.config), "optimizer": self.config.optimizer,
                "weight_decay": self.config.weight_decay, "nodes": c.nodes, "train_nodes": c.train,
                "val_nodes": c.val, "test_nodes": c.test, "normalize_features": self.config.normalize_features}

    def export(self) -> Exported:
        return Exported({"model": cpu_state(self.model.state_dict()), "optimizer": self.opt.state_dict(),
                         "history": [asdict(h) for h in self.history]})

    def restore(self, loaded) -> None:
        """The weights are the same on every rank, whatever K wrote them."""
        self.model.load_state_dict(loaded.state["model"])
        self.opt.load_state_dict(loaded.state["optimizer"])
        self.history = [EpochLog(**h) for h in loaded.state["history"]]

    # ------------------------------------------------------------------------------------------ training
    def begin(self, done: int) -> None:
        if self.config.precompute_first:  # layer 0's aggregation of the constant input, once
            self.model.precompute_blocks(self.local.xs, self.agg)

    def forward(self, epoch: int, *, params=None) -> list[torch.Tensor]:
        """The hosted parts' logits [(n_inner_p, C)] (training or evaluation, as the model's mode says)."""
        local = self.local
        return self.model.forward_blocks(local.xs, self.agg, local.node_ids, epoch, params=params)

    def train_step(self, epoch: int) -> list[torch.Tensor]:
        """Forward, backward, gradient sync and optimizer step of one epoch; returns the hosted parts' losses."""
        local = self.local
        self.model.train()
        self.agg.set_epoch(epoch, True)
        views = fanout(list(self.model.parameters()), len(local.xs))  # each part its own views of the weights
        logits = self.forward(epoch, params=views)
        losses = [gcn_loss(lg, y, m[0], self.counts.train) for lg, y, m in zip(logits, local.labels, local.masks)]
        loss = tree_sum(losses)  # backward gives each part's loss the gradient 1, exactly
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # each weight's gradient: the tree over the parts; reduce-scatters start from hooks
        self.sync.wait()  # every rank now holds the same summed gradients (the ranks' tree on top)
        self.opt.step()
        return [l.detach() for l in losses]

    def train_unit(self, epoch: int) -> EpochLog:
        device, local, stats = self.rt.layout.device, self.local, self.stats
        stats.reset()
        synchronize(device)
        t0 = time.perf_counter()
        losses = self.train_step(epoch)
        synchronize(device)
        epoch_s = time.perf_counter() - t0
        step = (stats.halo_bytes, stats.grad_bytes, stats.blocked_s, stats.halo_blocked_s)
        self.model.eval()  # evaluation: exact halos, no dropout
        self.agg.set_epoch(epoch, False)
        t1 = time.perf_counter()
        with torch.no_grad():
            self.logits = self.forward(epoch)  # [(n_inner_p, C)]
        correct = [_parts_sum([_correct(lg, y, m[s]) for lg, y, m in zip(self.logits, local.labels, local.masks)])
                   for s in range(3)]
        mine = RankEpoch(_parts_sum([float(l) for l in losses]), *correct, halo_bytes=float(step[0]), grad_bytes=float(step[1]),
                         blocked_s=step[2], epoch_s=epoch_s, eval_s=time.perf_counter() - t1, halo_blocked_s=step[3])
        entry = mine.reduce(self.rt.layout.group, epoch, self.counts, self.sync.launched_in_backward)
        self.history.append(entry)
        return entry

    def finish(self) -> None:
        self.agg.finish()  # stale mode leaves one exchange per layer in flight
        cfg = self.config
        if cfg.save and self.rt.layout.is_main:
            save_atomic(cfg.save, {"model_config": asdict(self.model.config),
                                   "state_dict": cpu_state(self.model.state_dict()),
                                   "train_config": _plain(asdict(cfg)), "final": asdict(self.history[-1])})

    def evaluate(self, run: RunInfo) -> dict[str, float]:
        f = self.history[-1]
        return {"loss": f.loss, "train_acc": f.train_acc, "val_acc": f.val_acc, "test_acc": f.test_acc}

    def result(self, run: RunInfo, metrics: dict[str, float]) -> GCNTrainResult:
        return GCNTrainResult(**run.base(), state_dict=cpu_state(self.model.state_dict()), history=self.history,
                              logits=torch.cat(self.logits), node_ids=self.local.cat_ids(), devices=self._devices(),
                              resumed_at=run.resumed_at)

    def _devices(self) -> dict[str, set[str]]:
        """Where the run's tensors ended up, by kind (the device test reads it): every one on ``config.device``."""
        local = self.local
        return {"model": {p.device.type for p in self.model.parameters()}, "features": {x.device.type for x in local.xs},
                "labels": {y.device.type for y in local.labels},
                "masks": {m.device.type for ms in local.masks for m in ms},
                "node_ids": {i.device.type for i in local.node_ids}, "logits": {lg.device.type for lg in self.logits},
                **self.agg.tensor_devices(local.xs[0].device)}


def train_gcn(config: GCNTrainConfig, *, dataset: GraphDataset | None = None,
              part: GraphPart | None = None) -> GCNTrainResult:
    """Train a GCN as ``config`` says; under torchrun each rank trains on its part.

    Args:
        config: see `GCNTrainConfig`.
        dataset / part: in-memory input instead of ``config.dataset`` / ``config.partitions`` (tests, notebooks).

    Raises:
        ConfigError: bad settings, or a partition whose K differs from the number of processes.
        DistributedError: a peer died or timed out.
    """
    return run(GCNFamily(config, dataset=dataset, part=part), config.runtime)


def _plain(value):
    """Config values as plain Python (paths as strings), so that ``torch.load(weights_only=True)`` reads them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value
