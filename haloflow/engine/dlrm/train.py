"""Training loop of DLRM on click logs: one process, or K ranks with tables sharded by a plan.

::

    every rank reads the same global batch (B samples) -> takes its contiguous slice (split_sizes)
      forward  -> loss = BCE sum over the slice / B            (the K losses add up to the global mean)
      backward -> finish_grad_sync (MLP gradients, data-parallel tables) -> SGD step (sparse on the shards)
    evaluation on the validation split: logloss = sum of BCE / N; AUC exactly by rank-sum over all N
      scores, gathered from every rank
    rank 0: a progress bar (or a line every N steps), one JSON line per log interval and evaluation
      (``--log-jsonl``), a summary table at the end

The shared ``Runtime`` owns the process group, the device (batches reach CUDA through pinned memory) and the
output. Defaults follow the Criteo Kaggle DLRM (FACTS.md): SGD lr 0.1, batch 128, D = 16, bottom 512-256-64,
top 512-256.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from haloflow.data.clicks import CHUNK
from haloflow.data.jagged import ClickBatch, JaggedBatch, split_sizes
from haloflow.engine.comm import all_gather_cat
from haloflow.engine.checkpoint import cpu_state
from haloflow.engine.dlrm.config import DLRMTrainConfig
from haloflow.engine.dlrm.checkpoint import dense_state, load_dense_state, load_tables, table_pieces
from haloflow.engine.dlrm.sharding import build_sharded_dlrm
from haloflow.engine.runtime import ParallelLayout, Runtime, TrainResult, to_device
from haloflow.errors import ConfigError
from haloflow.models.dlrm import DLRM, DLRMConfig, dlrm_loss
from haloflow.partition.planner.plan_io import load_plan
from haloflow.partition.planner.planner import table_wise_plan

__all__ = ["DLRMTrainConfig", "DLRMTrainResult", "train_dlrm", "auc_rank_sum"]

log = logging.getLogger(__name__)


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
                ["val logloss", self.val_logloss], ["val AUC", self.val_auc],
                ["bytes sent / step / rank", int(self.comm_bytes_per_step)],
                *([["cache hit rate", self.cache["cache_hit_rate"]]] if self.cache else []),
                *([["resumed after step", self.resumed_at]] if self.resumed_at else [])]
        return self.format_summary(f"DLRM, {self.steps} steps", rows, steps=self.steps - self.resumed_at)


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


# ------------------------------------------------------------------------------------------------ loop
def _cache_record(model) -> dict:
    """Hit rate and bytes of the tables' caches so far (nothing without a cache)."""
    stats = getattr(model.embeddings, "cache_stats", None)
    if stats is None:
        return {}
    s = stats()
    if not s.lookups:
        return {}
    return {"cache_hit_rate": s.hit_rate, "cache_bytes_to_device": s.bytes_to_device,
            "cache_bytes_to_host": s.bytes_to_host}


def _state(net, layout: ParallelLayout) -> dict:
    """The single-device model's weights (on the CPU); empty when sharded (``DistributedDLRM.to_dlrm`` gathers
    them, a collective that materialises every table on every rank)."""
    if layout.distributed:
        return {}
    return cpu_state(net.state_dict())


