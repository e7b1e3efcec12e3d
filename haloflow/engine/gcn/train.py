"""Full-batch GCN as a family of the one training loop: `GCNFamily`, `train_gcn`, `GCNTrainResult`.

One epoch on every rank (the same steps whatever K: one process is the distributed path on a group of one, its
whole graph a partition of one part)::

    train   logits = model(x, agg, ids, epoch)      halo exchanges overlap the inner SpMMs
            loss = CE(train rows) / GLOBAL #train    so per-rank losses sum to the single-process loss
            loss.backward()                          weight-gradient buckets start their reduce-scatters from hooks
            grad_sync.wait(); optimizer.step()       summed in rank order: identical weights everywhere
    eval    logits = model(x, agg, ids, epoch)       no dropout, exact halos
            RankEpoch.reduce: one all-gather of this rank's counts, bytes and times -> an EpochLog

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

    loss: float  # this rank's part of the global loss (its rows' CE / global #train)
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
        """All ranks' rows in one all-gather; sums in rank order 0..K-1 (the loss is the same on every rank)."""
        names = [f.name for f in fields(self)]
        rows = all_gather_rows([getattr(self, n) for n in names], group, f"epoch {epoch} metrics")  # (K, 10)
        total, slowest = rows.sum(0), rows.max(0).values
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
    """The rows this process trains on, on the run's device."""

    x: torch.Tensor  # (n_own, F)
    labels: torch.Tensor  # (n_own,)
    masks: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # train, val, test, bool (n_own,)
    node_ids: torch.Tensor  # (n_own,) original ids
    num_classes: int

    @classmethod
    def from_part(cls, part: GraphPart, normalize: bool, device: torch.device) -> "_Local":
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
        return cls(x=tensor(x, np.float32), labels=tensor(part.labels, np.int64),
                   masks=tuple(tensor(none if m is None else m, bool)
                               for m in (part.train_mask, part.val_mask, part.test_mask)),
                   node_ids=tensor(part.orig_ids, np.int64), num_classes=int(part.num_classes))


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


