"""Halo exchange: each rank receives the rows of its remote in-neighbours from their owners, asynchronously.

Layout (rank r of K; see ``haloflow.partition.types`` for the full partition layout)::

    x (n_inner, F)                     rows this rank owns
    send_ids  [ to 0 | to 1 | ... ]    local inner ids that part p holds as halo, grouped by p, sorted
    send_buf = x[send_ids]             (sum send, F)
                      all_to_all_single, uneven splits, async
    halo_buf  [ from 0 | from 1 | ... ] (n_halo, F)  grouped by owner, sorted by global id,
                                        i.e. exactly the halo columns n_inner.. of the local CSR

    backward (the reverse all-to-all):
    grad_halo (n_halo, F) --all_to_all--> grad_send (sum send, F) --index_add at send_ids--> grad_x (n_inner, F)

Usage, the three parts of every distributed step::

    handle = exchange.start(x)         # launches the all-to-all, returns at once
    y = a_inner @ x                    # work that does not need the halo
    y = y + a_halo @ handle.wait()     # (n_halo, F); blocks only if the exchange is still in flight

Backward overlaps the same way: the reverse all-to-all is launched when autograd reaches ``wait``'s node and is
waited on when it reaches ``start``'s node, after ``a_inner``'s backward has run in between (autograd runs nodes
in reverse creation order). Communication buffers are allocated once per width and reused every epoch.

Halo sampling (BNS-GCN, https://arxiv.org/abs/2203.10983): a ``HaloSelection`` keeps a random subset of the halo
rows for one epoch; the owner and the receiver draw the same subset from a counter-based hash of
``(seed, epoch, global id, receiving rank)``, so no extra message is needed; kept rows are scaled by 1/keep.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from haloflow.errors import ConfigError, DistributedError

__all__ = ["CommStats", "HaloExchange", "HaloHandle", "HaloSelection", "wait_work"]

log = logging.getLogger(__name__)


@dataclass
class CommStats:
    """Counters of one rank's communication, reset by the trainer each epoch.

    ``bytes_sent`` counts payload this rank sends to other ranks (halo rows forward, halo gradients backward,
    weight gradients); ``blocked_s`` is wall time spent waiting inside ``wait()`` for a collective to finish.
    """

    halo_bytes: int = 0
    halo_blocked_s: float = 0.0
    halo_exchanges: int = 0
    grad_bytes: int = 0
    grad_blocked_s: float = 0.0

    def reset(self) -> None:
        self.halo_bytes = self.grad_bytes = self.halo_exchanges = 0
        self.halo_blocked_s = self.grad_blocked_s = 0.0

    @property
    def bytes_sent(self) -> int:
        return self.halo_bytes + self.grad_bytes

    @property
    def blocked_s(self) -> float:
        return self.halo_blocked_s + self.grad_blocked_s


def wait_work(work, what: str, stats: CommStats | None = None, *, grad: bool = False) -> None:
    """Wait for an async collective, turning a dead or silent peer into a ``DistributedError``.

    A peer that crashed closes its sockets (gloo raises at once); one that hangs makes gloo raise after the
    process group's timeout. Either way the caller gets one clear error instead of a hang.
    """
    if work is None:
        return
    t0 = time.perf_counter()
    try:
        work.wait()  # blocks this thread until the collective has finished
    except RuntimeError as err:
        rank = dist.get_rank() if dist.is_initialized() else 0
        raise DistributedError(
            f"rank {rank}: {what} failed - a peer process died or did not answer within the process group "
            f"timeout ({str(err).splitlines()[0][:300]})"
        ) from err
    finally:
        if stats is not None:
            dt = time.perf_counter() - t0
            if grad:
                stats.grad_blocked_s += dt
            else:
                stats.halo_blocked_s += dt


# ------------------------------------------------------------------------------------------------ sampling
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (wraps mod 2^64, as intended)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _keep_mask(gids: np.ndarray, receiver: np.ndarray | int, keep: float, seed: int, epoch: int) -> np.ndarray:
    """True where halo copy (gid -> receiver) is kept this epoch; a pure function of its arguments."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.full(1, seed, dtype=np.uint64) ^ np.uint64(0x5EED))
        key = _splitmix64(key ^ np.uint64(epoch))
        z = _splitmix64(key ^ gids.astype(np.uint64))
        z = _splitmix64(z ^ np.asarray(receiver, dtype=np.uint64))
    u = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))  # uniform in [0, 1)
    return u < keep