def _build_model(config: DLRMTrainConfig, data: _Data, layout: ParallelLayout):
    """The single-device model (one process, no plan), or this rank's shards built in place (no whole tables).

    Tables go into row stores (the optimizer fused, hot rows optionally cached) for ``--optimizer adagrad`` /
    ``rowwise_adagrad``, ``--cache-ratio``, or a plan that caches a table; otherwise they are parameters that
    the torch optimizer steps. Sharded, data-parallel replicas go into stores too (never parameters), so that
    every table gets the same optimizer.
    """
    model_config = DLRMConfig(table_sizes=data.table_sizes, num_dense=data.num_dense,
                              embedding_dim=config.embedding_dim, bottom_mlp=config.bottom_mlp,
                              top_mlp=config.top_mlp, seed=config.seed)
    plan = None
    if config.plan is not None:
        plan = load_plan(config.plan)
        layout.expect_parts(plan.world_size, f"plan {config.plan}")
    elif layout.world_size > 1:
        plan = table_wise_plan(data.table_sizes, config.embedding_dim, layout.world_size)
    plan_caches = plan is not None and any(tp.cache_rows is not None for tp in plan.tables)
    stores = config.cache_ratio is not None or config.optimizer != "sgd" or plan_caches
    if not stores:
        if plan is None:
            return DLRM(model_config).to(layout.device), None
        sharded = build_sharded_dlrm(model_config, plan, layout.group, dp_grad=config.dp_grad, device=layout.device)
        return sharded.model, sharded
    from haloflow.cache import CacheConfig, make_optimizer

    optimizer = make_optimizer({"name": config.optimizer, "lr": config.lr})
    cache = (CacheConfig(ratio=config.cache_ratio, policy=config.cache_policy)
             if config.cache_ratio is not None else None)
    if plan is None:
        from haloflow.engine.dlrm.store_tables import StoreTables

        tables = StoreTables.build(model_config, optimizer, cache=cache, device=layout.device)
        return DLRM(model_config, embeddings=tables).to(layout.device), None
    from haloflow.engine.dlrm.shard_stores import ShardStores

    sharded = build_sharded_dlrm(model_config, plan, layout.group, dp_grad=config.dp_grad, device=layout.device,
                                 stores=ShardStores(optimizer=optimizer, cache=cache, device=layout.device))
    return sharded.model, sharded


def _local(batch: ClickBatch, layout: ParallelLayout) -> tuple[ClickBatch, list[int]]:
    """This rank's slice of the global batch, on its device (through pinned memory on CUDA)."""
    sizes = split_sizes(batch.batch_size, layout.world_size)
    mine = batch.split_batch(sizes)[layout.rank]
    dev = layout.device
    if dev.type != "cpu":
        mine = ClickBatch(to_device(mine.dense, dev), JaggedBatch(to_device(mine.sparse.lengths, dev),
                                                                  to_device(mine.sparse.values, dev)),
                          to_device(mine.labels, dev))
    return mine, sizes


def _all_sum(x: torch.Tensor, layout: ParallelLayout) -> torch.Tensor:
    if layout.group is not None:
        dist.all_reduce(x, group=layout.group)  # waits for every rank
    return x


@torch.no_grad()
def _evaluate(net, data: _Data, layout: ParallelLayout, config: DLRMTrainConfig) -> tuple[float, float]:
    scores, labels, count = [], [], 0
    loss_sum = torch.zeros(1, dtype=torch.float64, device=layout.device)
    for i, batch in enumerate(data.batches("val")):
        if config.max_eval_batches is not None and i >= config.max_eval_batches:
            break
        mine, sizes = _local(batch, layout)
        logits = net(mine.dense, mine.sparse, sizes) if layout.distributed else net(mine.dense, mine.sparse)
        loss_sum += dlrm_loss(logits, mine.labels, global_batch_size=1).double()  # the sum over the slice
        count += batch.batch_size
        scores.append(logits)
        labels.append(mine.labels)
    if count == 0:
        return float("nan"), float("nan")
    loss_sum = _all_sum(loss_sum, layout)
    all_scores = all_gather_cat(torch.cat(scores), layout.group).cpu()
    all_labels = all_gather_cat(torch.cat(labels), layout.group).cpu()
    return float(loss_sum) / count, auc_rank_sum(all_scores, all_labels)


def _resume(ckpt, model: DLRM, opt: torch.optim.Optimizer, total: int) -> tuple[int, int, list[float]]:
    """Steps and samples done and the loss history: from the checkpoint ``ckpt`` resumes (MLPs, their optimizer
    state, this rank's table rectangles and RNG restored in place), else nothing done."""

    def restore(loaded) -> tuple[int, int, list[float]]:
        load_dense_state(model, opt, loaded.state["dense"], loaded.path)
        load_tables(model.embeddings, loaded)
        torch.set_rng_state(loaded.state["rng"])
        return loaded.step, int(loaded.state["samples"]), [float(x) for x in loaded.state["losses"]]

    return ckpt.resume(total, "step", "--max-steps", restore) or (0, 0, [])


def train_dlrm(config: DLRMTrainConfig, *, on_record: Callable[[dict], None] | None = None) -> DLRMTrainResult:
    """Train and evaluate; every rank returns the same ``DLRMTrainResult``.

    Under torchrun every rank joins the group and holds its shards of the plan; alone, it trains the
    single-device model. ``on_record`` is called on rank 0 with every JSON record as it is made.
    """
    with Runtime.start(config.runtime) as rt:
        return _train(config, rt, on_record)


