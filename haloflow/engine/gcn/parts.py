"""Several parts of a partition on one rank: `PartsExchange` and `PartsAggregator` (the exact halos of V logical
workers on K ranks, ``engine/logical.py``).

Each of the V parts computes exactly what it computes as a rank of its own (K = V): its rows in its own tensors,
its halo in the layout of its own folder (grouped by owner part, sorted by global id), and its SpMM as
``A_inner @ h + A_halo @ halo``. Only the transport depends on K: a halo row whose owner part sits on the same rank
is copied, one on another rank travels in the rank's all-to-all::

    V = 4, K = 2: rank 0 hosts parts 0, 1; rank 1 hosts parts 2, 3

    send buffer of rank 0 to rank 1    [ to part 2: from 0 | from 1 ][ to part 3: from 0 | from 1 ]
    receive buffer of rank 0           [ from rank 1: (part 0: from 2 | from 3)(part 1: from 2 | from 3) ]
    halo of part 1                     [ from 0 (a local copy of h_0's rows) | from 2 | from 3 (received) ]

    backward: the halo gradients go back the same way (copies, and the reverse all-to-all); each part's
    gradient of its sent rows is laid out as its own send list (by destination part), then
    zeros.index_add_(send_ids, rows): a row sent to several parts sums in part order, as at K = V.

One rank's exchange is one all-to-all whatever V / K; the inner SpMMs of every hosted part run while it is in
flight (``schedule="wait_first"``: after it, the control of the overlap benchmark; the same floats).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from haloflow.engine.comm import CommStats, start_all_to_all, wait_work
from haloflow.engine.gcn.config import HaloConfig
from haloflow.engine.logical import LogicalWorkers
from haloflow.errors import ConfigError, DistributedError
from haloflow.models.aggregate import add_diagonal, normalized_values, self_loop_values
from haloflow.models.spmm import DEFAULT_KERNEL, SparseOperator
from haloflow.partition.types import GraphPart

__all__ = ["PartsExchange", "PartsAggregator", "split_part_operators"]


def split_part_operators(part: GraphPart, norm: str, kernel: str = DEFAULT_KERNEL) -> tuple[SparseOperator, SparseOperator]:
    """``(A_inner, A_halo)`` of a part: (n_inner, n_inner) with the self-loops, and (n_inner, n_halo).

    Values come from ``normalized_values`` with the global degrees the part carries, so every edge has exactly
    the value the single-device operator gives it.
    """
    n_inner, n_halo = part.n_inner, part.n_halo
    indptr = np.asarray(part.indptr, dtype=np.int64)
    indices = np.asarray(part.indices, dtype=np.int64)
    deg = np.asarray(part.in_degree, dtype=np.int64)  # (n_inner + n_halo,) global in-degrees
    values = normalized_values(indptr, indices, deg[:n_inner], deg, norm)  # (nnz,)
    rows = np.repeat(np.arange(n_inner, dtype=np.int64), np.diff(indptr))  # (nnz,)
    inner = indices < n_inner

    def block(mask: np.ndarray, col_shift: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        counts = np.bincount(rows[mask], minlength=n_inner)
        ptr = np.zeros(n_inner + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        return ptr, indices[mask] - col_shift, values[mask]  # rows stay sorted: masking keeps the order

    ip, ii, iv = block(inner, 0)
    diag = self_loop_values(deg[:n_inner], norm)
    if diag is not None:
        ip, ii, iv = add_diagonal(ip, ii, iv, diag)
    hp, hi, hv = block(~inner, n_inner)
    a_inner = SparseOperator(ip, ii, iv, (n_inner, n_inner), kernel=kernel)
    a_halo = SparseOperator(hp, hi, hv, (n_inner, n_halo), kernel=kernel)
    return a_inner, a_halo


@dataclass(frozen=True)
class _Piece:
    """Rows that part ``src`` sends to part ``dst``: positions ``[lo, hi)`` of src's send list and of dst's halo,
    and where they sit in this rank's all-to-all buffer (``at``; -1 when both parts are hosted here)."""

    src: int
    dst: int
    send_lo: int
    halo_lo: int
    rows: int
    at: int = -1


