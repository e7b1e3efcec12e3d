"""Full-batch GCN training, single-process or one rank per part: `GCNTrainConfig`, `train_gcn`, `GCNTrainResult`.

One epoch on every rank (the same steps whatever K, so K = 1 and K = 4 compute the same numbers)::

    train   logits = model(x, agg, ids, epoch)      halo exchanges overlap the inner SpMMs
            loss = CE(train rows) / GLOBAL #train    so per-rank losses sum to the single-process loss
            loss.backward()                          weight-gradient buckets start their reduce-scatters from hooks
            grad_sync.wait(); optimizer.step()       summed in rank order: identical weights everywhere
    eval    logits = model(x, agg, ids, epoch)       no dropout, exact halos
            one all-gather of [loss, correct counts, bytes, times] -> global accuracy, summed bytes

The shared ``Runtime`` (``engine/runtime.py``) owns the process group, the device, the progress output for people
and the JSON lines for programs; rank 0 saves the final weights (``save``, written atomically).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from haloflow.data.graph import GraphDataset
from haloflow.engine.checkpoint import cpu_state
from haloflow.engine.comm import CommStats, all_gather_rows
from haloflow.engine.gcn.config import GCNTrainConfig
from haloflow.engine.gcn.parallelize import parallelize_gcn
from haloflow.engine.grad_sync import BucketedGradSync
from haloflow.engine.runtime import ParallelLayout, Runtime, TrainResult, save_atomic, synchronize
from haloflow.errors import ConfigError
from haloflow.models.aggregate import LocalAggregator
from haloflow.models.gcn import GCN, gcn_loss
from haloflow.partition.types import GraphPart
from haloflow.utils.memory import available_bytes, format_bytes

__all__ = ["GCNTrainConfig", "EpochLog", "GCNTrainResult", "GCNSetup", "setup_gcn", "train_gcn"]

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
        rows = [["loss", f.loss], ["train accuracy", f.train_acc], ["val accuracy", f.val_acc],
                ["test accuracy", f.test_acc]]
        rows += [["resumed after epoch", self.resumed_at]] if self.resumed_at else []
        return self.format_summary(f"GCN, {len(self.history)} epochs", rows,
                                   epochs=len(self.history) - self.resumed_at)


@dataclass(eq=False)
class _Local:
    """The rows this process trains on, whatever the input, on the run's device."""

    x: torch.Tensor  # (n_own, F)
    labels: torch.Tensor  # (n_own,)
    masks: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # train, val, test, bool (n_own,)
    node_ids: torch.Tensor  # (n_own,) original ids
    num_classes: int


def _local_from(features, labels, train, val, test, node_ids, num_classes: int, normalize: bool,
                device: torch.device) -> _Local:
    if features is None or labels is None or train is None:
        raise ConfigError("GCN training needs node features, labels and a train mask; the input has "
                          f"features={features is not None}, labels={labels is not None}, train_mask={train is not None}")
    n = labels.shape[0]
    none = np.zeros(n, dtype=bool)

    def tensor(a, dtype) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=dtype)).to(device)  # a private copy (parts are memory-mapped)

    x = np.array(features, dtype=np.float32)
    if normalize:
        sums = x.sum(axis=1, keepdims=True, dtype=np.float64)  # (n, 1)
        x = (x / np.where(sums == 0, 1.0, sums)).astype(np.float32)
    return _Local(
        x=tensor(x, np.float32),
        labels=tensor(labels, np.int64),
        masks=tuple(tensor(none if m is None else m, bool) for m in (train, val, test)),
        node_ids=tensor(node_ids, np.int64),
        num_classes=int(num_classes),
    )


def _load_dataset(config: GCNTrainConfig) -> GraphDataset:
    from haloflow.partition.pipeline import read_input

    return read_input(config.dataset, format=config.dataset_format, symmetrize=config.symmetrize,
                      **dict(config.reader_options))


def _load_part(config: GCNTrainConfig, layout: ParallelLayout) -> GraphPart:
    from haloflow.partition.format import load_meta, load_partition

    meta = load_meta(config.partitions)
    layout.expect_parts(meta.num_parts, str(config.partitions))
    return load_partition(config.partitions, layout.rank, meta=meta)


