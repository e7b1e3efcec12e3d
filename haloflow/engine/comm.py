"""Communication shared by every distributed model: one stats type, waiting on handles, small gathers, all-to-all.

Every collective in the engine follows the same three parts: *start* it (``async_op=True``, returns a handle),
do the work that does not need it, *wait* as late as possible. ``wait_work`` is the one place where a handle is
waited on: it turns a dead or silent peer into a ``DistributedError`` naming the operation, and adds the time
this thread spent blocked to ``CommStats`` under the operation's kind.

``CommStats`` counts, per kind (``"halo"``, ``"halo_grad"``, ``"grad"``, ``"input_lengths"``, ``"pooled"``, ...),
the bytes this rank sends to *other* ranks (self-sends are local copies), the number of calls, and the seconds
spent blocked in ``wait``. On CUDA, ``wait`` only orders streams (the host does not block), so blocked time is a
host-side measure on CPU only; the benchmarks time overlap with a control schedule instead (``bench/gcn_dist``).
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from haloflow.errors import DistributedError

__all__ = [
    "Group",
    "group_rank",
    "group_size",
    "CommStats",
    "wait_work",
    "start_all_to_all",
    "all_gather_rows",
    "all_gather_cat",
    "AllToAllHandle",
    "all_to_all",
    "all_gather_uneven",
]

Group = object  # a torch.distributed ProcessGroup, or None for a single process without a group

HALO_KINDS = ("halo", "halo_grad")


def group_rank(group: Group | None) -> int:
    return 0 if group is None else dist.get_rank(group)


def group_size(group: Group | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


@dataclass
class CommStats:
    """One rank's communication, by kind: bytes sent to other ranks, calls, seconds blocked in ``wait``.

    The trainers reset it every step or epoch. The named properties sum the kinds a model family uses.
    """

    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    blocked: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def record(self, kind: str, nbytes: int) -> None:
        self.bytes[kind] += int(nbytes)
        self.calls[kind] += 1

    def record_blocked(self, kind: str, seconds: float) -> None:
        self.blocked[kind] += seconds

    def total(self) -> int:
        return sum(self.bytes.values())

    def snapshot(self) -> dict[str, int]:
        """The non-zero byte counts, by kind."""
        return {k: v for k, v in sorted(self.bytes.items()) if v}

    def reset(self) -> None:
        self.bytes.clear()
        self.calls.clear()
        self.blocked.clear()

    # -------------------------------------------------------------------------------- sums of kinds
    @property
    def halo_bytes(self) -> int:
        return sum(self.bytes[k] for k in HALO_KINDS)

    @property
    def halo_exchanges(self) -> int:
        return sum(self.calls[k] for k in HALO_KINDS)

    @property
    def halo_blocked_s(self) -> float:
        return sum(self.blocked[k] for k in HALO_KINDS)

    @property
    def grad_bytes(self) -> int:
        return self.bytes["grad"]

    @property
    def grad_blocked_s(self) -> float:
        return self.blocked["grad"]

    @property
    def blocked_s(self) -> float:
        return sum(self.blocked.values())


# ------------------------------------------------------------------------------------------------ who is gone
_PEERS: list[tuple[int, int]] = []  # (host key, pid) of every rank of the run, in rank order


def _host_key() -> int:
    return zlib.crc32(socket.gethostname().encode())


_ROLL_CALL: list = []  # [a key-value store every rank of this run reaches], or empty


def register_peers(group: Group | None, store=None) -> None:
    """Learn every rank's host and pid (one small gather at start-up), so that a failed collective can say which
    peer process has gone (``peer_note``); with ``store`` (the rendezvous store), also which rank is silent."""
    global _PEERS
    _ROLL_CALL.clear()
    if group is None:
        _PEERS = []
        return
    rows = all_gather_rows([_host_key(), os.getpid()], group, "exchanging process ids")
    _PEERS = [(int(h), int(p)) for h, p in rows.tolist()]
    if store is not None:
        _ROLL_CALL.append(store)


def _roll_call(wait_s: float = 3.0) -> list[int] | None:
    """After a failed collective: every rank still running answers in the store; the ranks that do not within
    ``wait_s`` are the silent ones (hung, or stopped in a long computation). None when there is no store."""
    if not _ROLL_CALL:
        return None
    store = _ROLL_CALL[0]
    me = dist.get_rank() if dist.is_initialized() else 0
    try:
        store.set(f"roll/{me}", "here")
        missing = set(range(len(_PEERS))) - {me}
        deadline = time.perf_counter() + wait_s
        while missing and time.perf_counter() < deadline:
            missing = {r for r in missing if not store.check([f"roll/{r}"])}
            if missing:
                time.sleep(0.1)
        return sorted(missing)
    except Exception:  # the store itself is gone (the launcher died): nothing more to learn
        return None


def _exited(pid: int) -> bool:
    """True when ``pid`` is gone or a zombie (killed, not yet reaped by torchrun)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass
        return False