class PartsExchange:
    """The halo exchange of the parts a rank hosts (see the module docstring), for any width.

    Args:
        parts: the hosted parts, in part order (``workers.mine``).
        workers: V logical workers (the parts) on K ranks.
        group: the process group (None: K = 1, every part here).
        stats: counters of bytes ("halo", "halo_grad") and blocked time.
    """

    def __init__(self, parts: list[GraphPart], workers: LogicalWorkers, group=None, *, name: str = "halo exchange",
                 stats: CommStats | None = None):
        self.parts, self.workers, self.group, self.name, self.stats = parts, workers, group, name, stats
        self.hosted = {p.part_id: i for i, p in enumerate(parts)}  # part id -> position among the hosted
        k, rank = workers.k, workers.rank
        self.send_ids = [torch.from_numpy(np.array(p.send_ids, dtype=np.int64)) for p in parts]
        self.n_halo = [p.n_halo for p in parts]
        self.local: list[_Piece] = []  # pieces between hosted parts
        self.out: list[list[_Piece]] = [[] for _ in range(k)]  # pieces sent to rank d, in buffer order
        self.into: list[list[_Piece]] = [[] for _ in range(k)]  # pieces received from rank s, in buffer order
        for d in range(k):  # to rank d: by destination part, then by source part
            for dst in range(d * workers.per_rank, (d + 1) * workers.per_rank):
                for p in parts:
                    lo, hi = int(p.send_offsets[dst]), int(p.send_offsets[dst + 1])
                    if hi > lo and d != rank:
                        self.out[d].append(_Piece(p.part_id, dst, lo, -1, hi - lo))
        for q in parts:  # into part q: from every owner part, in part order
            for src in range(workers.v):
                lo, hi = int(q.halo_offsets[src]), int(q.halo_offsets[src + 1])
                if hi <= lo:
                    continue
                s = workers.owner(src)
                if s == rank:
                    sp = parts[self.hosted[src]]
                    send_lo = int(sp.send_offsets[q.part_id])
                    if int(sp.send_offsets[q.part_id + 1]) - send_lo != hi - lo:
                        raise DistributedError(f"parts disagree: part {src} sends "
                                               f"{int(sp.send_offsets[q.part_id + 1]) - send_lo} rows to part "
                                               f"{q.part_id}, which expects {hi - lo}")
                    self.local.append(_Piece(src, q.part_id, send_lo, lo, hi - lo))
                else:
                    self.into[s].append(_Piece(src, q.part_id, -1, lo, hi - lo))
        # received buffer from rank s is ordered by destination part (hosted), then source part: sort to that
        for s in range(k):
            self.into[s].sort(key=lambda c: (c.dst, c.src))
        self.send_counts = [sum(c.rows for c in self.out[d]) for d in range(k)]
        self.recv_counts = [sum(c.rows for c in self.into[s]) for s in range(k)]
        self.out = [self._placed(chunks, sum(self.send_counts[:d])) for d, chunks in enumerate(self.out)]
        self.into = [self._placed(chunks, sum(self.recv_counts[:s])) for s, chunks in enumerate(self.into)]
        self.trace: list[str] | None = None
        self._ids: dict[torch.device, list[torch.Tensor]] = {}
        self.buffer_types: set[str] = set()  # device types of the buffers made so far

    @staticmethod
    def _placed(chunks: list[_Piece], at: int) -> list[_Piece]:
        out = []
        for c in chunks:
            out.append(_Piece(c.src, c.dst, c.send_lo, c.halo_lo, c.rows, at))
            at += c.rows
        return out

    @property
    def one_part(self) -> bool:
        """One hosted part: its halo is the receive buffer itself, its sent rows' gradients the reverse one's."""
        return len(self.parts) == 1

    def ids_on(self, device: torch.device) -> list[torch.Tensor]:
        if device not in self._ids:
            self._ids[device] = [i.to(device) for i in self.send_ids]
        return self._ids[device]

    def _event(self, name: str) -> None:
        if self.trace is not None:
            self.trace.append(name)

    # ------------------------------------------------------------------------------------------ forward
    def launch(self, hs: list[torch.Tensor]):
        """Send the remote pieces of ``hs`` (the hosted parts' rows); returns the receive buffer and the work."""
        f, dev, dtype = hs[0].shape[1], hs[0].device, hs[0].dtype
        ids = self.ids_on(dev)
        send = torch.empty(sum(self.send_counts), f, dtype=dtype, device=dev)  # (sum send, F)
        for chunks in self.out:
            for c in chunks:
                i = self.hosted[c.src]
                torch.index_select(hs[i], 0, ids[i][c.send_lo:c.send_lo + c.rows], out=send[c.at:c.at + c.rows])
        recv = torch.empty(sum(self.recv_counts), f, dtype=dtype, device=dev)  # (sum recv, F)
        self.buffer_types.update((send.device.type, recv.device.type))
        work = start_all_to_all(recv, send, self.recv_counts, self.send_counts, self.group, self.name, self.stats,
                                "halo")
        self._event("launch:fwd")
        return recv, work

    def halos(self, hs: list[torch.Tensor], recv: torch.Tensor, work) -> list[torch.Tensor]:
        """Wait for the exchange; every hosted part's halo (n_halo, F), in its folder's layout."""
        wait_work(work, f"{self.name} (forward)", self.stats, "halo")
        self._event("wait:fwd")
        if self.one_part:
            return [recv]
        f, dev = hs[0].shape[1], hs[0].device
        ids = self.ids_on(dev)
        out = [torch.empty(n, f, dtype=hs[0].dtype, device=dev) for n in self.n_halo]
        for c in self.local:
            i = self.hosted[c.src]
            torch.index_select(hs[i], 0, ids[i][c.send_lo:c.send_lo + c.rows],
                               out=out[self.hosted[c.dst]][c.halo_lo:c.halo_lo + c.rows])
        for chunks in self.into:
            for c in chunks:
                out[self.hosted[c.dst]][c.halo_lo:c.halo_lo + c.rows].copy_(recv[c.at:c.at + c.rows])
        return out

    # ------------------------------------------------------------------------------------------ backward
    def launch_grads(self, grads: list[torch.Tensor]):
        """Send the halo gradients of remote owners back (the reverse all-to-all)."""
        f, dev, dtype = grads[0].shape[1], grads[0].device, grads[0].dtype
        if self.one_part:
            send = grads[0].contiguous()
        else:
            send = torch.empty(sum(self.recv_counts), f, dtype=dtype, device=dev)
            for chunks in self.into:
                for c in chunks:
                    send[c.at:c.at + c.rows].copy_(grads[self.hosted[c.dst]][c.halo_lo:c.halo_lo + c.rows])
        recv = torch.empty(sum(self.send_counts), f, dtype=dtype, device=dev)
        work = start_all_to_all(recv, send, self.send_counts, self.recv_counts, self.group, self.name, self.stats,
                                "halo_grad")
        self._event("launch:bwd")
        return recv, work

    def grads_of_rows(self, grads: list[torch.Tensor], recv: torch.Tensor, work) -> list[torch.Tensor]:
        """Wait for the reverse exchange; each hosted part's gradient of its own rows from its halo copies,
        (n_inner, F): its send list's rows, summed into place in destination-part order."""
        wait_work(work, f"{self.name} (backward)", self.stats, "halo_grad")
        self._event("wait:bwd")
        f, dev, dtype = grads[0].shape[1], grads[0].device, grads[0].dtype
        ids = self.ids_on(dev)
        if self.one_part:
            rows = [recv]
        else:
            rows = [torch.empty(i.numel(), f, dtype=dtype, device=dev) for i in ids]  # each: its send list's rows
            for c in self.local:
                rows[self.hosted[c.src]][c.send_lo:c.send_lo + c.rows].copy_(
                    grads[self.hosted[c.dst]][c.halo_lo:c.halo_lo + c.rows])
            for chunks in self.out:
                for c in chunks:
                    rows[self.hosted[c.src]][c.send_lo:c.send_lo + c.rows].copy_(recv[c.at:c.at + c.rows])
        # sequential on CPU: a node sent to several parts sums in part order
        return [torch.zeros(p.n_inner, f, dtype=dtype, device=dev).index_add_(0, i, r)
                for p, i, r in zip(self.parts, ids, rows)]


