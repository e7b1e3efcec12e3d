"""TGN on an event stream as a family of the one training loop: `TGNFamily`, `train_tgn`, `TGNTrainResult`.

One process or K ranks with node memory owned by partition (one process is the same path on a group of one).

A run is defined by V logical workers (``--logical-workers``, default 4; ``engine/tgn/workers.py``): every global
batch is cut into V fixed slices, and rank r of K computes the V / K slices of its contiguous block of workers.
Every rank reads the same stream and walks the same global batches (B events, chronological). One step, rank r::

    mine    = its workers' slices of the batch (LogicalWorkers.cut(B): sizes that depend on V only)
    fetch   rows of all its workers' query nodes (src, dst, negative) from their owners    -> handle (all-to-all)
    sample  each worker's k newest neighbours strictly before each event time  (numba, while the rows travel)
    wait    the query rows; fetch (and wait for) the rows of neighbour-only nodes
    forward per worker: memory update (GRU on stored messages), attention, decoder, through the worker's own
            aliases of the weights; loss_w = BCE sum of its events / B (global)
    backward a weight's gradient = the tree sum of this rank's workers' (logical.fanout); grad_sync sums the
            ranks' by the same pairwise tree (reduce-scatter + all-gather): the V-tree, at any K; Adam step
    apply   all its workers' messages go to the owners; each applies all of them at once (newest event wins)
    loss    the V workers' losses by the V-tree (logical.rank_tree_sum)

So K ranks train the same bits as one process for every K that divides V (V / K a power of two): each worker
computes in shapes that depend on V only (a GEMM rounds a row by the rows beside it), every sum over workers has
one order, negatives and dropout are keyed by event id, and the state update takes the newest event's row, which
the worker holding that event computed, at any K. Node memory is owned by V logical parts (a partition folder's
parts, or V blocks of ids), hosted by the workers' ranks; where a row lives changes no bit. ``--no-k-invariance``
runs V = K: the path before logical workers, whose floats change with K. ``schedule="wait_first"`` waits for the
rows before sampling: the control that ``haloflow bench tgn`` times against the overlapped step.

Evaluation follows TGN's protocol: the memory keeps following the stream through validation and test (no
gradients), AP and AUC with one fixed negative per event, MRR against ``mrr_negatives`` fixed negatives; the
inductive scores are those of events with a node held out of training.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from haloflow.data.temporal import TemporalEvents, chronological_split, inductive_nodes
from haloflow.data.temporal_sampler import NegativeSampler, TemporalCSR
from haloflow.engine.checkpoint import cpu_state
from haloflow.engine.comm import CommStats, all_gather_cat
from haloflow.engine.logical import rank_tree_sum, tree_sum
from haloflow.engine.optimizers import Adam
from haloflow.engine.runtime import Runtime, TrainResult
from haloflow.engine.tgn.checkpoint import load_memory, memory_piece
from haloflow.engine.tgn.config import TGNTrainConfig
from haloflow.engine.tgn.memory import NodeOwners, ShardedMemory
from haloflow.engine.tgn.parallelize import parallelize_tgn
from haloflow.engine.tgn.workers import forward_workers, worker_slices
from haloflow.engine.trainer import Exported, RunInfo, run
from haloflow.models.temporal_metrics import average_precision, mean_reciprocal_rank, roc_auc
from haloflow.models.tgn import TGN, TGNBatch, make_tgn_batch, tgn_batch_loss, tgn_messages
from haloflow.models.tgn_memory import MemoryRows, MemoryUpdate

__all__ = ["TGNTrainConfig", "TGNTrainResult", "TGNFamily", "BatchLog", "train_tgn", "read_events", "evaluate_stream"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchLog:
    """One training batch, global over ranks; ``epoch_loss`` is set on the batch that ends an epoch."""

    batch: int  # counted from 0 over the whole run
    epoch: int
    loss: float  # the global batch loss
    fetch_bytes: int  # this rank's memory-fetch bytes in the batch
    epoch_loss: float | None = None

    def progress(self) -> dict[str, float]:
        return {"loss": self.loss}

    def record(self) -> dict | None:
        return None if self.epoch_loss is None else {"kind": "epoch", "epoch": self.epoch, "loss": self.epoch_loss}


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
                ["train events / s", self.events_per_s], *[[k, v] for k, v in self.metrics.items()],
                *([["resumed after batch", self.resumed_at]] if self.resumed_at else [])]
        return self.format_summary(f"TGN, {len(self.epoch_losses)} epochs", rows, epochs=len(self.epoch_losses))


def read_events(path: str | Path) -> TemporalEvents:
    """A JODIE CSV (by its ``.csv`` name) or a SNAP temporal edge list (anything else)."""
    from haloflow.data.temporal import read_jodie_csv, read_snap_temporal

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"event stream {p} does not exist")
    return read_jodie_csv(p) if p.suffix.lower() == ".csv" else read_snap_temporal(p)


class TGNFamily:
    """TGN for ``engine/trainer.run``: one unit is one global batch of training events; an epoch starts from an
    empty memory. Every rank walks the same global batches and trains its logical workers' slices of each."""

    kind, unit, more_flag, join = "tgn", "batch", "--epochs", True
    adapts_threads = True  # its K-rank results hold at any thread count (tests/engine/test_thread_count_exact.py)

    def __init__(self, config: TGNTrainConfig, *, events: TemporalEvents | None = None):
        self.config, self._events = config, events
        self.epoch_losses: list[float] = []
        self.batch_losses: list[float] = []
        self.epoch_sum = 0.0  # the epoch in progress: sum of batch loss x events
        self.fetch_bytes: list[int] = []
        self.comm_bytes = 0  # this rank's bytes sent in the batches this run trained, every collective of a step
        self.train_events = 0

    def setup(self, rt: Runtime) -> None:
        """The stream, splits, samplers, model, sharded memory and optimizer on this rank."""
        cfg, lay = self.config, rt.layout
        self.rt = rt
        self.events = ev = self._events if self._events is not None else read_events(cfg.events)
        self.split = chronological_split(ev)
        self.inductive = inductive_nodes(ev, self.split, cfg.inductive_fraction, seed=cfg.seed)
        self.train_ids = self.inductive.train_ids
        self.train_csr = TemporalCSR.from_events(ev, keep=self.inductive.train_mask)  # held-out nodes unseen
        self.full_csr = TemporalCSR.from_events(ev)
        self.train_neg = NegativeSampler.from_destinations(ev, self.train_ids, seed=cfg.seed)
        self.eval_neg = NegativeSampler.from_destinations(ev, seed=cfg.seed + 1)
        parts = NodeOwners.from_partition(cfg.partitions, ev.num_nodes) if cfg.partitions is not None else None
        self.workers = lw = cfg.workers(lay.world_size, lay.rank, parts.num_parts if parts is not None else None)
        self.logical_workers = lw.v  # the summary record's V
        # node memory owned by the V logical parts (a folder's parts, or V blocks of ids), each on its worker's rank
        owners = (parts if parts is not None else NodeOwners.blocks(ev.num_nodes, lw.v)).hosted(lw.per_rank)
        self.stats = CommStats()
        self.model, self.memory, self.sync = parallelize_tgn(TGN(cfg.model_config(ev.edge_dim)).to(lay.device),
                                                             owners, lay.group, edge_dim=ev.edge_dim,
                                                             device=lay.device, stats=self.stats)
        # fused: one kernel over all parameters; the per-tensor CPU default spent ~1.5 ms of a ~20 ms batch
        self.opt = Adam(self.model.parameters(), lr=cfg.lr, fused=True)  # torch.optim's, unguarded
        self.batches = _batches(self.train_ids, cfg.batch_size)[: cfg.max_train_batches]

    # ------------------------------------------------------------------------------------------ checkpoints
    def total_units(self) -> int:
        return self.config.epochs * len(self.batches)

    def identity(self) -> dict:
        cfg, ev = self.config, self.events
        return {"model": asdict(self.model.config), "nodes": ev.num_nodes, "events": ev.num_events,
                "batch_size": cfg.batch_size, "train_batches": len(self.batches),
                "inductive_fraction": cfg.inductive_fraction,
                # the floats depend on V (never on K): a resume at another K of the same V continues bitwise
                "logical_workers": self.workers.v if cfg.k_invariant else "K (--no-k-invariance)"}

    def export(self) -> Exported:
        return Exported({"model": cpu_state(self.model.state_dict()), "optimizer": self.opt.state_dict(),
                         "epoch_losses": self.epoch_losses, "batch_losses": self.batch_losses,
                         "epoch_sum": self.epoch_sum},
                        (memory_piece(self.memory, self.rt.layout.rank, self.events.num_nodes),))

    def restore(self, loaded) -> None:
        """Model, Adam, losses, the running sum of the epoch in progress and this rank's memory rows."""
        self.model.load_state_dict(loaded.state["model"])
        self.opt.load_state_dict(loaded.state["optimizer"])
        load_memory(self.memory, loaded, self.rt.layout.rank)
        self.epoch_losses = [float(x) for x in loaded.state["epoch_losses"]]
        self.batch_losses = [float(x) for x in loaded.state["batch_losses"]]
        self.epoch_sum = float(loaded.state["epoch_sum"])

    # ------------------------------------------------------------------------------------------ training
    def begin(self, done: int) -> None:
        self.model.train()

    def train_unit(self, index: int) -> BatchLog:
        nb = len(self.batches)
        epoch, position = divmod(index, nb)
        if position == 0:
            self.memory.reset()  # TGN starts every epoch from an empty memory
            self.epoch_sum = 0.0
        ids = self.batches[position]
        self.stats.reset()
        loss, _, _ = self.step(ids, self.train_neg.sample(ids, stream=epoch), self.train_csr, epoch=epoch,
                               train=True)
        # the global loss: the V workers' losses by the V-tree (this rank's subtree, then the ranks'); waits
        value = float(rank_tree_sum(loss.reshape(1), self.rt.layout.group))
        self.batch_losses.append(value)
        self.fetch_bytes.append(self.stats.bytes["tgn_fetch"])
        self.comm_bytes += self.stats.total()  # fetches, write-backs, counts and the gradient sync
        self.epoch_sum += value * ids.shape[0]
        self.train_events += ids.shape[0]
        ended = None
        if position == nb - 1:
            ended = self.epoch_sum / max(sum(b.shape[0] for b in self.batches), 1)
            self.epoch_losses.append(ended)
        return BatchLog(batch=index, epoch=epoch, loss=value, fetch_bytes=int(self.fetch_bytes[-1]), epoch_loss=ended)

    def mine(self, batch_ids: np.ndarray) -> np.ndarray:
        """This rank's contiguous slice of a global batch: its logical workers' slices, one after another."""
        sizes = self.workers.rank_sizes(batch_ids.shape[0])
        lo = sum(sizes[: self.rt.layout.rank])
        return batch_ids[lo:lo + sizes[self.rt.layout.rank]]

    def step(self, batch_ids: np.ndarray, neg_all: np.ndarray, csr: TemporalCSR, *, epoch: int, train: bool,
             store: bool = True):
        """One global batch (every rank calls it with the same ids); returns (this rank's loss: the tree sum of its
        workers' losses, pos and neg logits of its events, in ``mine`` order).

        Each of this rank's logical workers computes its slice of the batch on its own (``worker_slices``), in
        shapes that depend on V only; a weight's gradient is the tree sum of the workers' (``forward_workers``),
        then the ranks' (``grad_sync``). ``store=False`` scores without storing the batch's messages."""
        b = batch_ids.shape[0]
        parts = worker_slices(self.workers, batch_ids, neg_all)
        batches, rows = self._rows(parts, csr, epoch)
        with torch.set_grad_enabled(train):
            outs = forward_workers(self.model, [None if x is None else (r, x) for r, x in zip(rows, batches)])
            zero = torch.zeros((), device=self.rt.layout.device)  # an empty slice's loss
            loss = tree_sum([zero if o is None else tgn_batch_loss(o.pos_logit, o.neg_logit, num_events=b)
                             for o in outs])
        if train:
            self.opt.zero_grad(set_to_none=True)
            if loss.requires_grad:  # False only when all of this rank's slices are empty (B < V)
                loss.backward()
            self.sync.wait()
            self.opt.step()
        if store:
            with torch.no_grad():  # one apply for all of this rank's workers (a collective); newest event wins
                self.memory.apply(MemoryUpdate.cat([self.memory.nothing()] + [
                    tgn_messages(x, o) for x, o in zip(batches, outs) if o is not None]))
        done = [o for o in outs if o is not None]
        pos = torch.cat([zero.new_zeros(0), *(o.pos_logit.detach() for o in done)])
        neg = torch.cat([zero.new_zeros(0), *(o.neg_logit.detach() for o in done)])
        return loss.detach(), pos, neg

    def _rows(self, parts: list[tuple[np.ndarray, np.ndarray]], csr: TemporalCSR, epoch: int
              ) -> tuple[list[TGNBatch | None], list[MemoryRows | None]]:
        """Each worker's batch (None: an empty slice) and the state rows of its nodes. K > 1: the rows of all of
        this rank's query nodes fetched while sampling, then those of the neighbour-only nodes; one process
        gathers each worker's rows from its own memory."""
        ev, dev = self.events, self.rt.layout.device
        k = self.config.num_neighbors

        def batch_of(ids: np.ndarray, neg: np.ndarray) -> TGNBatch | None:
            return make_tgn_batch(ev, ids, neg, csr, num_neighbors=k, epoch=epoch).to(dev) if ids.size else None

        if self.memory.group is None:
            batches = [batch_of(*p) for p in parts]
            return batches, [None if x is None else self.memory.fetch(x.node_ids).wait() for x in batches]
        ids, neg = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
        query = torch.from_numpy(np.unique(np.concatenate([ev.src[ids], ev.dst[ids], neg])))  # (q,)
        handle = self.memory.fetch(query)  # the rows travel while we sample
        if self.config.schedule == "wait_first":
            rows_q = handle.wait()
        batches = [batch_of(*p) for p in parts]
        if self.config.schedule == "overlap":
            rows_q = handle.wait()
        nodes = torch.cat([query, *(x.node_ids.cpu() for x in batches if x is not None)]).unique()  # ascending
        extra = nodes[~torch.isin(nodes, query)]  # neighbour-only nodes
        rows_x = self.memory.fetch(extra).wait()
        return batches, _rows_of(batches, torch.cat([query, extra]).to(dev), MemoryRows.cat([rows_q, rows_x]))

    def finish(self) -> None:
        pass

    def evaluate(self, run: RunInfo) -> dict[str, float]:
        metrics = evaluate_stream(self) if self.config.eval else {}
        return {"events_per_s": self._events_per_s(run), "comm_bytes_per_batch": self.comm_bytes / max(run.trained, 1),
                **metrics}

    def _events_per_s(self, run: RunInfo) -> float:
        return self.train_events / run.train_s if run.train_s > 0 else 0.0

    def result(self, run: RunInfo, metrics: dict[str, float]) -> TGNTrainResult:
        fetch = self.fetch_bytes
        return TGNTrainResult(
            **run.base(), state_dict=cpu_state(self.model.state_dict()), epoch_losses=self.epoch_losses,
            batch_losses=self.batch_losses, events_per_s=self._events_per_s(run),
            metrics={k: v for k, v in metrics.items() if k not in ("events_per_s", "comm_bytes_per_batch")},
            fetch_bytes_per_batch=float(np.mean(fetch)) if fetch else 0.0, memory=self.memory,
            resumed_at=run.resumed_at,
            devices={"model": {p.device.type for p in self.model.parameters()},
                     "memory": {self.memory.local.memory.device.type}})


