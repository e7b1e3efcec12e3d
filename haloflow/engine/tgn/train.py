"""TGN training on an event stream, one process or K ranks with node memory owned by partition.

Every rank reads the same stream and walks the same global batches (B events, chronological). One step, rank r::

    mine    = events of the batch in r's contiguous slice (split_sizes(B, K))
    fetch   rows of the query nodes (src, dst, negative) from their owners      -> handle   (all-to-all)
    sample  the k newest neighbours strictly before each event time            (numba, while the rows travel)
    wait    the query rows; fetch (and wait for) the rows of neighbour-only nodes
    forward memory update (GRU on stored messages), attention, decoder; loss = BCE sum / B (global)
    backward, gradients reduced (reduce-scatter + all-gather, fixed order), Adam step
    apply   the batch's messages go to the owners; each applies all of them at once (newest event wins)

With the same global batch order, K ranks train the same model as one process (float rounding aside): negatives
and dropout are keyed by event id, the loss by the global batch size, and the state update does not depend on
which rank sent a row. ``schedule="wait_first"`` waits for the rows before sampling: the control that
``haloflow bench tgn`` times against the overlapped step.

Evaluation follows TGN's protocol: the memory keeps following the stream through validation and test (no
gradients), AP and AUC with one fixed negative per event, MRR against ``mrr_negatives`` fixed negatives; the
inductive scores are those of events with a node held out of training.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from haloflow.data.jagged import split_sizes
from haloflow.data.temporal import TemporalEvents, chronological_split, inductive_nodes
from haloflow.data.temporal_sampler import NegativeSampler, TemporalCSR
from haloflow.engine.checkpoint import Piece, cpu_state
from haloflow.engine.comm import CommStats, all_gather_cat, all_gather_rows
from haloflow.engine.grad_sync import BucketedGradSync
from haloflow.engine.runtime import Runtime, TrainResult, synchronize
from haloflow.engine.tgn.config import TGNTrainConfig
from haloflow.engine.tgn.memory import NodeOwners, ShardedMemory
from haloflow.models.temporal_metrics import average_precision, mean_reciprocal_rank, roc_auc
from haloflow.models.tgn import TGN, make_tgn_batch, tgn_batch_loss, tgn_messages
from haloflow.models.tgn_memory import MemoryRows

__all__ = ["TGNTrainConfig", "TGNTrainResult", "train_tgn", "TGNRun", "read_events"]

log = logging.getLogger(__name__)

@dataclass(eq=False)
class TGNTrainResult(TrainResult):
    """Losses per epoch, events per second, and the test metrics (identical on every rank)."""

    epoch_losses: list[float] = field(default_factory=list)
    batch_losses: list[float] = field(default_factory=list)
    events_per_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # val_ap, test_ap, test_auc, test_mrr, inductive_*
    fetch_bytes_per_batch: float = 0.0  # this rank's average
    memory: ShardedMemory | None = None  # this rank's share; ``memory.gather_all()`` (a collective) gives the whole
    resumed_at: int = 0  # batches done by the checkpoint this run resumed from

    def summary(self) -> str:
        rows = [["epochs", len(self.epoch_losses)], ["train loss (last epoch)", self.epoch_losses[-1]],
                ["train events / s", self.events_per_s], *[[k, v] for k, v in self.metrics.items()]]
        return self.format_summary(f"TGN, {len(self.epoch_losses)} epochs", rows, epochs=len(self.epoch_losses))


def read_events(path: str | Path) -> TemporalEvents:
    """A JODIE CSV (by its ``.csv`` name) or a SNAP temporal edge list (anything else)."""
    from haloflow.data.temporal import read_jodie_csv, read_snap_temporal

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"event stream {p} does not exist")
    return read_jodie_csv(p) if p.suffix.lower() == ".csv" else read_snap_temporal(p)


class TGNRun:
    """The pieces of one run on one rank: the stream, splits, samplers, model, memory and the step."""

    def __init__(self, config: TGNTrainConfig, rt: Runtime, events: TemporalEvents | None = None):
        lay = rt.layout
        self.config, self.rt = config, rt
        self.events = events if events is not None else read_events(config.events)
        ev = self.events
        self.split = chronological_split(ev)
        self.inductive = inductive_nodes(ev, self.split, config.inductive_fraction, seed=config.seed)
        self.train_ids = self.inductive.train_ids
        self.train_csr = TemporalCSR.from_events(ev, keep=self.inductive.train_mask)  # held-out nodes unseen
        self.full_csr = TemporalCSR.from_events(ev)
        self.train_neg = NegativeSampler.from_destinations(ev, self.train_ids, seed=config.seed)
        self.eval_neg = NegativeSampler.from_destinations(ev, seed=config.seed + 1)
        owners = (NodeOwners.from_partition(config.partitions, ev.num_nodes) if config.partitions is not None
                  else NodeOwners.blocks(ev.num_nodes, lay.world_size))
        lay.expect_parts(owners.num_parts, str(config.partitions or "the node blocks"))
        self.stats = CommStats()
        self.model = TGN(config.model_config(ev.edge_dim)).to(lay.device)
        self.memory = ShardedMemory(owners, memory_dim=config.memory_dim, edge_dim=ev.edge_dim, group=lay.group,
                                    device=lay.device, stats=self.stats)
        self.sync = BucketedGradSync(self.model.parameters(), lay.group, stats=self.stats)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=config.lr)

    def mine(self, batch_ids: np.ndarray) -> np.ndarray:
        """This rank's contiguous slice of a global batch."""
        lay = self.rt.layout
        sizes = split_sizes(batch_ids.shape[0], lay.world_size)
        lo = sum(sizes[: lay.rank])
        return batch_ids[lo:lo + sizes[lay.rank]]

    def step(self, batch_ids: np.ndarray, neg_all: np.ndarray, csr: TemporalCSR, *, epoch: int, train: bool,
             store: bool = True):
        """One global batch (every rank calls it with the same ids); returns (global loss, pos, neg logits mine).

        ``store=False`` scores without storing the batch's messages (the memory does not move)."""
        ev, dev = self.events, self.rt.layout.device
        ids = self.mine(batch_ids)
        neg = self.mine(neg_all)
        query = torch.from_numpy(np.unique(np.concatenate([ev.src[ids], ev.dst[ids], neg])))  # (q,)
        handle = self.memory.fetch(query)  # the rows travel while we sample
        if self.config.schedule == "wait_first":
            rows_q = handle.wait()
        batch = make_tgn_batch(ev, ids, neg, csr, num_neighbors=self.config.num_neighbors, epoch=epoch).to(dev)
        if self.config.schedule == "overlap":
            rows_q = handle.wait()
        extra = batch.node_ids.cpu()[~torch.isin(batch.node_ids.cpu(), query)]  # neighbour-only nodes
        rows_x = self.memory.fetch(extra).wait()
        rows = _in_order(batch.node_ids, torch.cat([query, extra]).to(dev), rows_q, rows_x)
        with torch.set_grad_enabled(train):
            out = self.model(rows, batch)
            loss = tgn_batch_loss(out.pos_logit, out.neg_logit, num_events=batch_ids.shape[0])
        if train:
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.sync.wait()
            self.opt.step()
        if store:
            self.memory.apply(tgn_messages(batch, out))
        return loss.detach(), out.pos_logit.detach(), out.neg_logit.detach()