@dataclass
class _Op:
    exchange: PartsExchange
    wait_first: bool
    hs: list | None = None
    fwd: tuple | None = None
    bwd: tuple | None = None
    bwd_grads: list | None = None
    done: list | None = None  # the control's finished backward


class _StartFn(torch.autograd.Function):
    """Forward: launch. Backward (after the inner SpMMs' backward): wait for the reverse exchange."""

    @staticmethod
    def forward(ctx, op: _Op, *hs: torch.Tensor) -> torch.Tensor:
        op.hs = [h.detach() for h in hs]
        op.fwd = op.exchange.launch(op.hs)
        ctx.op = op
        return hs[0].new_empty(0)

    @staticmethod
    def backward(ctx, _token):
        op = ctx.op
        if op.done is not None:
            grads, op.done = op.done, None
        elif op.bwd is None:  # no halo reached the loss
            return (None,) * (1 + len(op.exchange.parts))
        else:
            grads = op.exchange.grads_of_rows(op.bwd_grads, *op.bwd)
        op.bwd = op.bwd_grads = None
        return (None, *grads)


class _WaitFn(torch.autograd.Function):
    """Forward: wait, assemble the halos. Backward (first): launch the reverse exchange, return at once."""

    @staticmethod
    def forward(ctx, token: torch.Tensor, op: _Op):
        halos = op.exchange.halos(op.hs, *op.fwd)
        op.fwd, op.hs = None, None
        ctx.op, ctx.token_shape = op, token.shape
        return tuple(h.detach() for h in halos)

    @staticmethod
    def backward(ctx, *grads):
        op = ctx.op
        ex = op.exchange
        like = next((g for g in grads if g is not None), None)
        if like is None:  # no halo reached the loss: nothing goes back
            return None, None
        grads = [g.contiguous() if g is not None else like.new_zeros(n, like.shape[1])
                 for g, n in zip(grads, ex.n_halo)]
        op.bwd, op.bwd_grads = ex.launch_grads(grads), grads
        if op.wait_first:
            op.done = ex.grads_of_rows(grads, *op.bwd)
            op.bwd = op.bwd_grads = None
        return like.new_zeros(ctx.token_shape), None