def _train(config: DLRMTrainConfig, rt: Runtime, on_record) -> DLRMTrainResult:
    lay = rt.layout
    data = _Data(config)
    model, dist_model = _build_model(config, data, lay)
    net = dist_model if dist_model is not None else model
    fused = getattr(model.embeddings, "step", None)  # row stores update their own rows
    dense_opt = torch.optim.Adagrad if config.optimizer != "sgd" else torch.optim.SGD
    opt = dense_opt([p for p in net.parameters() if p.requires_grad], lr=config.lr)
    stats = dist_model.stats if dist_model is not None else None

    def emit(record: dict) -> None:
        rt.metrics.write(record)
        if lay.is_main and on_record is not None:
            on_record(rt.metrics.records[-1])

    per_epoch = data.num_batches("train")
    total = per_epoch * config.epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    ckpt = rt.checkpointer("dlrm", {"table_sizes": list(data.table_sizes), "num_dense": data.num_dense,
                                    "train_batches": per_epoch, "batch_size": config.batch_size,
                                    "embedding_dim": config.embedding_dim, "bottom_mlp": list(config.bottom_mlp),
                                    "top_mlp": list(config.top_mlp), "seed": config.seed,
                                    "optimizer": config.optimizer})
    steps, samples, losses = _resume(ckpt, model, opt, total)
    start, comm = steps, 0
    rt.started()
    reporter = rt.reporter(total=total, unit="step", desc=f"train dlrm (K={lay.world_size})", done=start)
    devices = {"model": {p.device.type for p in net.parameters()}, "batches": set()}
    t0 = time.perf_counter()
    try:
        while steps < total:
            for batch in data.batches("train", skip=steps % per_epoch):
                if steps >= total:
                    break
                ckpt.maybe_fail(steps + 1)
                mine, sizes = _local(batch, lay)
                devices["batches"] |= {t.device.type for t in (mine.dense, mine.sparse.values, mine.labels)}
                opt.zero_grad(set_to_none=True)
                if stats is not None:
                    stats.reset()
                    logits = dist_model(mine.dense, mine.sparse, sizes)
                else:
                    logits = model(mine.dense, mine.sparse)
                loss = dlrm_loss(logits, mine.labels, global_batch_size=batch.batch_size)
                loss.backward()
                if dist_model is not None:
                    dist_model.finish_grad_sync()
                    comm += stats.total()
                if fused is not None:
                    fused()
                opt.step()
                step_loss = float(_all_sum(loss.detach().clone(), lay))  # the global mean (a sync, for the log)
                losses.append(step_loss)
                steps += 1
                samples += batch.batch_size
                if steps % config.log_every == 0 or steps == total:
                    window = losses[-config.log_every:]
                    emit({"kind": "train", "step": steps, "loss": sum(window) / len(window),
                          "samples_per_s": (steps - start) * batch.batch_size / (time.perf_counter() - t0),
                          **_cache_record(model)})
                reporter.update({"loss": step_loss})
                if ckpt.due(steps, total):
                    ckpt.save(steps, {"dense": dense_state(model, opt), "losses": losses, "samples": samples,
                                      "rng": torch.get_rng_state()}, table_pieces(model.embeddings, lay.rank))
    finally:
        reporter.close()
    train_s = time.perf_counter() - t0
    val_logloss, val_auc = _evaluate(net, data, lay, config)
    result = DLRMTrainResult(layout=lay, startup_s=rt.startup_s, train_s=train_s, threads=rt.threads,
                             state_dict=_state(net, lay), records=rt.metrics.records, steps=steps, samples=samples,
                             losses=losses, val_logloss=val_logloss, val_auc=val_auc,
                             comm_bytes_per_step=comm / max(steps - start, 1), devices=devices,
                             cache=_cache_record(model), resumed_at=start)
    emit({"kind": "eval", "step": steps, "val_logloss": val_logloss, "val_auc": val_auc,
          "samples_per_s": result.samples_per_s, "world_size": lay.world_size, "threads_per_rank": rt.threads,
          "startup_s": rt.startup_s, "comm_bytes_per_step": result.comm_bytes_per_step})
    return result