def train_tgn(config: TGNTrainConfig, *, events: TemporalEvents | None = None) -> TGNTrainResult:
    """Train (and evaluate) TGN as ``config`` says; under torchrun each rank owns a share of the node memory."""
    return run(TGNFamily(config, events=events), config.runtime)


def _rows_of(batches: list[TGNBatch | None], ids: torch.Tensor, rows: MemoryRows) -> list[MemoryRows | None]:
    """The rows of each batch's ``node_ids`` (ascending, distinct), picked from ``rows`` (those of ``ids``)."""
    order = torch.argsort(ids)
    have = ids[order]  # ascending
    out = []
    for x in batches:
        if x is None:
            out.append(None)
            continue
        at = torch.searchsorted(have, x.node_ids).clamp_(max=max(have.numel() - 1, 0))
        if not torch.equal(have[at], x.node_ids):
            raise RuntimeError("fetched rows do not cover the batch's nodes")  # a bug, not a user's mistake
        pick = order[at]
        out.append(MemoryRows(*(getattr(rows, f.name)[pick] for f in fields(MemoryRows))))
    return out


def _batches(ids: np.ndarray, size: int) -> list[np.ndarray]:
    return [ids[i:i + size] for i in range(0, ids.shape[0], size)]


@torch.no_grad()
def evaluate_stream(fam: TGNFamily, scores: dict | None = None) -> dict[str, float]:
    """Validation then test, the memory following the stream from where training left it (TGN's protocol).

    ``scores``: when given, it receives ``part -> (event ids, positive logits, negative logits)`` of every
    event of the part, in stream order (what ``predict_tgn`` writes).

    MRR (TGB's protocol): each of the first ``mrr_events`` test events is scored against ``mrr_negatives`` fixed
    negatives, with the memory as it stands before the event's batch (one extra pass per negative column that
    does not store messages), then the batch is stepped once more to move the memory on.
    """
    cfg, lay, ev = fam.config, fam.rt.layout, fam.events
    fam.model.eval()
    out: dict[str, float] = {}
    for part in ("val", "test"):
        ids_all = fam.split.ids(part)
        pos, neg, mine, mrr_pos, mrr_neg = [], [], [], [], []
        whole = -(-cfg.mrr_events // cfg.batch_size) * cfg.batch_size  # whole batches
        ranked = ids_all[:whole] if part == "test" and cfg.mrr_negatives else ids_all[:0]
        fixed = fam.eval_neg.sample_fixed(ranked, ev.dst[ranked], cfg.mrr_negatives, stream=1) if ranked.size else None
        for start in range(0, ids_all.shape[0], cfg.batch_size):
            ids = ids_all[start:start + cfg.batch_size]
            if start < ranked.size:  # score the fixed negatives first: the memory must not yet have seen the batch
                cols = [fam.step(ids, fixed[start:start + ids.size, j], fam.full_csr, epoch=0, train=False,
                                 store=False)[2] for j in range(cfg.mrr_negatives)]
                mrr_neg.append(torch.stack(cols, dim=1))  # (B_mine, Q)
            _, p, n = fam.step(ids, fam.eval_neg.sample(ids), fam.full_csr, epoch=0, train=False)
            if start < ranked.size:
                mrr_pos.append(p)
            pos.append(p)
            neg.append(n)
            mine.append(torch.from_numpy(fam.mine(ids)))
        gather = (lambda parts: all_gather_cat(torch.cat(parts).float().cpu(), lay.group).numpy())
        eids = all_gather_cat(torch.cat(mine), lay.group).numpy()
        order = np.argsort(eids, kind="stable")  # back to stream order
        pos_all, neg_all, eids = gather(pos)[order], gather(neg)[order], eids[order]
        if scores is not None:
            scores[part] = (eids, pos_all, neg_all)
        new = (fam.inductive.new_node_val_mask if part == "val" else fam.inductive.new_node_test_mask)[eids]
        out[f"{part}_ap"] = average_precision(pos_all, neg_all)
        out[f"{part}_auc"] = roc_auc(pos_all, neg_all)
        out[f"{part}_inductive_ap"] = average_precision(pos_all[new], neg_all[new]) if new.any() else float("nan")
        out[f"{part}_inductive_auc"] = roc_auc(pos_all[new], neg_all[new]) if new.any() else float("nan")
        if mrr_pos:
            q = cfg.mrr_negatives
            negs = all_gather_cat(torch.cat(mrr_neg).float().cpu().reshape(-1), lay.group).numpy().reshape(-1, q)
            out["test_mrr"] = mean_reciprocal_rank(gather(mrr_pos), negs)  # the same rank-major order on both
    return out