class PartsAggregator:
    """The distributed `BlockAggregator` of the exact halos: the hosted parts' rows, remote in-neighbours from
    hosted parts by a copy and from other ranks by one all-to-all per layer.

    Args:
        parts: the hosted parts in part order; workers: V (the parts) on K ranks; group: None when K = 1.
        norm / kernel: as the model's config says; config: ``HaloConfig`` (exact: staleness 0, halo_keep 1).
        stats: counters of bytes and blocked time (the trainer resets them each epoch).

    Shapes:
        ``aggregate_blocks(layer, hs)``: [(n_inner_p, F)] -> [(n_inner_p, F)], one per hosted part.
    """

    def __init__(self, parts: list[GraphPart], workers: LogicalWorkers, group=None, *, norm: str = "gcn",
                 config: HaloConfig | None = None, stats: CommStats | None = None, kernel: str = DEFAULT_KERNEL):
        self.config = config or HaloConfig()
        if not self.config.exact:
            raise ConfigError("PartsAggregator computes exact halos; staleness and halo_keep need one part per rank "
                              "(HaloAggregator)", field="halo")
        self.parts, self.workers, self.group, self.norm = parts, workers, group, norm
        self.stats = stats if stats is not None else CommStats()
        self.ops = [split_part_operators(p, norm, kernel) for p in parts]  # (A_inner, A_halo) per part
        self._exchanges: dict[int, PartsExchange] = {}
        self.trace: list[str] | None = None
        self.epoch, self.training = 0, False

    def set_epoch(self, epoch: int, training: bool) -> None:
        self.epoch, self.training = int(epoch), bool(training)

    def finish(self) -> None:
        """Nothing stays in flight between epochs."""

    def aggregate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        return self.aggregate_blocks(layer, [h])[0]

    def aggregate_blocks(self, layer: int, hs: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(hs) != len(self.parts) or any(h.dim() != 2 or h.shape[0] != p.n_inner for h, p in zip(hs, self.parts)):
            raise ConfigError(f"aggregate expects one (n_inner, F) block per hosted part "
                              f"({[p.n_inner for p in self.parts]} rows), got {[tuple(h.shape) for h in hs]}")
        ex = self._exchange(layer)
        ex.trace = self.trace
        op = _Op(ex, self.config.schedule == "wait_first")
        token = _StartFn.apply(op, *hs)  # returns at once: the all-to-all is in flight
        if op.wait_first:  # the control: nothing overlaps the exchange
            halos = _WaitFn.apply(token, op)
            inner = self._inner(hs)
            return [y + a_halo @ halo for (_, a_halo), y, halo in zip(self.ops, inner, halos)]
        inner = self._inner(hs)  # (n_inner, F) each, while the halo is in flight
        halos = _WaitFn.apply(token, op)
        return [y + a_halo @ halo for (_, a_halo), y, halo in zip(self.ops, inner, halos)]

    def _inner(self, hs: list[torch.Tensor]) -> list[torch.Tensor]:
        """A_inner @ h of every hosted part (marked "inner:fwd" in the trace once they ran)."""
        out = [a_in @ h for (a_in, _), h in zip(self.ops, hs)]
        if self.trace is not None:
            self.trace.append("inner:fwd")
        return out

    def _exchange(self, layer: int) -> PartsExchange:
        if layer not in self._exchanges:
            self._exchanges[layer] = PartsExchange(self.parts, self.workers, self.group,
                                                   name=f"halo exchange of layer {layer}", stats=self.stats)
        return self._exchanges[layer]

    def halo_rows(self) -> int:
        """Rows this rank receives per exchange from other ranks."""
        return sum(self._exchange(0).recv_counts)

    def tensor_devices(self, device: torch.device) -> dict[str, set[str]]:
        """Device types of the exchanges' buffers and of their send ids on ``device`` (empty before the first
        exchange): what a check that a run lives on its configured device reads."""
        if not self._exchanges:
            return {}
        exchanges = self._exchanges.values()
        return {"halo_buffers": {t for ex in exchanges for t in ex.buffer_types},
                "send_ids": {d.type for ex in exchanges for d in ex._ids if d == device}}

    def __repr__(self) -> str:
        return (f"PartsAggregator(parts={[p.part_id for p in self.parts]}, "
                f"inner={sum(p.n_inner for p in self.parts):,}, halo={sum(p.n_halo for p in self.parts):,}, "
                f"norm={self.norm!r})")
