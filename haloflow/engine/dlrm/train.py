"""DLRM on click logs as a family of the one training loop: `DLRMFamily`, `train_dlrm`, `DLRMTrainResult`.

One step, whatever K (one process is the sharded model on a group of one, hosting every logical worker)::

    every rank reads the same global batch (B samples), cut into V slices (V logical workers, engine/logical.py)
      -> takes its workers' slices (V / K of them, contiguous)
      forward      net(dense, sparse, sizes, slices)     the tables' lookups by the plan for V ranks, once over
                                                          the rank's samples; MLPs replicated, run per slice
      loss         BCE sum over each slice / B           (the V losses add up to the global mean: by the tree)
      backward     -> net.finish_step()                  gradient sync (MLPs, data-parallel tables) and the row
                                                          stores' fused update when the tables live in stores
      opt.step()   torch SGD / Adagrad on what remains parameters
    evaluation on the validation split: logloss = sum of BCE / N; AUC exactly by rank-sum over all N
      scores, gathered from every rank

The loop (``engine/trainer.py``) owns start-up, resume, checkpoints, progress and the summary. Defaults follow
the Criteo Kaggle DLRM (FACTS.md): SGD lr 0.1, batch 128, D = 16, bottom 512-256-64, top 512-256.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from haloflow.data.clicks import CHUNK
from haloflow.data.jagged import ClickBatch, JaggedBatch
from haloflow.engine.checkpoint import cpu_state
from haloflow.engine.comm import all_gather_cat
from haloflow.engine.dlrm.checkpoint import dense_state, load_dense_state, load_tables, table_pieces
from haloflow.engine.dlrm.config import DLRMTrainConfig
from haloflow.engine.dlrm.parallelize import DistributedDLRM, parallelize_dlrm
from haloflow.engine.dlrm.sharded_embedding import LookupIds, ShardedEmbeddingCollection
from haloflow.engine.logical import LogicalWorkers, rank_tree_sum, tree_sum
from haloflow.engine.optimizers import SGD, Adagrad
from haloflow.engine.runtime import ParallelLayout, Runtime, TrainResult, to_device
from haloflow.engine.trainer import Exported, RunInfo, run
from haloflow.errors import ConfigError, RunFailed
from haloflow.models.dlrm import DLRMConfig, dlrm_loss
from haloflow.partition.planner.plan_io import load_plan
from haloflow.partition.planner.planner import table_wise_plan

__all__ = ["DLRMTrainConfig", "DLRMTrainResult", "DLRMFamily", "StepLog", "train_dlrm", "train_step", "mlp_optimizer",
           "check_batch_ids", "auc_rank_sum", "score_split", "click_metrics"]

log = logging.getLogger(__name__)

DEFAULT_LOGICAL_WORKERS = 4  # V when none is given: --nproc 1, 2 and 4 then train the same floats


@dataclass(frozen=True)
class StepLog:
    """One training step, global over ranks; ``logged`` marks the steps that write a JSON line."""

    step: int  # counted from 1
    loss: float | None  # the newest loss read back (once per log_every steps; the first non-finite one of
    # those read); None before the first read
    window_loss: float  # mean over the last log_every steps
    samples_per_s: float  # since this run's first step
    cache: dict = field(default_factory=dict)  # hit rate and bytes of the tables' caches ({} without)
    logged: bool = False

    def progress(self) -> dict[str, float]:
        return {"loss": self.loss} if self.loss is not None else {}

    def record(self) -> dict | None:
        if not self.logged:
            return None
        return {"kind": "train", "step": self.step, "loss": self.window_loss, "samples_per_s": self.samples_per_s,
                **self.cache}


@dataclass(eq=False)
class DLRMTrainResult(TrainResult):
    """What a run measured (identical on every rank)."""

    steps: int = 0
    samples: int = 0
    losses: list[float] = field(default_factory=list)  # global mean loss of every step
    val_logloss: float | None = None
    val_auc: float | None = None
    comm_bytes_per_step: float = 0.0  # this rank's average, all collectives
    cache: dict = field(default_factory=dict)  # the tables' cache counters (hit rate, bytes moved); {} without
    resumed_at: int = 0  # steps done by the checkpoint this run resumed from

    @property
    def samples_per_s(self) -> float:
        done = self.samples * (self.steps - self.resumed_at) / max(self.steps, 1)  # this run's share
        return done / self.train_s if self.train_s > 0 else 0.0

    def summary(self) -> str:
        window = self.losses[-100:]
        rows = [["steps", self.steps], ["samples / s", self.samples_per_s],
                ["train loss (last 100 steps)", sum(window) / max(len(window), 1)],
                ["val logloss", _shown(self.val_logloss)], ["val AUC", _shown(self.val_auc, self.val_logloss)],
                ["bytes sent / step / rank", int(self.comm_bytes_per_step)],
                *([["cache hit rate", self.cache["cache_hit_rate"]]] if self.cache else []),
                *([["resumed after step", self.resumed_at]] if self.resumed_at else [])]
        return self.format_summary(f"DLRM, {self.steps} steps", rows, steps=self.steps - self.resumed_at)


def _check_batches(cfg: DLRMTrainConfig, data: "_Data", k: int) -> None:
    """Every rank needs a row of every batch (each trains its slice): a batch, or a split's last partial batch,
    smaller than the K ranks is refused before any work."""
    if cfg.batch_size < k:
        raise ConfigError(f"batch_size {cfg.batch_size} is smaller than the {k} ranks: each rank trains a slice of "
                          f"every batch; give --batch-size >= {k}", field="batch_size")
    for split in ("train", "val"):
        rows = data.num_rows(split)
        if 0 < rows % cfg.batch_size < k:
            raise ConfigError(f"the {split} split's last batch holds {rows % cfg.batch_size} rows ({rows} rows, "
                              f"batches of {cfg.batch_size}), fewer than the {k} ranks; choose a --batch-size that "
                              "leaves none or at least K", field="batch_size")


def _shown(metric: float | None, logloss: float | None = None) -> float | str:
    """A validation metric as the summary shows it, never NaN: no validation rows (a NaN log-loss) measured
    nothing; an AUC of rows of one class is undefined."""
    if metric is not None and not math.isnan(metric):
        return metric
    if logloss is not None and not math.isnan(logloss):
        return "undefined (the val rows are of one class)"
    return "skipped (no validation rows)"


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
            if self.loaders["train"].num_rows == 0:
                raise ConfigError(f"{config.data}: the train split has no rows: nothing to train on", field="data")
            self.num_dense = self.loaders["train"].num_dense

    def num_rows(self, split: str) -> int:
        if self.config.synthetic:
            return self.config.synthetic_train if split == "train" else self.config.synthetic_val
        return self.loaders[split].num_rows

    def num_batches(self, split: str) -> int:
        B = self.config.batch_size
        if self.config.synthetic:
            n = self.config.synthetic_train if split == "train" else self.config.synthetic_val
            return -(-n // B)
        return len(self.loaders[split])

    def batches(self, split: str, skip: int = 0) -> Iterator[ClickBatch]:
        """The split's batches in order, less the first ``skip`` (where a resumed run left off)."""
        if not self.config.synthetic:
            for i, batch in enumerate(self.loaders[split]):
                if i >= skip:
                    yield batch
            return
        B, n_train = self.config.batch_size, self.config.synthetic_train
        lo, n = (0, n_train) if split == "train" else (n_train, self.config.synthetic_val)
        lo, n = lo + skip * B, max(0, n - skip * B)  # a sample's values depend on its index alone
        # Drawn in pieces of many batches: the generator draws whole chunks of its stream at a time.
        piece = max(B, (CHUNK // B) * B)
        for start in range(lo, lo + n, piece):
            block = self.gen.samples(start, min(piece, lo + n - start))
            q, r = divmod(block.batch_size, B)
            yield from block.split_batch([B] * q + ([r] if r else []))



def _cache_record(embeddings: ShardedEmbeddingCollection) -> dict:
    """Hit rate and bytes of the tables' caches so far (nothing without a cache)."""
    s = embeddings.cache_stats()
    if not s.lookups:
        return {}
    out = {"cache_hit_rate": s.hit_rate, "cache_bytes_to_device": s.bytes_to_device,
           "cache_bytes_to_host": s.bytes_to_host}
    ahead = embeddings.planned_ahead()
    if ahead["plans"]:  # this rank's: what share of its plans were made ahead, and from announcements
        out["cache_prefetched"] = ahead["prefetched"] / ahead["plans"]
        out["cache_announced"] = ahead["announced"] / ahead["plans"]
    return out


def row_counts(data: _Data, steps: int) -> tuple[np.ndarray, ...]:
    """How often each row of each table is read by the first ``steps`` training batches (what this run trains
    on): the histogram the "frequency" cache policy ranks rows by. One pass over the batches' ids, every rank
    alike (each reads the global batches), so every rank's stores rank their rows the same way."""
    counts = [np.zeros(n, dtype=np.int64) for n in data.table_sizes]
    for i, batch in enumerate(data.batches("train")):
        if i >= steps:
            break
        lengths = batch.sparse.lengths.sum(1).tolist()  # ids per table
        for t, ids in enumerate(batch.sparse.values.split(lengths)):
            counts[t] += np.bincount(ids.numpy(), minlength=counts[t].shape[0])
    return tuple(counts)


def logical_workers(config: DLRMTrainConfig, layout: ParallelLayout) -> LogicalWorkers:
    """V and this rank's share of it: ``--logical-workers``, else a ``--plan``'s ranks, else 4 (or K when larger);
    ``--no-k-invariance``: V = K. Raises ``ConfigError`` when K cannot host V."""
    K = layout.world_size
    if config.no_k_invariance:
        v = K
    elif config.logical_workers is not None:
        v = config.logical_workers
    elif config.plan is not None:
        v = load_plan(config.plan).world_size
    else:
        v = max(DEFAULT_LOGICAL_WORKERS, K)
    return LogicalWorkers(v, K, layout.rank)


def build_dlrm(config: DLRMTrainConfig, data: _Data, layout: ParallelLayout, steps: int,
               workers: LogicalWorkers | None = None) -> DistributedDLRM:
    """This rank's DLRM, whatever K: its shards of the plan (``--plan``, else whole tables spread over the V
    logical ranks of ``workers``), hosted by the K ranks (V / K logical ranks each; at K = 1 every table on the
    one rank), built in place (no rank allocates a table it does not own).

    Tables live in row stores with the optimizer fused (``--optimizer``: SGD, Adagrad, row-wise Adagrad), the
    data-parallel replicas too: uncached shards of one width as one ``BatchedTables`` (one lookup and one update
    for all of them, nothing in a step reading a device value), cached ones (``--cache-ratio``, a plan's cached
    tables) one store each.
    """
    table_sizes, num_dense = data.table_sizes, data.num_dense
    model_config = DLRMConfig(table_sizes=table_sizes, num_dense=num_dense, embedding_dim=config.embedding_dim,
                              bottom_mlp=config.bottom_mlp, top_mlp=config.top_mlp, seed=config.seed)
    workers = workers or logical_workers(config, layout)
    if config.plan is not None:
        plan = load_plan(config.plan)
        if plan.world_size != workers.v:
            raise ConfigError(f"plan {config.plan} is for {plan.world_size} ranks, but the run has V = {workers.v} "
                              "logical workers: expected --logical-workers equal to the plan's ranks (or none)",
                              field="plan")
    else:
        plan = table_wise_plan(table_sizes, config.embedding_dim, workers.v)
    from haloflow.cache import CacheConfig, make_optimizer
    from haloflow.engine.dlrm.shard_stores import ShardStores

    cache = None
    if config.cache_ratio is not None:  # lookahead: Belady's bypass (a miss cached only if used sooner than its victim)
        cache = CacheConfig(ratio=config.cache_ratio, policy=config.cache_policy, window=config.cache_window,
                            admit_all=config.cache_policy != "lookahead")
    histograms = row_counts(data, steps) if cache is not None and cache.policy == "frequency" else None
    dtype = getattr(torch, config.dtype)
    stores = ShardStores(optimizer=make_optimizer({"name": config.optimizer, "lr": config.lr}), cache=cache,
                         device=layout.device, histograms=histograms, dtype=dtype)
    net = parallelize_dlrm(model_config, plan, layout.group, dp_grad=config.dp_grad, device=layout.device,
                           stores=stores, dtype=dtype, k_invariant=not config.no_k_invariance)
    net.embeddings.check_ids = False  # the trainer checks each batch's ids on the host (``check_batch_ids``)
    if cache is not None and cache.policy == "lookahead" and not net.embeddings.looks_ahead:
        raise ConfigError("cache policy 'lookahead' needs the rows of the batches to come before their exchange: "
                          "every table of the plan table- or column-wise, none replicated (data-parallel) or split "
                          "by rows; expected --cache-policy lru, lfu or frequency with this plan",
                          field="cache_policy")
    return net


def check_batch_ids(batch: ClickBatch, table_sizes: tuple[int, ...], where: str) -> None:
    """Every id of a global batch (on the host) names a row of its table; else a ``ConfigError`` naming the
    feature, the id and the table's rows. NumPy on the host: the step itself then never reads a device value."""
    sparse = batch.sparse
    counts = sparse.lengths.sum(1).numpy()  # (T,)
    ids = sparse.values.numpy()
    limit = np.repeat(np.asarray(table_sizes, dtype=np.int64), counts)  # (nnz,)
    bad = (ids < 0) | (ids >= limit)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        t = int(np.searchsorted(np.cumsum(counts), i, side="right"))
        raise ConfigError(f"{where}: sparse feature {t}: id {int(ids[i])} outside table {t}'s rows "
                          f"0..{table_sizes[t] - 1}")


def _local(batch: ClickBatch, layout: ParallelLayout, dtype: torch.dtype,
           workers: LogicalWorkers) -> tuple[ClickBatch, list[int]]:
    """This rank's slice of the global batch (its logical workers' slices, contiguous), on its device (through
    pinned memory on CUDA), its dense features and labels in the model's floating type; and every rank's size."""
    sizes = workers.rank_sizes(batch.batch_size)
    mine = batch.split_batch(sizes)[layout.rank]
    dev = layout.device
    if dev.type != "cpu" or dtype != torch.float32:
        mine = ClickBatch(to_device(mine.dense, dev).to(dtype),
                          JaggedBatch(to_device(mine.sparse.lengths, dev), to_device(mine.sparse.values, dev)),
                          to_device(mine.labels, dev).to(dtype))
    return mine, sizes


def slice_losses(logits: torch.Tensor, labels: torch.Tensor, slices: list[int], batch_size: int) -> torch.Tensor:
    """Each logical worker's share of the global mean loss, (V/K,): the BCE sum over its slice / B, one sum per
    slice in the slice's shape (its bits do not depend on K). Their sum is the rank's loss; ``tree_sum`` of
    them, then over the ranks, the step's loss."""
    if len(slices) == 1:  # the rank's samples are one slice
        return dlrm_loss(logits, labels, global_batch_size=batch_size).unsqueeze(0)
    return torch.stack([dlrm_loss(x, y, global_batch_size=batch_size)
                        for x, y in zip(logits.split(slices), labels.split(slices))])


def mlp_optimizer(net: DistributedDLRM, optimizer: str, lr: float) -> torch.optim.Optimizer:
    """The torch optimizer of the MLPs (the tables' is fused into their stores): SGD, or Adagrad for both
    Adagrads; fused (foreach where torch has no fused Adagrad: off the CPU), so one op updates every MLP tensor
    and no step reads Adagrad's step count (a device value) once per tensor."""
    params = [p for p in net.parameters() if p.requires_grad]
    cpu = all(p.device.type == "cpu" for p in params)
    one_op = {"fused": True} if optimizer == "sgd" or cpu else {"foreach": True}
    return (SGD if optimizer == "sgd" else Adagrad)(params, lr=lr, **one_op)  # torch.optim's, unguarded


def train_step(net: DistributedDLRM, opt: torch.optim.Optimizer, mine: ClickBatch, sizes: list[int],
               slices: list[int], batch_size: int, upcoming: LookupIds | ClickBatch | None = None,
               background: bool = False) -> torch.Tensor:
    """One training step on this rank's slice of a global batch: forward, backward, the gradient syncs and both
    optimizers (the tables' fused into their stores, ``opt`` the MLPs'). Returns the slices' losses (V/K,), on
    the device: nothing here reads a device value (at K = 1; K ranks' exchanges need their sizes on the host).

    ``upcoming``: what this rank's tables look up for the next batch (``ahead_ids``; one process: its batch),
    whose cache moves are planned and carried out after the forward (``background``: while the backward runs), so
    that its lookup finds its rows cached."""
    opt.zero_grad(set_to_none=True)
    net.stats.reset()
    logits = net(mine.dense, mine.sparse, sizes, slices)  # (B_r,)
    if upcoming is not None:
        net.embeddings.prefetch(upcoming if isinstance(upcoming, LookupIds) else upcoming.sparse, background=background)
    losses = slice_losses(logits, mine.labels, slices, batch_size)  # (V/K,)
    losses.sum().backward()  # each sample's gradient is (p - y) / B whatever the slices
    net.finish_step()  # gradient sync; the row stores' fused update
    opt.step()
    return losses


class DLRMFamily:
    """DLRM for ``engine/trainer.run``: one unit is one global batch."""

    kind, unit, more_flag, join = "dlrm", "step", "--max-steps", True
    adapts_threads = True  # its K-rank results hold at any thread count (tests/engine/test_thread_count_exact.py)

    def __init__(self, config: DLRMTrainConfig):
        self.config = config
        self.losses: list[float] = []
        self._unread: list[torch.Tensor] = []  # the last steps' losses, not yet read back from the device
        self.samples = 0
        self.comm = 0  # bytes this rank sent in this run's steps

    def setup(self, rt: Runtime) -> None:
        cfg = self.config
        self.rt, self.data, self.dtype = rt, _Data(cfg), getattr(torch, cfg.dtype)
        _check_batches(cfg, self.data, rt.layout.world_size)
        self.per_epoch = self.data.num_batches("train")
        self.total = self.per_epoch * cfg.epochs if cfg.max_steps is None else min(self.per_epoch * cfg.epochs,
                                                                                   cfg.max_steps)
        self.workers = logical_workers(cfg, rt.layout)
        self.logical_workers = self.workers.v  # the summary names V beside K
        self.net = build_dlrm(cfg, self.data, rt.layout, min(self.total, self.per_epoch), self.workers)
        self.opt = mlp_optimizer(self.net, cfg.optimizer, cfg.lr)
        self.devices = {"model": {p.device.type for p in self.net.parameters()}, "batches": set()}

    # ------------------------------------------------------------------------------------------ checkpoints
    def total_units(self) -> int:
        return self.total

    def identity(self) -> dict:
        cfg, data = self.config, self.data
        return {"table_sizes": list(data.table_sizes), "num_dense": data.num_dense, "train_batches": self.per_epoch,
                "batch_size": cfg.batch_size, "embedding_dim": cfg.embedding_dim, "bottom_mlp": list(cfg.bottom_mlp),
                "top_mlp": list(cfg.top_mlp), "seed": cfg.seed, "optimizer": cfg.optimizer,
                "logical_workers": self.workers.v}

    def export(self) -> Exported:
        loss = self._read_losses()
        if loss is not None and not math.isfinite(loss) and not self.rt.config.allow_nonfinite:
            step = next(i for i, x in enumerate(self.losses) if not math.isfinite(x)) + 1
            raise RunFailed(f"dlrm: the loss at step {step} is {self.losses[step - 1]} (not a finite number); the run "
                            "stopped before writing a checkpoint of it (a smaller --lr, or --allow-nonfinite to train "
                            "on)")
        return Exported({"dense": dense_state(self.net.model, self.opt), "losses": self.losses,
                         "samples": self.samples}, tuple(table_pieces(self.net.embeddings, self.rt.layout.rank)))

    def restore(self, loaded) -> None:
        """MLPs, their optimizer state, this rank's table rectangles, the losses and samples so far."""
        load_dense_state(self.net.model, self.opt, loaded.state["dense"], loaded.path)
        load_tables(self.net.embeddings, loaded)
        self.samples = int(loaded.state["samples"])
        self.losses = [float(x) for x in loaded.state["losses"]]

    # ------------------------------------------------------------------------------------------ training
    def begin(self, done: int) -> None:
        self.start, self.t0 = done, time.perf_counter()
        self.stream = self._stream(done)
        # batches read ahead, from the next step's on: one, for a prefetch of the next batch's rows; a lookahead
        # cache's window + 2 (the step's batch, the prefetched one and the window after it), each announced to
        # it as it is read
        emb = self.net.embeddings
        self._depth = (self.config.cache_window + 2 if emb.looks_ahead else 2) if emb.can_prefetch else 1
        self._ahead: collections.deque[tuple[ClickBatch, ClickBatch, list[int], LookupIds | None]] = collections.deque()
        self._read_to = done  # steps whose batch has been read

    def _stream(self, done: int) -> Iterator[ClickBatch]:
        """The training batches from step ``done`` on, epoch after epoch (the data position is done mod the
        batches per epoch)."""
        skip = done % self.per_epoch
        while True:
            yield from self.data.batches("train", skip=skip)
            skip = 0

    def _read(self, index: int) -> tuple[ClickBatch, ClickBatch, list[int]]:
        """The global batch of step ``index + 1`` (ids checked), this rank's slice of it on its device, and every
        rank's batch size; the batches after it read ahead as far as ``_depth`` says (and the run goes)."""
        while len(self._ahead) < self._depth and self._read_to < self.total:
            batch = next(self.stream)
            check_batch_ids(batch, self.data.table_sizes, f"training batch {self._read_to + 1}")
            mine, sizes = _local(batch, self.rt.layout, self.dtype, self.workers)
            emb, ids = self.net.embeddings, None
            if emb.can_prefetch:  # what this rank's tables will look up for it: every rank reads the global batch
                ids = emb.ahead_ids(mine.sparse if len(sizes) == 1 else batch.sparse, sizes)
                emb.announce(ids)
            self._ahead.append((batch, mine, sizes, ids))
            self._read_to += 1
        return self._ahead.popleft()[:3]

    def train_unit(self, index: int) -> StepLog:
        cfg, lay, net = self.config, self.rt.layout, self.net
        batch, mine, sizes = self._read(index)
        slices = self.workers.my_slices(batch.batch_size)
        if not self.devices["batches"]:  # where the batches land is decided once, by the first
            self.devices["batches"] = {t.device.type for t in (mine.dense, mine.sparse.values, mine.labels)}
        upcoming = None
        if net.embeddings.can_prefetch and self._ahead:  # the next batch's rows move in meanwhile
            upcoming = self._ahead[0][3]
        # in the background on a GPU (a side stream); on the CPU in line: a thread beside the step's own two
        # was slower on 2 cores (0.070-0.083 s a step against 0.066-0.069, batch 2,048, 5 % cached)
        losses = train_step(net, self.opt, mine, sizes, slices, batch.batch_size, upcoming,
                            background=lay.device.type == "cuda")
        self.comm += net.stats.total()
        # the global mean: this rank's slices by the tree, then the ranks' (the V-tree), kept on the device and
        # read back once per --log-every steps (a read waits for the device)
        self._unread.append(rank_tree_sum(tree_sum(losses.detach().unbind(0)), lay.group))
        self.samples += batch.batch_size
        step = index + 1
        logged = step % cfg.log_every == 0 or step == self.total
        shown = self._read_losses() if logged else (self.losses[-1] if self.losses else None)
        window = self.losses[-cfg.log_every:] or [math.nan]
        rate = (step - self.start) * batch.batch_size / (time.perf_counter() - self.t0)
        return StepLog(step=step, loss=shown, window_loss=sum(window) / len(window), samples_per_s=rate,
                       cache=_cache_record(net.embeddings) if logged else {}, logged=logged)

    def _read_losses(self) -> float | None:
        """The steps' losses still on the device, read back in one go into ``losses``; returns the first
        non-finite one of them (the trainer stops there), else the newest loss."""
        if self._unread:
            read = torch.stack(self._unread).reshape(-1).tolist()
            self._unread = []
            self.losses.extend(read)
            bad = [x for x in read if not math.isfinite(x)]
            if bad:
                return bad[0]
        return self.losses[-1] if self.losses else None

    def finish(self) -> None:
        self._read_losses()

    def evaluate(self, run: RunInfo) -> dict[str, float]:
        val_logloss, val_auc = _evaluate(self.net, self.data, self.rt.layout, self.config, self.workers)
        if math.isnan(val_auc) and self.rt.layout.is_main and self.data.num_batches("val") == 0:
            log.warning("validation skipped: the val split has no rows (the summary's val metrics are null)")
        return {"val_logloss": val_logloss, "val_auc": val_auc, "samples_per_s": self._samples_per_s(run),
                "comm_bytes_per_step": self.comm / max(run.trained, 1), **_cache_record(self.net.embeddings)}

    def _samples_per_s(self, run: RunInfo) -> float:
        done = self.samples * run.trained / max(run.total, 1)  # this run's share
        return done / run.train_s if run.train_s > 0 else 0.0

    def result(self, run: RunInfo, metrics: dict[str, float]) -> DLRMTrainResult:
        # The whole model's weights on one rank only: K ranks would need a collective that materialises every
        # table on every rank (``DistributedDLRM.to_dlrm``).
        state = cpu_state(self.net.to_dlrm().state_dict()) if self.rt.layout.world_size == 1 else {}
        return DLRMTrainResult(**run.base(), state_dict=state, steps=run.total, samples=self.samples,
                               losses=self.losses, val_logloss=metrics["val_logloss"], val_auc=metrics["val_auc"],
                               comm_bytes_per_step=metrics["comm_bytes_per_step"], devices=self.devices,
                               cache=_cache_record(self.net.embeddings), resumed_at=run.resumed_at)


def _evaluate(net: DistributedDLRM, data: _Data, layout: ParallelLayout, config: DLRMTrainConfig,
              workers: LogicalWorkers | None = None) -> tuple[float, float]:
    _, logits, labels = score_split(net, data, layout, config, "val", config.max_eval_batches, workers)
    return click_metrics(logits, labels)


@torch.no_grad()
def score_split(net: DistributedDLRM, data: _Data, layout: ParallelLayout, config: DLRMTrainConfig, split: str,
                max_batches: int | None = None, workers: LogicalWorkers | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row of ``split`` (the first ``max_batches`` batches): its index in the split, logit and label,
    gathered from every rank and put in row order (CPU tensors, the same on every rank).

    The metrics are computed from these in row order, so that they depend on the scores alone, not on how the
    ranks cut the batches (``predict_dlrm`` reports the same numbers as the trainer)."""
    ids, scores, labels = [], [], []
    B, dtype = config.batch_size, getattr(torch, config.dtype)
    workers = workers or logical_workers(config, layout)  # each slice scored in its shapes: the same at any K
    for i, batch in enumerate(data.batches(split)):
        if max_batches is not None and i >= max_batches:
            break
        mine, sizes = _local(batch, layout, dtype, workers)
        logits = net(mine.dense, mine.sparse, sizes, workers.my_slices(batch.batch_size))  # (B_r,)
        lo = i * B + sum(sizes[: layout.rank])  # every batch but the last holds B rows
        ids.append(torch.arange(lo, lo + sizes[layout.rank], dtype=torch.int64))
        scores.append(logits.double())
        labels.append(mine.labels.double())
    if not ids:
        empty = torch.zeros(0, dtype=torch.float64)
        return torch.zeros(0, dtype=torch.int64), empty, empty
    all_ids = all_gather_cat(torch.cat(ids), layout.group).cpu()
    order = torch.argsort(all_ids, stable=True)
    all_scores = all_gather_cat(torch.cat(scores), layout.group).cpu()
    all_labels = all_gather_cat(torch.cat(labels), layout.group).cpu()
    return all_ids[order], all_scores[order], all_labels[order]


def click_metrics(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """(log-loss, AUC) of logits (n,) against labels (n,), in float64 in the given order; NaN for no rows."""
    if logits.numel() == 0:
        return float("nan"), float("nan")
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.double(), labels.double(), reduction="sum")
    return float(loss) / logits.numel(), auc_rank_sum(logits, labels)


def train_dlrm(config: DLRMTrainConfig) -> DLRMTrainResult:
    """Train and evaluate; every rank returns the same ``DLRMTrainResult``.

    Under torchrun every rank joins the group and holds its shards of the plan; alone, the one rank holds them all.
    """
    return run(DLRMFamily(config), config.runtime)