def _correct(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> float:
    return float((logits.argmax(1)[mask] == labels[mask]).sum())  # a device sync on CUDA


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
    # A data set trains in this process alone; a partition joins torchrun's group (if there is one).
    join = config.partitions is not None or part is not None
    with Runtime.start(config.runtime, join=join) as rt:
        return _train(config, rt, dataset, part)


class GCNSetup(NamedTuple):
    """What a GCN run trains with (the trainer's and the overlap benchmark's): the model and its input rows on the
    run's device, the aggregator (local or halo), the gradient sync and the communication counters."""

    model: GCN
    agg: object
    sync: BucketedGradSync
    local: _Local
    stats: CommStats


def setup_gcn(config: GCNTrainConfig, rt: Runtime, dataset: GraphDataset | None = None,
              part: GraphPart | None = None) -> GCNSetup:
    """Model, aggregator, gradient sync and local rows for either input, on the run's device."""
    stats, device = CommStats(), rt.layout.device
    if config.dataset is not None and part is None:
        dataset = dataset if dataset is not None else _load_dataset(config)
        local = _local_from(dataset.features, dataset.labels, dataset.train_mask, dataset.val_mask,
                            dataset.test_mask, np.arange(dataset.num_nodes), dataset.num_classes,
                            config.normalize_features, device)
        model = _new_model(config, local, dataset.num_nodes, device)
        agg = LocalAggregator(dataset.graph, model.config.norm, kernel=config.kernel)
        return GCNSetup(model, agg, BucketedGradSync(model.parameters(), None), local, stats)
    part = part if part is not None else _load_part(config, rt.layout)
    rt.layout.expect_parts(part.num_parts, "the partition")
    local = _local_from(part.features, part.labels, part.train_mask, part.val_mask, part.test_mask,
                        part.orig_ids, part.num_classes, config.normalize_features, device)
    model = _new_model(config, local, part.num_local, device)
    _, agg, sync = parallelize_gcn(model, part, rt.layout.group, halo=config.halo, grad_sync=config.grad_sync,
                                   stats=stats, kernel=config.kernel)
    return GCNSetup(model, agg, sync, local, stats)


def _new_model(config: GCNTrainConfig, local: _Local, num_rows: int, device: torch.device) -> GCN:
    """The model on ``device``, once a lower bound on a training step's memory over ``num_rows`` rows (inner +
    halo) fits what the device has free: ``--hidden 1000000000`` is one clear error, not an allocation failure."""
    model_config = config.model_config(local.x.shape[1], local.num_classes)
    need = model_config.min_training_bytes(num_rows, optimizer_slots=2 if config.optimizer == "adam" else 0)
    have = available_bytes(device)
    if have is not None and need > have:
        raise ConfigError(f"hidden_dim {config.hidden_dim} (--hidden) with num_layers {config.num_layers} on "
                          f"{num_rows:,} rows of {local.x.shape[1]} features needs at least {format_bytes(need)} to "
                          f"train, but {device} has {format_bytes(have)} free: expected a smaller hidden_dim (or more "
                          "ranks, each holding fewer rows)", field="hidden_dim")
    return GCN(model_config).to(device)


def _train(config: GCNTrainConfig, rt: Runtime, dataset, part) -> GCNTrainResult:
    lay = rt.layout
    model, agg, sync, local, stats = setup_gcn(config, rt, dataset, part)
    counts = all_gather_rows([float(m.sum()) for m in local.masks] + [local.x.shape[0]], lay.group,
                             "counting training nodes").sum(0)
    n_train, n_val, n_test, n_nodes = (int(c) for c in counts)
    if n_train == 0:
        raise ConfigError("the train mask selects no node: nothing to train on")
    groups = model.param_groups(config.weight_decay)
    opt = (torch.optim.Adam(groups, lr=config.lr) if config.optimizer == "adam"
           else torch.optim.SGD(groups, lr=config.lr))
    ckpt = rt.checkpointer("gcn", {"model": asdict(model.config), "optimizer": config.optimizer,
                                   "weight_decay": config.weight_decay, "nodes": n_nodes, "train_nodes": n_train,
                                   "val_nodes": n_val, "test_nodes": n_test, "normalize_features":
                                   config.normalize_features})
    history, start = _resume(ckpt, model, opt, config.epochs)
    set_epoch = getattr(agg, "set_epoch", lambda epoch, training: None)
    if config.precompute_first:
        model.precompute(local.x, agg)  # layer 0's aggregation of the constant input, once (exact)
    rt.started()
    reporter = rt.reporter(total=config.epochs, unit="epoch", desc=f"train gcn (K={lay.world_size})", done=start)
    t_train = time.perf_counter()
    try:
        for epoch in range(start, config.epochs):
            ckpt.maybe_fail(epoch + 1)
            # ---- training step
            model.train()
            set_epoch(epoch, True)
            stats.reset()
            synchronize(lay.device)
            t0 = time.perf_counter()
            logits = model(local.x, agg, local.node_ids, epoch)  # (n_own, C)
            loss = gcn_loss(logits, local.labels, local.masks[0], n_train)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # gradient reduce-scatters start from hooks while backward runs
            sync.wait()  # every rank now holds the same summed gradients
            opt.step()
            synchronize(lay.device)
            epoch_s = time.perf_counter() - t0
            step = (stats.halo_bytes, stats.grad_bytes, stats.blocked_s, stats.halo_blocked_s)
            # ---- evaluation (exact halos, no dropout)
            model.eval()
            set_epoch(epoch, False)
            t1 = time.perf_counter()
            with torch.no_grad():
                logits = model(local.x, agg, local.node_ids, epoch)
            row = [float(loss.detach()), *(_correct(logits, local.labels, m) for m in local.masks),
                   float(step[0]), float(step[1]), step[2], epoch_s, time.perf_counter() - t1, step[3]]
            rows = all_gather_rows(row, lay.group, f"epoch {epoch} metrics")  # (K, 10)
            total, slowest = rows.sum(0), rows.max(0).values  # loss summed in rank order 0..K-1
            entry = EpochLog(
                epoch=epoch, loss=float(total[0]),
                train_acc=float(total[1]) / n_train,
                val_acc=float(total[2]) / max(n_val, 1),
                test_acc=float(total[3]) / max(n_test, 1),
                epoch_s=float(slowest[7]), eval_s=float(slowest[8]),
                halo_bytes=int(total[4]), grad_bytes=int(total[5]), blocked_s=float(slowest[6]),
                halo_blocked_s=float(slowest[9]), grad_buckets_in_backward=sync.launched_in_backward,
            )
            history.append(entry)
            rt.metrics.write({"kind": "epoch", **asdict(entry)})
            reporter.update({"loss": entry.loss, "val": entry.val_acc, "test": entry.test_acc,
                             "epoch_s": entry.epoch_s})
            if ckpt.due(epoch + 1, config.epochs):
                ckpt.save(epoch + 1, {"model": cpu_state(model.state_dict()), "optimizer": opt.state_dict(),
                                      "history": [asdict(h) for h in history], "rng": torch.get_rng_state()})
        finish = getattr(agg, "finish", None)
        if finish is not None:
            finish()  # stale mode leaves one exchange per layer in flight
    finally:
        reporter.close()
    train_s = time.perf_counter() - t_train
    rt.metrics.write({"kind": "summary", "epochs": config.epochs, "resumed_at": start, "world_size": lay.world_size,
                      "threads_per_rank": rt.threads, "device": str(lay.device), "startup_s": rt.startup_s,
                      "train_s": train_s, "epoch_s_mean": train_s / (config.epochs - start)})
    devices = _devices(model, local, agg, logits)
    state = cpu_state(model.state_dict())
    result = GCNTrainResult(layout=lay, startup_s=rt.startup_s, train_s=train_s,
                            threads=rt.threads, state_dict=state, records=rt.metrics.records,
                            history=history, logits=logits, node_ids=local.node_ids, devices=devices,
                            resumed_at=start)
    if config.save and lay.is_main:
        save_atomic(config.save, {"model_config": asdict(model.config), "state_dict": state,
                                  "train_config": _plain(asdict(config)), "final": asdict(history[-1])})
    log.info("trained %d epochs on %s: loss %.4f, test accuracy %.4f", config.epochs, rt.describe(),
             history[-1].loss, history[-1].test_acc)
    return result


def _resume(ckpt, model: GCN, opt: torch.optim.Optimizer, epochs: int) -> tuple[list[EpochLog], int]:
    """The history and the first epoch to train: from the checkpoint ``ckpt`` resumes (weights, optimizer state
    and RNG restored in place), else empty and 0. The weights are the same on every rank, whatever K wrote them."""

    def restore(loaded) -> tuple[list[EpochLog], int]:
        model.load_state_dict(loaded.state["model"])
        opt.load_state_dict(loaded.state["optimizer"])
        torch.set_rng_state(loaded.state["rng"])
        return [EpochLog(**h) for h in loaded.state["history"]], loaded.step

    return ckpt.resume(epochs, "epoch", "--epochs", restore) or ([], 0)


def _devices(model: GCN, local: _Local, agg, logits: torch.Tensor) -> dict[str, set[str]]:
    """Where the run's tensors ended up, by kind (the device test reads it): every one on ``config.device``."""
    found = {
        "model": {p.device.type for p in model.parameters()},
        "features": {local.x.device.type}, "labels": {local.labels.device.type},
        "masks": {m.device.type for m in local.masks}, "node_ids": {local.node_ids.device.type},
        "logits": {logits.device.type},
    }
    exchanges = [*getattr(agg, "_exact", {}).values(), *(s.exchange for s in getattr(agg, "_stale", {}).values())]
    if exchanges:
        found["halo_buffers"] = {b.device.type for ex in exchanges for b in ex._buffers.values()}
        found["send_ids"] = {d.type for ex in exchanges for d in ex._ids_by_device if d == local.x.device}
    return found


def _plain(value):
    """Config values as plain Python (paths as strings), so that ``torch.load(weights_only=True)`` reads them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value