@dataclass(frozen=True, eq=False)
class HaloSelection:
    """The halo rows kept for one epoch (BNS-GCN sampling), as positions into the full send and halo lists.

    Shapes:
        send_rows: int64 (kept sends,) positions into ``send_ids``, still grouped by destination.
        recv_rows: int64 (kept halo,) positions into the halo [0, n_halo), still grouped by owner.
        send_counts / recv_counts: K ints, the split sizes of the all-to-all.
    """

    send_rows: torch.Tensor
    recv_rows: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    scale: float

    @classmethod
    def sample(
        cls,
        *,
        rank: int,
        send_gids: np.ndarray,
        send_offsets: np.ndarray,
        halo_gids: np.ndarray,
        halo_offsets: np.ndarray,
        keep: float,
        seed: int,
        epoch: int,
    ) -> "HaloSelection":
        """Draw the kept rows; the owner's send side and the receiver's halo side agree by construction.

        Args:
            send_gids: global ids of the rows in the send list (``inner_gids[send_ids]``).
            send_offsets / halo_offsets: (K+1,) group boundaries of the send list and the halo.
            keep: fraction p of halo copies kept, in (0, 1].
        """
        if not 0.0 < keep <= 1.0:
            raise ConfigError(f"halo keep fraction must be in (0, 1], got {keep}")
        k = send_offsets.size - 1
        dest = np.repeat(np.arange(k), np.diff(send_offsets))  # receiving rank of each send row
        send_keep = _keep_mask(send_gids, dest, keep, seed, epoch)
        recv_keep = _keep_mask(halo_gids, rank, keep, seed, epoch)
        return cls(
            send_rows=torch.from_numpy(np.flatnonzero(send_keep)),
            recv_rows=torch.from_numpy(np.flatnonzero(recv_keep)),
            send_counts=_group_counts(send_keep, send_offsets),
            recv_counts=_group_counts(recv_keep, halo_offsets),
            scale=1.0 / keep,
        )


def _group_counts(mask: np.ndarray, offsets: np.ndarray) -> list[int]:
    """Number of True entries of ``mask`` inside each group [offsets[p], offsets[p+1])."""
    cum = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])  # (n+1,)
    return [int(c) for c in np.diff(cum[np.asarray(offsets, dtype=np.int64)])]


# ------------------------------------------------------------------------------------------------ exchange
@dataclass
class _Inflight:
    """One launched all-to-all: its work handle and the buffer it writes into."""

    work: object | None
    out: torch.Tensor
    selection: HaloSelection | None = None


@dataclass
class _Op:
    """State shared by the two autograd nodes of one exchange (start and wait)."""

    exchange: "HaloExchange"
    selection: HaloSelection | None
    fwd: _Inflight | None = None
    bwd: _Inflight | None = None