def peer_note() -> str:
    """Which peer has gone, as far as this host can see: "rank 1 (pid 4242) has exited", or why it cannot say."""
    if not _PEERS:
        return "a peer process died or did not answer within the process group timeout"
    me = _host_key()
    local = [(r, pid) for r, (host, pid) in enumerate(_PEERS) if host == me and pid != os.getpid()]
    gone = [f"rank {r} (pid {pid})" for r, pid in local if _exited(pid)]
    if gone:
        return f"{', '.join(gone)} ha{'s' if len(gone) == 1 else 've'} exited"
    silent = _roll_call()
    if silent:
        who = ", ".join(f"rank {r}" + (f" (pid {_PEERS[r][1]})" if _PEERS[r][0] == me else "") for r in silent)
        return f"{who} stopped answering (its process is still there: hung, or stuck in a long computation)"
    remote = len(_PEERS) - 1 - len(local)
    where = f"; {remote} rank{'s' if remote != 1 else ''} on other hosts not checked" if remote else ""
    return f"no peer process on this host has exited, so one stopped answering within the timeout{where}"


def wait_work(work, what: str, stats: CommStats | None = None, kind: str | None = None) -> None:
    """Wait for an async collective, turning a dead or silent peer into a ``DistributedError``.

    A peer that crashed closes its sockets (gloo raises at once); one that hangs makes gloo raise after the
    process group's timeout. Either way the caller gets one clear error naming ``what`` instead of a hang.
    """
    if work is None:
        return
    t0 = time.perf_counter()
    try:
        work.wait()  # CPU/gloo: blocks this thread; CUDA/NCCL: makes the current stream wait, host returns
    except RuntimeError as err:
        rank = dist.get_rank() if dist.is_initialized() else 0
        raise DistributedError(f"rank {rank}: {what} failed - {peer_note()} ({str(err).splitlines()[0][:300]})") from err
    finally:
        if stats is not None and kind is not None:
            stats.record_blocked(kind, time.perf_counter() - t0)


def start_all_to_all(out: Tensor, send: Tensor, recv_counts: list[int], send_counts: list[int], group: Group | None,
                     what: str, stats: CommStats | None = None, kind: str | None = None):
    """Launch an uneven ``all_to_all_single`` (async) and count its bytes under ``kind``; None without a group (a
    single process receives nothing). A peer already gone is one ``DistributedError`` naming ``what``."""
    if stats is not None and kind is not None:
        stats.record(kind, send.numel() * send.element_size())
    if group is None:
        return None
    try:
        return dist.all_to_all_single(out, send, recv_counts, send_counts, group=group, async_op=True)
    except RuntimeError as err:
        raise DistributedError(f"{what}: could not launch the all-to-all - {peer_note()} "
                               f"({str(err).splitlines()[0][:300]})") from err


def all_gather_rows(values: Sequence[float], group: Group | None, what: str) -> Tensor:
    """Every rank's row of numbers: (K, len(values)) float64 on the CPU, rows in rank order; one small collective.

    For metrics and start-up checks. ``group=None`` gives the one row of this process.
    """
    row = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if group is None:
        return row[None]
    # NCCL moves only device tensors; gloo only host ones. The rows are tiny either way.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    row = row.to(device)
    rows = torch.empty(group_size(group), row.numel(), dtype=torch.float64, device=device)
    try:
        dist.all_gather(list(rows.unbind(0)), row, group=group)
    except RuntimeError as err:
        raise DistributedError(f"rank {group_rank(group)}: {what} failed - {peer_note()} "
                               f"({str(err).splitlines()[0][:300]})") from err
    return rows.cpu()


def all_gather_cat(x: Tensor, group: Group | None) -> Tensor:
    """Every rank's 1-D tensor concatenated in rank order (sizes may differ: padded to the longest, then cut)."""
    if group is None:
        return x
    world = group_size(group)
    sizes = all_gather_rows([x.numel()], group, "sizes of a gather").reshape(-1).long().tolist()
    longest = max(sizes)
    # NCCL moves only device tensors, gloo only host ones
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    padded = torch.zeros(longest, dtype=x.dtype, device=device)
    padded[: x.numel()] = x
    out = [torch.empty_like(padded) for _ in range(world)]
    try:
        dist.all_gather(out, padded, group=group)
    except RuntimeError as err:
        raise DistributedError(f"rank {group_rank(group)}: gather failed - {peer_note()} "
                               f"({str(err).splitlines()[0][:300]})") from err
    return torch.cat([o[:n] for o, n in zip(out, sizes)]).to(x.device)