class GCNFamily:
    """GCN for ``engine/trainer.run``: one unit is one epoch (a training step, then an exact evaluation).

    ``dataset`` / ``part``: in-memory input instead of ``config.dataset`` / ``config.partitions``.
    """

    kind, unit, more_flag = "gcn", "epoch", "--epochs"

    def __init__(self, config: GCNTrainConfig, *, dataset: GraphDataset | None = None,
                 part: GraphPart | None = None):
        self.config, self._dataset, self._part = config, dataset, part
        # A data set trains in this process alone; a partition joins torchrun's group (if there is one).
        self.join = config.partitions is not None or part is not None
        self.history: list[EpochLog] = []
        self.logits: torch.Tensor | None = None

    # ------------------------------------------------------------------------------------------ setup
    def setup(self, rt: Runtime) -> None:
        """Model, aggregator, gradient sync and this rank's rows, on the run's device."""
        cfg, lay = self.config, rt.layout
        self.rt, self.stats = rt, CommStats()
        part = self._load(lay)
        self.local = _Local.from_part(part, cfg.normalize_features, lay.device)
        self.model = self._new_model(part.num_local, lay.device)
        _, self.agg, self.sync = parallelize_gcn(self.model, part, lay.group, halo=cfg.halo,
                                                 grad_sync=cfg.grad_sync, stats=self.stats, kernel=cfg.kernel)
        counts = all_gather_rows([float(m.sum()) for m in self.local.masks] + [self.local.x.shape[0]], lay.group,
                                 "counting training nodes").sum(0)
        self.counts = _Counts(*(int(c) for c in counts))
        if self.counts.train == 0:
            raise ConfigError("the train mask selects no node: nothing to train on")
        groups = self.model.param_groups(cfg.weight_decay)
        self.opt = (torch.optim.Adam(groups, lr=cfg.lr) if cfg.optimizer == "adam"
                    else torch.optim.SGD(groups, lr=cfg.lr))

    def _load(self, layout) -> GraphPart:
        """This rank's part: given, read from the folder (its metadata and part ``rank`` only), or the whole
        data set as one part. The partition's K is checked against the ranks here, once."""
        if self._part is not None:
            layout.expect_parts(self._part.num_parts, "the partition")
            return self._part
        if self.config.partitions is not None:
            from haloflow.partition.format import load_meta, load_partition

            meta = load_meta(self.config.partitions)
            layout.expect_parts(meta.num_parts, str(self.config.partitions))
            return load_partition(self.config.partitions, layout.rank, meta=meta)
        if self._dataset is None:
            from haloflow.partition.pipeline import read_input

            cfg = self.config
            self._dataset = read_input(cfg.dataset, format=cfg.dataset_format, symmetrize=cfg.symmetrize,
                                       **dict(cfg.reader_options))
        return whole_graph_part(self._dataset)

    def _new_model(self, num_rows: int, device: torch.device) -> GCN:
        """The model on ``device``, once a lower bound on a training step's memory over ``num_rows`` rows (inner +
        halo) fits what the device has free: ``--hidden 1000000000`` is one clear error, not an allocation failure."""
        cfg, local = self.config, self.local
        model_config = cfg.model_config(local.x.shape[1], local.num_classes)
        need = model_config.min_training_bytes(num_rows, optimizer_slots=2 if cfg.optimizer == "adam" else 0)
        have = available_bytes(device)
        if have is not None and need > have:
            raise ConfigError(f"hidden_dim {cfg.hidden_dim} (--hidden) with num_layers {cfg.num_layers} on "
                              f"{num_rows:,} rows of {local.x.shape[1]} features needs at least {format_bytes(need)} "
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
        if self.config.precompute_first:
            self.model.precompute(self.local.x, self.agg)  # layer 0's aggregation of the constant input, once

    def train_step(self, epoch: int) -> torch.Tensor:
        """Forward, backward, gradient sync and optimizer step of one epoch; returns this rank's loss share."""
        local = self.local
        self.model.train()
        self.agg.set_epoch(epoch, True)
        logits = self.model(local.x, self.agg, local.node_ids, epoch)  # (n_own, C)
        loss = gcn_loss(logits, local.labels, local.masks[0], self.counts.train)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # gradient reduce-scatters start from hooks while backward runs
        self.sync.wait()  # every rank now holds the same summed gradients
        self.opt.step()
        return loss.detach()

    def train_unit(self, epoch: int) -> EpochLog:
        device, local, stats = self.rt.layout.device, self.local, self.stats
        stats.reset()
        synchronize(device)
        t0 = time.perf_counter()
        loss = self.train_step(epoch)
        synchronize(device)
        epoch_s = time.perf_counter() - t0
        step = (stats.halo_bytes, stats.grad_bytes, stats.blocked_s, stats.halo_blocked_s)
        self.model.eval()  # evaluation: exact halos, no dropout
        self.agg.set_epoch(epoch, False)
        t1 = time.perf_counter()
        with torch.no_grad():
            self.logits = self.model(local.x, self.agg, local.node_ids, epoch)
        correct = [_correct(self.logits, local.labels, m) for m in local.masks]
        mine = RankEpoch(float(loss), *correct, halo_bytes=float(step[0]), grad_bytes=float(step[1]),
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
                              logits=self.logits, node_ids=self.local.node_ids, devices=self._devices(),
                              resumed_at=run.resumed_at)

    def _devices(self) -> dict[str, set[str]]:
        """Where the run's tensors ended up, by kind (the device test reads it): every one on ``config.device``."""
        local = self.local
        return {"model": {p.device.type for p in self.model.parameters()}, "features": {local.x.device.type},
                "labels": {local.labels.device.type}, "masks": {m.device.type for m in local.masks},
                "node_ids": {local.node_ids.device.type}, "logits": {self.logits.device.type},
                **self.agg.tensor_devices(local.x.device)}


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