class HaloExchange:
    """One layer's halo exchange on a process group (see the module docstring for the layout).

    Args:
        send_ids: int64 (sum send,) local inner ids to send, grouped by destination rank.
        send_counts / recv_counts: K ints, rows sent to / received from each rank (own entry 0).
        n_inner: rows of ``x``; group: the process group; name: used in error messages.
        stats: counters to add bytes and blocked time to.
        num_slots: receive buffers per direction (2 for stale halos, where one is read while the next fills).
    """

    def __init__(
        self,
        send_ids: torch.Tensor,
        send_counts: list[int],
        recv_counts: list[int],
        *,
        n_inner: int,
        group=None,
        name: str = "halo exchange",
        stats: CommStats | None = None,
        num_slots: int = 1,
    ) -> None:
        if len(send_counts) != len(recv_counts):
            raise ConfigError(f"{name}: {len(send_counts)} send counts but {len(recv_counts)} receive counts")
        if sum(send_counts) != send_ids.numel():
            raise ConfigError(f"{name}: send counts sum to {sum(send_counts)} but there are {send_ids.numel()} send ids")
        if send_ids.numel() and (int(send_ids.min()) < 0 or int(send_ids.max()) >= n_inner):
            raise ConfigError(f"{name}: send ids must lie in [0, {n_inner}), got [{int(send_ids.min())}, "
                              f"{int(send_ids.max())}]")
        self.send_ids = send_ids.to(torch.int64)
        self.send_counts = [int(c) for c in send_counts]
        self.recv_counts = [int(c) for c in recv_counts]
        self.n_inner = int(n_inner)
        self.n_halo = sum(self.recv_counts)
        self.group = group
        self.name = name
        self.stats = stats
        self.num_slots = num_slots
        self._buffers: dict[tuple, torch.Tensor] = {}

    @classmethod
    def from_part(cls, part, group=None, **kwargs) -> "HaloExchange":
        """Build from a ``GraphPart``'s send list and halo groups."""
        return cls(
            torch.from_numpy(np.array(part.send_ids, dtype=np.int64)),  # a writable copy (parts may be mmapped)
            [int(c) for c in part.send_counts()],
            [int(c) for c in part.recv_counts()],
            n_inner=part.n_inner,
            group=group,
            **kwargs,
        )

    # -------------------------------------------------------------------------------------- public API
    def start(self, x: torch.Tensor, selection: HaloSelection | None = None) -> "HaloHandle":
        """Launch the exchange of ``x`` (n_inner, F); differentiable in ``x`` through ``handle.wait()``."""
        if x.dim() != 2 or x.shape[0] != self.n_inner:
            raise ConfigError(f"{self.name}: expected x of shape ({self.n_inner}, F), got {tuple(x.shape)}")
        op = _Op(self, selection)
        token = _StartFn.apply(x, op)  # (0,) links the start node to the wait node in the autograd graph
        return HaloHandle(op, token)

    def exchange(self, x: torch.Tensor) -> torch.Tensor:
        """Blocking, non-differentiable exchange: the halo rows of ``x``, (n_halo, F)."""
        inflight = self.launch_features(x.detach(), slot=0)
        return self.finish_features(inflight).clone()

    # -------------------------------------------------------------------------------------- primitives
    def buffer(self, kind: str, rows: int, width: int, dtype: torch.dtype, slot: int = 0) -> torch.Tensor:
        """A persistent (rows, width) buffer, allocated on first use and reused every epoch."""
        key = (kind, slot, width, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty(rows, width, dtype=dtype, device=self.send_ids.device)
            self._buffers[key] = buf
        return buf[:rows]

    def launch_features(self, x: torch.Tensor, slot: int = 0, selection: HaloSelection | None = None) -> _Inflight:
        """Gather ``x[send_ids]`` and launch the forward all-to-all into receive buffer ``slot``."""
        ids = self.send_ids if selection is None else self.send_ids[selection.send_rows]
        send_counts = self.send_counts if selection is None else selection.send_counts
        recv_counts = self.recv_counts if selection is None else selection.recv_counts
        f = x.shape[1]
        send = self.buffer("send", ids.numel(), f, x.dtype)
        torch.index_select(x, 0, ids, out=send)  # (sum send, F)
        out = self.buffer("recv", sum(recv_counts), f, x.dtype, slot)  # (n_halo or kept, F)
        work = self._all_to_all(out, send, recv_counts, send_counts)
        return _Inflight(work, out, selection)

    def finish_features(self, inflight: _Inflight) -> torch.Tensor:
        """Wait for a forward exchange; the halo rows (n_halo, F), dropped rows zero and kept rows scaled."""
        wait_work(inflight.work, f"{self.name} (forward)", self.stats)
        inflight.work = None  # drop the handle: a finished Work must not outlive the process group
        sel = inflight.selection
        if sel is None:
            return inflight.out
        full = self.buffer("full", self.n_halo, inflight.out.shape[1], inflight.out.dtype, 0)
        full.zero_()
        full.index_copy_(0, sel.recv_rows, inflight.out)
        return full.mul_(sel.scale)  # (n_halo, F)

    def launch_grads(self, grad_halo: torch.Tensor, slot: int = 0, selection: HaloSelection | None = None) -> _Inflight:
        """Send the halo gradients (n_halo, F) back to their owners (the reverse all-to-all)."""
        f = grad_halo.shape[1]
        if selection is None:
            send = self.buffer("gsend", self.n_halo, f, grad_halo.dtype)
            send.copy_(grad_halo)
            send_counts, recv_counts = self.recv_counts, self.send_counts
        else:
            send = self.buffer("gsend", selection.recv_rows.numel(), f, grad_halo.dtype)
            torch.index_select(grad_halo, 0, selection.recv_rows, out=send)
            send.mul_(selection.scale)
            send_counts, recv_counts = selection.recv_counts, selection.send_counts
        out = self.buffer("grecv", sum(recv_counts), f, grad_halo.dtype, slot)
        work = self._all_to_all(out, send, recv_counts, send_counts)
        return _Inflight(work, out, selection)

    def finish_grads(self, inflight: _Inflight) -> torch.Tensor:
        """Wait for a backward exchange; the owners' share of the gradient, (n_inner, F)."""
        wait_work(inflight.work, f"{self.name} (backward)", self.stats)
        inflight.work = None
        sel = inflight.selection
        ids = self.send_ids if sel is None else self.send_ids[sel.send_rows]
        grad = torch.zeros(self.n_inner, inflight.out.shape[1], dtype=inflight.out.dtype, device=ids.device)
        return grad.index_add_(0, ids, inflight.out)  # sequential on CPU: a node sent to several ranks sums in rank order

    def _all_to_all(self, out: torch.Tensor, send: torch.Tensor, recv_counts: list[int], send_counts: list[int]):
        if self.stats is not None:
            self.stats.halo_bytes += send.numel() * send.element_size()
            self.stats.halo_exchanges += 1
        if self.group is None:  # single process: nothing to receive
            return None
        try:
            return dist.all_to_all_single(out, send, recv_counts, send_counts, group=self.group, async_op=True)
        except RuntimeError as err:
            raise DistributedError(f"{self.name}: could not launch the all-to-all ({str(err).splitlines()[0]})") from err


class HaloHandle:
    """What ``HaloExchange.start`` returns; ``wait()`` gives the halo rows (n_halo, F)."""

    def __init__(self, op: _Op, token: torch.Tensor) -> None:
        self._op = op
        self._token = token
        # The halo is cached here, not on the op: the halo's backward node holds the op (ctx.op), so op -> halo
        # would be a cycle that keeps the exchange, its buffers and its process group alive past the step.
        self._halo: torch.Tensor | None = None

    def wait(self) -> torch.Tensor:
        if self._halo is None:
            self._halo = _WaitFn.apply(self._token, self._op)
        return self._halo


class _StartFn(torch.autograd.Function):
    """Forward: launch the all-to-all. Backward (runs last): wait for the reverse one, scatter into grad x."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, op: _Op) -> torch.Tensor:
        op.fwd = op.exchange.launch_features(x, selection=op.selection)
        ctx.op = op
        return x.new_empty(0)

    @staticmethod
    def backward(ctx, _token_grad: torch.Tensor):
        op = ctx.op
        if op.bwd is None:  # the halo did not reach the loss; no gradient flows back to the owners
            return None, None
        grad_x = op.exchange.finish_grads(op.bwd)
        op.bwd = None
        return grad_x, None


class _WaitFn(torch.autograd.Function):
    """Forward: wait for the halo. Backward (runs first): launch the reverse all-to-all, return at once."""

    @staticmethod
    def forward(ctx, token: torch.Tensor, op: _Op) -> torch.Tensor:
        halo = op.exchange.finish_features(op.fwd)
        op.fwd = None
        ctx.op = op
        ctx.token_shape = token.shape
        # Detached alias of the persistent buffer: the next epoch overwrites it only after this graph is gone.
        return halo.detach()

    @staticmethod
    def backward(ctx, grad_halo: torch.Tensor):
        op = ctx.op
        op.bwd = op.exchange.launch_grads(grad_halo.contiguous(), selection=op.selection)
        return grad_halo.new_zeros(ctx.token_shape), None
