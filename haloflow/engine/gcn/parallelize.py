"""Turn the single-device GCN into the distributed one: `parallelize_gcn` and the `HaloAggregator`.

The model (``haloflow.models.gcn``) has no distributed code; it calls ``agg.aggregate(layer, h)`` on the rows it
owns (``aggregate_blocks`` with a block per part when a rank hosts several parts). Exact halos go through the
`PartsAggregator` (``parts.py``: V parts on any K ranks, each part computing what it computes alone); the
approximations through ``HaloAggregator``, which implements that call on one part of the graph per rank::

    local CSR of part r (rows = inner nodes, columns = [inner | halo], values from GLOBAL degrees)

               inner cols        halo cols
             +-------------+------------------+
    rows     |  A_inner    |     A_halo       |      y = A_inner @ x  +  A_halo @ halo(x)
    (inner)  | (+ self-    | (n_inner, n_halo)|          (n_inner, F)     (n_inner, F)
             |   loops)    |                  |
             +-------------+------------------+

    exact (default):   handle = exchange.start(x); y = A_inner @ x; y += A_halo @ handle.wait()
    schedule="wait_first" (the control of the overlap benchmark, same result): wait for the halo before
                       A_inner @ x, and in backward for the reverse exchange right after it starts
    staleness = 1:     y = A_inner @ x + A_halo @ halo(x of the previous epoch)   (PipeGCN; gradients of the
                       halo also arrive one epoch late, while this epoch's exchange runs in the background)
    halo_keep = p < 1: each training epoch keeps a random fraction p of the halo rows, scaled by 1/p (BNS-GCN)

Approximations apply only to training forwards (``set_epoch(epoch, training=True)`` with grad enabled); the
precomputed layer 0 and evaluation always use exact halos.

`parallelize_gcn` applies the distributed transforms in a fixed order: (1) check that every rank holds the same
weights and a consistent part, (2) build the aggregator over the part, (3) hook the weight-gradient sync.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from haloflow.engine.comm import CommStats, all_gather_rows
from haloflow.engine.gcn.halo import HaloExchange, HaloSelection
from haloflow.engine.gcn.halo_stale import StaleHalo
from haloflow.engine.gcn.config import HaloConfig
from haloflow.engine.grad_sync import BucketedGradSync
from haloflow.engine.gcn.parts import PartsAggregator, split_part_operators
from haloflow.engine.logical import LogicalWorkers
from haloflow.engine.run_config import GradSyncConfig
from haloflow.errors import ConfigError, DistributedError
from haloflow.models.spmm import DEFAULT_KERNEL
from haloflow.partition.types import GraphPart

__all__ = ["HaloConfig", "HaloAggregator", "PartsAggregator", "ParallelGCN", "parallelize_gcn", "split_part_operators"]

log = logging.getLogger(__name__)


class HaloAggregator:
    """The distributed `Aggregator`: rows this rank owns, remote in-neighbours by halo exchange.

    Args:
        part: this rank's `GraphPart`.
        group: the process group (None: single process; the part must then have no halo).
        norm: "gcn" or "mean", as the model's config says.
        config: exact / stale / sampled halos, see `HaloConfig`.
        stats: counters of bytes and blocked time (the trainer resets them each epoch).
        kernel: SpMM kernel of the local operators (see ``haloflow.models.spmm``; CUDA tensors use torch's).

    ``trace``, when set to a list, records the order of the exchange's events and the inner SpMM's
    ("launch:fwd", "inner:fwd", "wait:fwd", ... and the same with ":bwd" in backward).

    Shapes:
        ``aggregate(layer, h)``: (n_inner, F) -> (n_inner, F).
    """

    def __init__(self, part: GraphPart, group=None, *, norm: str = "gcn", config: HaloConfig | None = None,
                 stats: CommStats | None = None, kernel: str = DEFAULT_KERNEL):
        self.part = part
        self.group = group
        self.norm = norm
        self.config = config or HaloConfig()
        self.stats = stats if stats is not None else CommStats()
        if group is None and part.n_halo:
            raise ConfigError(f"part {part.part_id} has {part.n_halo} halo nodes but no process group was given")
        self.a_inner, self.a_halo = split_part_operators(part, norm, kernel)
        self.trace: list[str] | None = None
        self._exact: dict[int, HaloExchange] = {}  # one per layer: buffers sized to that layer's width
        self._stale: dict[int, StaleHalo] = {}
        self._send_gids = part.inner_gids[np.asarray(part.send_ids, dtype=np.int64)]
        self.epoch = 0
        self.training = False
        self.selection: HaloSelection | None = None  # this training epoch's kept halo rows (halo_keep < 1)

    # -------------------------------------------------------------------------------------- epoch state
    def set_epoch(self, epoch: int, training: bool) -> None:
        """Tell the aggregator which epoch (sampling key) and whether this forward trains."""
        self.epoch, self.training = int(epoch), bool(training)
        self.selection = None
        if training and self.config.halo_keep < 1.0:
            p = self.part
            self.selection = HaloSelection.sample(
                rank=p.part_id, send_gids=self._send_gids, send_offsets=np.asarray(p.send_offsets),
                halo_gids=np.asarray(p.halo_gids), halo_offsets=np.asarray(p.halo_offsets),
                keep=self.config.halo_keep, seed=self.config.seed, epoch=epoch,
            )

    def finish(self) -> None:
        """Wait for exchanges still in flight (stale mode launches one per layer for an epoch that never comes)."""
        for stale in self._stale.values():
            stale.finish()

    # -------------------------------------------------------------------------------------- aggregation
    def aggregate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        if h.dim() != 2 or h.shape[0] != self.part.n_inner:
            raise ConfigError(f"aggregate expects h of shape ({self.part.n_inner}, F), got {tuple(h.shape)}")
        approx = self.training and torch.is_grad_enabled()
        if approx and self.config.staleness:
            halo = self._stale_exchange(layer).apply(h)  # (n_halo, F) from the previous epoch
            return self.a_inner @ h + self.a_halo @ halo
        exchange = self._exchange(layer)
        exchange.trace = self.trace
        wait_first = self.config.schedule == "wait_first"
        handle = exchange.start(h, self.selection if approx else None, wait_first=wait_first)  # returns at once
        if wait_first:  # the control: nothing overlaps the exchange
            halo = handle.wait()
            return self._inner(h) + self.a_halo @ halo
        y = self._inner(h)  # (n_inner, F) while the halo is in flight
        return y + self.a_halo @ handle.wait()  # (n_inner, F)

    def _inner(self, h: torch.Tensor) -> torch.Tensor:
        """A_inner @ h, marked in the trace (forward after it ran, backward after its backward ran)."""
        if self.trace is None:
            return self.a_inner @ h
        return _Mark.apply(self.a_inner @ _Mark.apply(h, self.trace, None, "inner:bwd"), self.trace, "inner:fwd",
                           None)

    def _exchange(self, layer: int) -> HaloExchange:
        if layer not in self._exact:
            self._exact[layer] = HaloExchange.from_part(
                self.part, self.group, name=f"halo exchange of layer {layer}", stats=self.stats
            )
        return self._exact[layer]

    def _stale_exchange(self, layer: int) -> StaleHalo:
        if layer not in self._stale:
            ex = HaloExchange.from_part(self.part, self.group, name=f"stale halo exchange of layer {layer}",
                                        stats=self.stats, num_slots=2)
            self._stale[layer] = StaleHalo(ex)
        return self._stale[layer]

    def halo_rows(self) -> int:
        """Rows this rank receives per exact exchange (= rows it sends back in backward)."""
        return self.part.n_halo

    def tensor_devices(self, device: torch.device) -> dict[str, set[str]]:
        """Device types of the exchanges' buffers and of their send ids on ``device`` (empty before the first
        exchange): what a check that a run lives on its configured device reads."""
        exchanges = [*self._exact.values(), *(s.exchange for s in self._stale.values())]
        if not exchanges:
            return {}
        return {"halo_buffers": {t for ex in exchanges for t in ex.buffer_devices()},
                "send_ids": {d.type for ex in exchanges for d in ex.id_devices() if d == device}}

    def __repr__(self) -> str:
        return (f"HaloAggregator(part={self.part.part_id}, inner={self.part.n_inner:,}, halo={self.part.n_halo:,}, "
                f"norm={self.norm!r}, {self.config})")


class _Mark(torch.autograd.Function):
    """Identity that appends ``fwd`` to the trace when its forward runs and ``bwd`` when its backward runs."""

    @staticmethod
    def forward(ctx, x, trace, fwd, bwd):
        ctx.trace, ctx.bwd = trace, bwd
        if fwd is not None:
            trace.append(fwd)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.bwd is not None:
            ctx.trace.append(ctx.bwd)
        return grad, None, None, None


class ParallelGCN(NamedTuple):
    """What `parallelize_gcn` returns: the (unchanged) model, its aggregator and the gradient sync."""

    model: nn.Module
    aggregator: "PartsAggregator | HaloAggregator"
    grad_sync: BucketedGradSync


def _check_consistent(model: nn.Module, parts: list[GraphPart], workers: LogicalWorkers, group) -> None:
    """Every rank must host its block of parts (``workers.mine``) of one V-part partition, with the same initial
    weights; every part must send part q as many rows as q expects from it."""
    v = workers.v
    got = [p.part_id for p in parts]
    if got != list(workers.mine):
        raise ConfigError(f"rank {workers.rank} was given parts {got}; with {workers.describe()} it hosts parts "
                          f"{list(workers.mine)}")
    with torch.no_grad():
        checksum = sum(float(p.double().sum()) for p in model.parameters())
    send = np.zeros((v, v), dtype=np.int64)  # send[p, q] = rows part p sends to part q (rows of hosted p only)
    recv = np.zeros((v, v), dtype=np.int64)  # recv[q, p] = rows part q receives from part p
    for part in parts:
        send[part.part_id] = part.send_counts()
        recv[part.part_id] = part.recv_counts()
    rows = all_gather_rows([checksum, *send.ravel().tolist(), *recv.ravel().tolist()], group,
                           "start-up check")  # (K, 1 + 2 V^2)
    sums = rows[:, 0]
    if not torch.all(sums == sums[0]):
        raise DistributedError(f"ranks start from different weights (parameter sums {sums.tolist()}); "
                               "use the same model seed everywhere")
    send_all = rows[:, 1 : 1 + v * v].sum(0).long().view(v, v)  # each part's row comes from one rank
    recv_all = rows[:, 1 + v * v :].sum(0).long().view(v, v)
    if not torch.equal(send_all, recv_all.t()):
        bad = (send_all != recv_all.t()).nonzero()[0].tolist()
        raise DistributedError(
            f"parts disagree: part {bad[0]} sends {int(send_all[bad[0], bad[1]])} rows to part {bad[1]}, which "
            f"expects {int(recv_all[bad[1], bad[0]])}; were all parts loaded from the same partition folder?"
        )


def parallelize_gcn(
    model: nn.Module,
    parts: GraphPart | list[GraphPart],
    group=None,
    *,
    workers: LogicalWorkers | None = None,
    halo: HaloConfig | None = None,
    grad_sync: GradSyncConfig | None = None,
    stats: CommStats | None = None,
    kernel: str = DEFAULT_KERNEL,
) -> ParallelGCN:
    """Make ``model`` (a `haloflow.models.GCN`) train on ``parts`` (the block of a V-part partition this rank
    hosts, ``workers.mine``) as one of ``group``'s K ranks.

    The model object is left as it is (weights replicated on every rank); the returned aggregator is what the
    model's ``forward_blocks`` is given, and ``grad_sync.wait()`` must run between ``backward()`` and the
    optimizer step. Exact halos: a `PartsAggregator` (any K that divides V with a power of two per rank); stale or
    sampled halos (approximations): a `HaloAggregator`, one part per rank.

    Raises:
        ConfigError: K does not divide the partition's V as ``LogicalWorkers`` needs, this rank was not given its
            parts, or an approximation with several parts per rank.
        DistributedError: ranks hold different weights or inconsistent parts.
    """
    parts = [parts] if isinstance(parts, GraphPart) else list(parts)
    stats = stats if stats is not None else CommStats()
    halo = halo or HaloConfig()
    norm = getattr(getattr(model, "config", None), "norm", "gcn")
    world = dist.get_world_size(group) if group is not None else 1
    rank = dist.get_rank(group) if group is not None else 0
    if workers is None:
        workers = LogicalWorkers(parts[0].num_parts, world, rank, what="the partition's parts")
    # 1. layout and weights agree across ranks (one small all-gather at start-up)
    if group is not None:
        _check_consistent(model, parts, workers, group)
    elif [p.part_id for p in parts] != list(workers.mine):
        raise ConfigError(f"one process hosts every part of the partition ({list(workers.mine)}), got "
                          f"{[p.part_id for p in parts]}")
    # 2. the distributed aggregation over the hosted parts
    if halo.exact:
        aggregator = PartsAggregator(parts, workers, group, norm=norm, config=halo, stats=stats, kernel=kernel)
    else:
        if len(parts) != 1:
            raise ConfigError(f"stale or sampled halos (--staleness, --halo-keep) need one part per rank, but "
                              f"{workers.describe()}: run --nproc {workers.v}", field="halo")
        aggregator = HaloAggregator(parts[0], group, norm=norm, config=halo, stats=stats, kernel=kernel)
    # 3. weight gradients summed across ranks in buckets, launched from parameter hooks during backward
    sync = BucketedGradSync(model.parameters(), group, grad_sync, stats)
    log.info("parallelized (%s): %r", workers.describe(), aggregator)
    return ParallelGCN(model, aggregator, sync)