def _in_order(node_ids: torch.Tensor, ids: torch.Tensor, a: MemoryRows, b: MemoryRows) -> MemoryRows:
    """Rows of ``a`` then ``b`` (for ``ids``) rearranged into the order of ``node_ids`` (the same set, sorted)."""
    both = MemoryRows.cat([a, b])
    order = torch.argsort(ids)  # node_ids is ascending and distinct: sorting the ids gives its order
    if not torch.equal(ids[order], node_ids):
        raise RuntimeError("fetched rows do not cover the batch's nodes")  # a bug, not a user's mistake
    return MemoryRows(*(getattr(both, name)[order] for name in
                        ("memory", "last_update", "mail_other", "mail_feat", "mail_t", "mail_eid")))


def _batches(ids: np.ndarray, size: int) -> list[np.ndarray]:
    return [ids[i:i + size] for i in range(0, ids.shape[0], size)]


def train_tgn(config: TGNTrainConfig, *, events: TemporalEvents | None = None) -> TGNTrainResult:
    """Train (and evaluate) TGN as ``config`` says; under torchrun each rank owns a share of the node memory."""
    with Runtime.start(config.runtime) as rt:
        return _train(config, rt, events)


def _train(config: TGNTrainConfig, rt: Runtime, events: TemporalEvents | None) -> TGNTrainResult:
    lay = rt.layout
    run = TGNRun(config, rt, events)
    batches = _batches(run.train_ids, config.batch_size)[: config.max_train_batches]
    nb, steps = len(batches), config.epochs * len(batches)
    ckpt = rt.checkpointer("tgn", {"model": asdict(run.model.config), "nodes": run.events.num_nodes,
                                   "events": run.events.num_events, "batch_size": config.batch_size,
                                   "train_batches": nb, "inductive_fraction": config.inductive_fraction})
    done, epoch_losses, batch_losses, epoch_sum = _resume(ckpt, run, steps)
    start = done
    rt.started()
    fetch_bytes, train_events = [], 0
    reporter = rt.reporter(total=steps, unit="batch", desc=f"train tgn (K={lay.world_size})", done=done)
    t0 = time.perf_counter()
    try:
        for epoch in range(done // nb, config.epochs):
            if done % nb == 0:
                run.memory.reset()  # TGN starts every epoch from an empty memory
                epoch_sum = 0.0
            run.model.train()
            for ids in batches[done % nb:]:
                ckpt.maybe_fail(done + 1)
                run.stats.reset()
                loss, _, _ = run.step(ids, run.train_neg.sample(ids, stream=epoch), run.train_csr, epoch=epoch,
                                      train=True)
                value = float(all_gather_rows([float(loss)], lay.group, "batch loss").sum())  # the global loss
                batch_losses.append(value)
                fetch_bytes.append(run.stats.bytes["tgn_fetch"])
                epoch_sum += value * ids.shape[0]
                train_events += ids.shape[0]
                done += 1
                reporter.update({"loss": value})
                if done % nb == 0:
                    epoch_losses.append(epoch_sum / max(sum(b.shape[0] for b in batches), 1))
                    rt.metrics.write({"kind": "epoch", "epoch": epoch, "loss": epoch_losses[-1]})
                if ckpt.due(done, steps):
                    ckpt.save(done, {"model": cpu_state(run.model.state_dict()), "optimizer": run.opt.state_dict(),
                                     "epoch_losses": epoch_losses, "batch_losses": batch_losses,
                                     "epoch_sum": epoch_sum, "rng": torch.get_rng_state()}, [_memory_piece(run)])
    finally:
        reporter.close()
    synchronize(lay.device)
    train_s = time.perf_counter() - t0
    metrics = _evaluate(run) if config.eval else {}
    rt.metrics.write({"kind": "summary", "world_size": lay.world_size, "threads_per_rank": rt.threads,
                      "startup_s": rt.startup_s, "train_s": train_s, "events_per_s": train_events / train_s,
                      **metrics})
    return TGNTrainResult(
        layout=lay, startup_s=rt.startup_s, train_s=train_s, threads=rt.threads,
        state_dict=cpu_state(run.model.state_dict()),
        records=rt.metrics.records, epoch_losses=epoch_losses, batch_losses=batch_losses,
        events_per_s=train_events / train_s if train_s > 0 else 0.0, metrics=metrics,
        fetch_bytes_per_batch=float(np.mean(fetch_bytes)) if fetch_bytes else 0.0, memory=run.memory,
        resumed_at=start,
        devices={"model": {p.device.type for p in run.model.parameters()},
                 "memory": {run.memory.local.memory.device.type}},
    )


_MEMORY_FIELDS = ("memory", "last_update", "mail_other", "mail_feat", "mail_t", "mail_eid")


def _owned(run: TGNRun) -> torch.Tensor:
    """Global ids of this rank's nodes, in the order of its memory rows."""
    owners, rank = run.memory.owners, run.rt.layout.rank
    gids = np.nonzero(owners.owner == rank)[0]
    return torch.from_numpy(gids[np.argsort(owners.row[gids], kind="stable")]).long()


def _memory_piece(run: TGNRun) -> Piece:
    """This rank's memory and mailbox rows, saved by global node id (any partition re-reads them)."""
    local = run.memory.local
    return Piece(0, (0, run.events.num_nodes), (0, local.memory_dim),
                 {name: getattr(local, name) for name in _MEMORY_FIELDS}, ids=_owned(run))


def _resume(ckpt, run: TGNRun, steps: int) -> tuple[int, list[float], list[float], float]:
    """Batches done, epoch and batch losses, and the running sum of the epoch in progress: from the checkpoint
    ``ckpt`` resumes (model, Adam, RNG and this rank's memory and mailbox rows restored), else nothing done."""

    def restore(loaded) -> tuple[int, list[float], list[float], float]:
        run.model.load_state_dict(loaded.state["model"])
        run.opt.load_state_dict(loaded.state["optimizer"])
        gids, local = _owned(run), run.memory.local
        with torch.no_grad():
            for name in _MEMORY_FIELDS:
                getattr(local, name).copy_(loaded.rows_at(0, gids, name).to(local.memory.device))
        torch.set_rng_state(loaded.state["rng"])
        return (loaded.step, [float(x) for x in loaded.state["epoch_losses"]],
                [float(x) for x in loaded.state["batch_losses"]], float(loaded.state["epoch_sum"]))

    return ckpt.resume(steps, "batch", "--epochs", restore) or (0, [], [], 0.0)


@torch.no_grad()
def _evaluate(run: TGNRun) -> dict[str, float]:
    """Validation then test, the memory following the stream from where training left it (TGN's protocol).

    MRR (TGB's protocol): each of the first ``mrr_events`` test events is scored against ``mrr_negatives`` fixed
    negatives, with the memory as it stands before the event's batch (one extra pass per negative column that
    does not store messages), then the batch is stepped once more to move the memory on.
    """
    cfg, lay, ev = run.config, run.rt.layout, run.events
    run.model.eval()
    out: dict[str, float] = {}
    for part in ("val", "test"):
        ids_all = run.split.ids(part)
        pos, neg, mine, mrr_pos, mrr_neg = [], [], [], [], []
        whole = -(-cfg.mrr_events // cfg.batch_size) * cfg.batch_size  # whole batches
        ranked = ids_all[:whole] if part == "test" and cfg.mrr_negatives else ids_all[:0]
        fixed = run.eval_neg.sample_fixed(ranked, ev.dst[ranked], cfg.mrr_negatives, stream=1) if ranked.size else None
        for start in range(0, ids_all.shape[0], cfg.batch_size):
            ids = ids_all[start:start + cfg.batch_size]
            if start < ranked.size:  # score the fixed negatives first: the memory must not yet have seen the batch
                cols = [run.step(ids, fixed[start:start + ids.size, j], run.full_csr, epoch=0, train=False,
                                 store=False)[2] for j in range(cfg.mrr_negatives)]
                mrr_neg.append(torch.stack(cols, dim=1))  # (B_mine, Q)
            _, p, n = run.step(ids, run.eval_neg.sample(ids), run.full_csr, epoch=0, train=False)
            if start < ranked.size:
                mrr_pos.append(p)
            pos.append(p)
            neg.append(n)
            mine.append(torch.from_numpy(run.mine(ids)))
        gather = (lambda parts: all_gather_cat(torch.cat(parts).float().cpu(), lay.group).numpy())
        eids = all_gather_cat(torch.cat(mine), lay.group).numpy()
        order = np.argsort(eids, kind="stable")  # back to stream order
        pos_all, neg_all, eids = gather(pos)[order], gather(neg)[order], eids[order]
        new = (run.inductive.new_node_val_mask if part == "val" else run.inductive.new_node_test_mask)[eids]
        out[f"{part}_ap"] = average_precision(pos_all, neg_all)
        out[f"{part}_auc"] = roc_auc(pos_all, neg_all)
        out[f"{part}_inductive_ap"] = average_precision(pos_all[new], neg_all[new]) if new.any() else float("nan")
        out[f"{part}_inductive_auc"] = roc_auc(pos_all[new], neg_all[new]) if new.any() else float("nan")
        if mrr_pos:
            q = cfg.mrr_negatives
            negs = all_gather_cat(torch.cat(mrr_neg).float().cpu().reshape(-1), lay.group).numpy().reshape(-1, q)
            out["test_mrr"] = mean_reciprocal_rank(gather(mrr_pos), negs)  # the same rank-major order on both
    return out
