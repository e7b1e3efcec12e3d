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
from dataclasses import dataclass

import numpy as np
import torch

from haloflow.engine.comm import CommStats, start_all_to_all, wait_work
from haloflow.errors import ConfigError

__all__ = ["HaloExchange", "HaloHandle", "HaloSelection"]

log = logging.getLogger(__name__)


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
    wait_first: bool = False  # the control schedule: backward waits for the reverse exchange as soon as it starts
    fwd: _Inflight | None = None
    bwd: _Inflight | None = None
    grad_x: torch.Tensor | None = None  # the control's finished backward exchange


class HaloExchange:
    """One layer's halo exchange on a process group (see the module docstring for the layout).

    Args:
        send_ids: int64 (sum send,) local inner ids to send, grouped by destination rank.
        send_counts / recv_counts: K ints, rows sent to / received from each rank (own entry 0).
        n_inner: rows of ``x``; group: the process group; name: used in error messages.
        stats: counters to add bytes and blocked time to (kinds "halo" forward and "halo_grad" backward).
        num_slots: receive buffers per direction (2 for stale halos, where one is read while the next fills).

    Buffers live on the device of the features they carry; the send ids follow them there once.
    ``trace``, when a list, records "launch:fwd", "wait:fwd", "launch:bwd", "wait:bwd" in the order they happen
    (the test of the overlap schedule reads it).
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
        self.trace: list[str] | None = None
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._ids_by_device = {self.send_ids.device: self.send_ids}

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
    def start(self, x: torch.Tensor, selection: HaloSelection | None = None, *,
              wait_first: bool = False) -> "HaloHandle":
        """Launch the exchange of ``x`` (n_inner, F); differentiable in ``x`` through ``handle.wait()``.

        ``wait_first`` makes backward wait for the reverse exchange right after launching it (the control
        schedule of the overlap benchmark; the caller makes forward wait before its own work).
        """
        if x.dim() != 2 or x.shape[0] != self.n_inner:
            raise ConfigError(f"{self.name}: expected x of shape ({self.n_inner}, F), got {tuple(x.shape)}")
        op = _Op(self, selection, wait_first)
        token = _StartFn.apply(x, op)  # (0,) links the start node to the wait node in the autograd graph
        return HaloHandle(op, token)

    def exchange(self, x: torch.Tensor) -> torch.Tensor:
        """Blocking, non-differentiable exchange: the halo rows of ``x``, (n_halo, F)."""
        inflight = self.launch_features(x.detach(), slot=0)
        return self.finish_features(inflight).clone()

    # -------------------------------------------------------------------------------------- primitives
    def buffer(self, kind: str, rows: int, width: int, dtype: torch.dtype, slot: int = 0,
               device: torch.device | None = None) -> torch.Tensor:
        """A persistent (rows, width) buffer on ``device``, allocated on first use and reused every epoch."""
        device = torch.device(device) if device is not None else self.send_ids.device
        key = (kind, slot, width, dtype, device)
        buf = self._buffers.get(key)
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty(rows, width, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf[:rows]

    def buffer_devices(self) -> set[str]:
        """Device types of the buffers made so far."""
        return {b.device.type for b in self._buffers.values()}

    def id_devices(self) -> list[torch.device]:
        """Devices the send ids have been copied to."""
        return list(self._ids_by_device)

    def ids_on(self, device: torch.device) -> torch.Tensor:
        """The send ids on ``device`` (copied there once)."""
        ids = self._ids_by_device.get(device)
        if ids is None:
            ids = self._ids_by_device[device] = self.send_ids.to(device)
        return ids

    def _event(self, name: str) -> None:
        if self.trace is not None:
            self.trace.append(name)

    def launch_features(self, x: torch.Tensor, slot: int = 0, selection: HaloSelection | None = None) -> _Inflight:
        """Gather ``x[send_ids]`` and launch the forward all-to-all into receive buffer ``slot``."""
        ids = self.ids_on(x.device)
        if selection is not None:
            ids = ids[selection.send_rows.to(x.device)]
        send_counts = self.send_counts if selection is None else selection.send_counts
        recv_counts = self.recv_counts if selection is None else selection.recv_counts
        f = x.shape[1]
        send = self.buffer("send", ids.numel(), f, x.dtype, device=x.device)
        torch.index_select(x, 0, ids, out=send)  # (sum send, F)
        out = self.buffer("recv", sum(recv_counts), f, x.dtype, slot, device=x.device)  # (n_halo or kept, F)
        work = start_all_to_all(out, send, recv_counts, send_counts, self.group, self.name, self.stats, "halo")
        self._event("launch:fwd")
        return _Inflight(work, out, selection)

    def finish_features(self, inflight: _Inflight) -> torch.Tensor:
        """Wait for a forward exchange; the halo rows (n_halo, F), dropped rows zero and kept rows scaled."""
        wait_work(inflight.work, f"{self.name} (forward)", self.stats, "halo")
        inflight.work = None  # drop the handle: a finished Work must not outlive the process group
        self._event("wait:fwd")
        sel = inflight.selection
        if sel is None:
            return inflight.out
        out = inflight.out
        full = self.buffer("full", self.n_halo, out.shape[1], out.dtype, 0, device=out.device)
        full.zero_()
        full.index_copy_(0, sel.recv_rows.to(out.device), out)
        return full.mul_(sel.scale)  # (n_halo, F)

    def launch_grads(self, grad_halo: torch.Tensor, slot: int = 0, selection: HaloSelection | None = None) -> _Inflight:
        """Send the halo gradients (n_halo, F) back to their owners (the reverse all-to-all)."""
        f, dev = grad_halo.shape[1], grad_halo.device
        if selection is None:
            send = self.buffer("gsend", self.n_halo, f, grad_halo.dtype, device=dev)
            send.copy_(grad_halo)
            send_counts, recv_counts = self.recv_counts, self.send_counts
        else:
            send = self.buffer("gsend", selection.recv_rows.numel(), f, grad_halo.dtype, device=dev)
            torch.index_select(grad_halo, 0, selection.recv_rows.to(dev), out=send)
            send.mul_(selection.scale)
            send_counts, recv_counts = selection.recv_counts, selection.send_counts
        out = self.buffer("grecv", sum(recv_counts), f, grad_halo.dtype, slot, device=dev)
        work = start_all_to_all(out, send, recv_counts, send_counts, self.group, self.name, self.stats, "halo_grad")
        self._event("launch:bwd")
        return _Inflight(work, out, selection)

    def finish_grads(self, inflight: _Inflight) -> torch.Tensor:
        """Wait for a backward exchange; the owners' share of the gradient, (n_inner, F)."""
        wait_work(inflight.work, f"{self.name} (backward)", self.stats, "halo_grad")
        inflight.work = None
        self._event("wait:bwd")
        sel = inflight.selection
        dev = inflight.out.device
        ids = self.ids_on(dev) if sel is None else self.ids_on(dev)[sel.send_rows.to(dev)]
        grad = torch.zeros(self.n_inner, inflight.out.shape[1], dtype=inflight.out.dtype, device=dev)
        return grad.index_add_(0, ids, inflight.out)  # sequential on CPU: a node sent to several ranks sums in rank order


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
        if op.grad_x is not None:  # the control schedule finished it already
            grad_x, op.grad_x = op.grad_x, None
            return grad_x, None
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
        if op.wait_first:  # control: no work between launch and wait
            op.grad_x = op.exchange.finish_grads(op.bwd)
            op.bwd = None
        return grad_halo.new_zeros(ctx.token_shape), None