class AllToAllHandle:
    """A flat all-to-all in flight; ``wait()`` returns the received tensor (sources in rank order)."""

    def __init__(self, work, output: Tensor, kind: str = "all_to_all", stats: CommStats | None = None):
        self._work = work
        self._output = output
        self._kind = kind
        self._stats = stats

    def wait(self) -> Tensor:
        if self._work is not None:
            # Blocks until every peer's block has arrived; a dead peer becomes a DistributedError.
            wait_work(self._work, f"all-to-all ({self._kind})", self._stats, self._kind)
            self._work = None
        return self._output


def all_to_all(
    send: Tensor,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    *,
    group: Group | None,
    stats: CommStats | None = None,
    kind: str = "all_to_all",
    out: Tensor | None = None,
) -> AllToAllHandle:
    """Start an all-to-all of a 1-D tensor with per-rank element counts (uneven splits allowed).

    Args:
        send: (sum send_splits,) elements, block p goes to rank p.
        send_splits / recv_splits: K element counts; the receive counts must match what the peers send.
        out: a preallocated (sum recv_splits,) receive buffer (default: a new one).

    Shapes:
        send (sum send_splits,) -> wait() (sum recv_splits,)
    """
    send_splits, recv_splits = [int(n) for n in send_splits], [int(n) for n in recv_splits]
    if send.numel() != sum(send_splits):
        raise ValueError(f"all_to_all: send has {send.numel()} elements but the splits add up to {sum(send_splits)}")
    output = send.new_empty(sum(recv_splits)) if out is None else out
    if group is None:  # one process: the only block is our own
        output.copy_(send)
        return AllToAllHandle(None, output)
    rank = dist.get_rank(group)
    if stats is not None:
        stats.record(kind, send.element_size() * sum(n for p, n in enumerate(send_splits) if p != rank))
    try:
        work = dist.all_to_all_single(output, send.contiguous(), recv_splits, send_splits, group=group,
                                      async_op=True)
    except RuntimeError as err:
        raise DistributedError(f"rank {rank}: could not launch the all-to-all ({kind}) - {peer_note()} "
                               f"({str(err).splitlines()[0][:300]})") from err
    return AllToAllHandle(work, output, kind, stats)


class _PeerHandle:
    """Point-to-point sends and receives in flight; ``wait()`` waits for all of them, returns the output."""

    def __init__(self, works: list, output: Tensor, kind: str, stats: CommStats | None):
        self._works, self._output, self._kind, self._stats = works, output, kind, stats

    def wait(self) -> Tensor:
        works, self._works = self._works, []
        for work in works:  # a dead peer becomes a DistributedError
            wait_work(work, f"all-gather ({self._kind})", self._stats, self._kind)
        return self._output


def all_gather_uneven(
    send: Tensor,
    recv_splits: Sequence[int],
    *,
    group: Group | None,
    stats: CommStats | None = None,
    kind: str = "all_gather",
) -> _PeerHandle | AllToAllHandle:
    """Start gathering every rank's 1-D block (sizes may differ) into one tensor, blocks in rank order.

    The one ``send`` tensor goes to every peer by point-to-point sends (no copy per peer), so the memory
    beyond the output is O(block), whatever K; an all-to-all would need the block repeated K times, and
    gloo's all-gather needs equal blocks (padding to the longest). The values are copied, never summed, so
    the result is bit-identical whichever way it travels.

    Args:
        send: this rank's block (recv_splits[rank] elements).
        recv_splits: K element counts, every rank's block size (known to all ranks, e.g. from a counts exchange).

    Shapes:
        send (recv_splits[rank],) -> wait() (sum recv_splits,)
    """
    recv_splits = [int(n) for n in recv_splits]
    rank = group_rank(group)
    if send.numel() != recv_splits[rank]:
        raise ValueError(f"all_gather_uneven: send has {send.numel()} elements but recv_splits[{rank}] is "
                         f"{recv_splits[rank]}")
    output = send.new_empty(sum(recv_splits))
    blocks = output.split(recv_splits)
    blocks[rank].copy_(send)
    if group is None:
        return AllToAllHandle(None, output)
    send = send.contiguous()
    if stats is not None:
        stats.record(kind, send.numel() * send.element_size() * (len(recv_splits) - 1))
    ops = []
    for p, n in enumerate(recv_splits):
        if p == rank:
            continue
        peer = dist.get_global_rank(group, p)
        if send.numel():  # a peer expects nothing from an empty block (it knows the size)
            ops.append(dist.P2POp(dist.isend, send, peer, group))
        if n:
            ops.append(dist.P2POp(dist.irecv, blocks[p], peer, group))
    try:
        works = dist.batch_isend_irecv(ops) if ops else []
    except RuntimeError as err:
        raise DistributedError(f"rank {rank}: could not launch the all-gather ({kind}): "
                               f"{str(err).splitlines()[0]}") from err
    return _PeerHandle(works, output, kind, stats)
