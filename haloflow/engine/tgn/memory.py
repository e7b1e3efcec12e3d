"""TGN node memory and mailbox owned by partition: rows fetched from their owners and written back by all-to-all.

Every node has one owner rank; the owner keeps the node's row in its local ``TGNMemoryState``::

    NodeOwners    owner[v]  rank that holds node v        row[v]  its row in the owner's local state
                  (from a partition folder of the event graph: its bounds and id map, no part loaded;
                   or contiguous blocks of ids)

    fetch(node_ids)                          the rows a rank's part of a batch reads, in node_ids order
      counts      all-to-all: how many rows I ask of each owner (K ints)
      requests    all-to-all: the local row numbers, grouped by owner (int64)
      replies     owners gather their rows, pack each row into bytes (one uint8 tensor of
                  4 (2M + F) + 24 bytes per row: memory, mail_other, mail_feat, last_update, mail_t, mail_eid)
                  and start the all-to-all back -> handle          [the caller samples neighbours meanwhile]
      wait()      unpack and put the rows back in node_ids order -> MemoryRows

    apply(update)                            after the batch's loss: its messages to the owners
      counts, then the packed rows and their local row numbers, by all-to-all; every owner calls
      ``TGNMemoryState.apply`` ONCE with what all ranks sent (the newest event id wins per node), so any split of
      a batch over ranks leaves the same state as one process.

Bytes counted in ``CommStats`` under ``tgn_fetch`` (requests and replies) and ``tgn_apply``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from haloflow.engine.comm import AllToAllHandle, CommStats, Group, all_to_all, group_rank, group_size
from haloflow.errors import ConfigError
from haloflow.models.tgn_memory import MemoryRows, MemoryUpdate, TGNMemoryState

__all__ = ["NodeOwners", "ShardedMemory", "FetchHandle"]


@dataclass(frozen=True, eq=False)
class NodeOwners:
    """Which rank holds each node's memory row, and where.

    Shapes:
        owner int64 (N,) in [0, K);  row int64 (N,): the node's row in its owner's local state;
        counts: K ints, rows per rank.
    """

    owner: np.ndarray
    row: np.ndarray
    counts: tuple[int, ...]

    @property
    def num_parts(self) -> int:
        return len(self.counts)

    @classmethod
    def blocks(cls, num_nodes: int, num_parts: int) -> NodeOwners:
        """Contiguous blocks of node ids, sizes differing by at most one (the default without a partition)."""
        q, r = divmod(num_nodes, num_parts)
        counts = [q + (p < r) for p in range(num_parts)]
        owner = np.repeat(np.arange(num_parts, dtype=np.int64), counts)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        return cls(owner, np.arange(num_nodes, dtype=np.int64) - starts[owner], tuple(counts))

    @classmethod
    def from_partition(cls, folder: str | Path, num_nodes: int) -> NodeOwners:
        """Owners from ``haloflow partition`` of the event graph: node v lives with the part that holds it.

        Reads meta.json and the folder's id map, never a part: part k holds new ids bounds[k] .. bounds[k+1]-1
        in order, so the node with new id g lives with k = searchsorted(bounds, g, side="right") - 1 at row
        g - bounds[k]; the id map gives each new id's original (event stream) id::

            new id g          0  1  2 | 3  4        bounds = [0, 3, 5]: part 0 | part 1
            new_to_orig[g]    4  0  2 | 1  3
            original id v     0  1  2  3  4
            owner[v]          0  1  0  1  0
            row[v]            1  0  2  1  0

        Raises:
            ConfigError: the folder holds nodes the stream does not have, or misses some it has.
            PartitionFormatError: meta.json or the id map is missing or damaged.
        """
        from haloflow.partition.format import load_meta, load_new_to_orig

        meta = load_meta(folder)
        book = meta.book
        orig = np.asarray(load_new_to_orig(folder, meta=meta), dtype=np.int64)  # (N_part,) original id of new id g
        new = np.arange(orig.shape[0], dtype=np.int64)  # (N_part,)
        part = book.owner(new)  # (N_part,) owner of each new id
        too_big = np.flatnonzero(orig >= num_nodes)
        if too_big.size:
            k = int(part[too_big[0]])  # the first part holding a node the stream lacks
            lo, hi = book.part_range(k)
            raise ConfigError(f"{folder}: part {k} holds node {int(orig[lo:hi].max())} but the event stream has "
                              f"{num_nodes:,} nodes; was the folder made from this stream?")
        owner = np.full(num_nodes, -1, dtype=np.int64)
        row = np.zeros(num_nodes, dtype=np.int64)
        owner[orig] = part
        row[orig] = new - book.bounds[part]
        missing = np.flatnonzero(owner < 0)
        if missing.size:
            raise ConfigError(f"{folder}: no part holds node {int(missing[0])} ({missing.size:,} nodes of the stream "
                              f"are missing); partition the event stream itself (haloflow partition EVENTS.csv)")
        return cls(owner, row, tuple(int(c) for c in book.part_sizes()))

    def hosted(self, per_rank: int) -> NodeOwners:
        """The owners of V logical parts merged onto the ranks that host them: rank r holds parts r*per_rank ..
        (r+1)*per_rank - 1 (``LogicalWorkers``' contiguous blocks), their rows one part after another::

            parts (V = 4)   counts (3, 2, 3, 2)      owner[v] = p,      row[v] in part p
            per_rank = 2    counts (5, 5)            owner[v] = p // 2, row[v] + (3 if p is odd else 0)

        The layout only places rows: which rank answers for a node changes nothing a batch computes (rows cross
        the wire as bytes, and ``apply`` picks the newest event's row whoever sent it)."""
        if per_rank == 1:
            return self
        if self.num_parts % per_rank:
            raise ConfigError(f"{self.num_parts} parts cannot be hosted {per_rank} per rank")
        counts = np.asarray(self.counts, dtype=np.int64).reshape(-1, per_rank)  # (K, V/K)
        before = np.concatenate([np.zeros((counts.shape[0], 1), np.int64), np.cumsum(counts, 1)[:, :-1]], 1).ravel()
        return NodeOwners(self.owner // per_rank, self.row + before[self.owner],
                          tuple(int(c) for c in counts.sum(1)))


# ------------------------------------------------------------------------------------------------ packing
_FIELDS = [f.name for f in fields(MemoryRows)]


def _pack(rows: MemoryRows) -> torch.Tensor:
    """(n, bytes) uint8: each row's fields side by side (a row crosses the wire as one block)."""
    n = len(rows)
    cols = []
    for name in _FIELDS:
        t = getattr(rows, name)
        w = t.shape[1] if t.dim() == 2 else 1
        if w:  # (n, 0) fields (no edge features) add no bytes
            cols.append(t.reshape(n, w).contiguous().view(torch.uint8))
    return torch.cat(cols, dim=1)


def _unpack(data: torch.Tensor, like: MemoryRows) -> MemoryRows:
    """Inverse of ``_pack``; ``like`` gives the dtypes and widths (any number of rows)."""
    out, at = {}, 0
    for name in _FIELDS:
        t = getattr(like, name)
        cols = t.shape[1] if t.dim() == 2 else 1
        width = cols * t.element_size()
        if width == 0:
            out[name] = t.new_zeros(data.shape[0], 0)
            continue
        block = torch.empty(data.shape[0], width, dtype=torch.uint8, device=data.device)
        col = block.copy_(data[:, at:at + width]).view(-1).view(t.dtype)  # (n * cols,), aligned: a fresh copy
        out[name] = col.reshape(data.shape[0], cols) if t.dim() == 2 else col
        at += width
    return MemoryRows(**out)


class FetchHandle:
    """Rows in flight; ``wait()`` returns them in the order of the node ids asked for."""

    def __init__(self, reply: AllToAllHandle | None, local: MemoryRows | None, inverse: torch.Tensor,
                 like: MemoryRows, width: int = 0):
        self._reply, self._local, self._inverse, self._like, self._width = reply, local, inverse, like, width

    def wait(self) -> MemoryRows:
        if self._local is not None:  # one process: nothing crossed a wire
            return self._local
        data = self._reply.wait()  # (n, bytes), grouped by owner
        rows = _unpack(data.view(self._inverse.numel(), self._width), self._like)
        return MemoryRows(*(getattr(rows, name)[self._inverse] for name in _FIELDS))


class ShardedMemory:
    """This rank's share of the memory and mailbox, and the exchanges that serve every rank's batches.

    Every rank must call ``fetch`` and ``apply`` the same number of times, in the same order (they are
    collectives), also with nothing to ask or send.
    """

    def __init__(self, owners: NodeOwners, *, memory_dim: int, edge_dim: int, group: Group | None = None,
                 device: torch.device | str = "cpu", stats: CommStats | None = None):
        self.owners, self.group = owners, group
        self.rank, self.world = group_rank(group), group_size(group)
        if owners.num_parts != self.world:
            raise ConfigError(f"the node owners are for {owners.num_parts} parts but {self.world} processes run")
        self.device = torch.device(device)
        self.stats = stats if stats is not None else CommStats()
        self.local = TGNMemoryState(owners.counts[self.rank], memory_dim, edge_dim, device=self.device)
        self._like = self.local.gather(torch.zeros(0, dtype=torch.int64))
        self._owner = torch.from_numpy(owners.owner)
        self._row = torch.from_numpy(owners.row)

    def reset(self) -> None:
        self.local.reset()

    def _split(self, node_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Order grouping ``node_ids`` by owner (stable), their local rows in that order, and counts per owner."""
        ids = node_ids.cpu()
        owner = self._owner[ids]
        order = torch.argsort(owner, stable=True)
        counts = torch.bincount(owner, minlength=self.world).tolist()
        return order, self._row[ids[order]], counts

    def fetch(self, node_ids: torch.Tensor) -> FetchHandle:
        """Start fetching the rows of ``node_ids`` (int64, distinct); the replies travel while the caller works."""
        if self.group is None:
            return FetchHandle(None, self.local.gather(self._row[node_ids.cpu()]), torch.empty(0), self._like)
        order, rows, counts = self._split(node_ids)
        recv_counts = self._exchange_counts(counts)
        # the row numbers travel from the device, as every tensor sent: NCCL moves no host tensors
        asked = all_to_all(rows.to(self.device), counts, recv_counts, group=self.group, stats=self.stats,
                           kind="tgn_fetch").wait()
        reply = _pack(self.local.gather(asked))  # (sum recv, bytes): the rows other ranks asked of me
        width = reply.shape[1]
        handle = all_to_all(reply.reshape(-1), [c * width for c in recv_counts], [c * width for c in counts],
                            group=self.group, stats=self.stats, kind="tgn_fetch")
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel())
        return FetchHandle(handle, None, inverse.to(self.device), self._like, width)

    def apply(self, update: MemoryUpdate) -> None:
        """Send a batch's new rows to their owners; every owner applies what all ranks sent, in one call."""
        if self.group is None:
            self.local.apply(self._row[update.node_ids.cpu()].to(self.device), update.rows)
            return
        order, rows, counts = self._split(update.node_ids)
        recv_counts = self._exchange_counts(counts)
        dev_order = order.to(self.device)
        packed = _pack(MemoryRows(*(getattr(update.rows, name)[dev_order] for name in _FIELDS)))
        width = packed.shape[1]
        h_rows = all_to_all(rows.to(self.device), counts, recv_counts, group=self.group, stats=self.stats,
                            kind="tgn_apply")
        h_data = all_to_all(packed.reshape(-1), [c * width for c in counts], [c * width for c in recv_counts],
                            group=self.group, stats=self.stats, kind="tgn_apply")
        local_rows, data = h_rows.wait(), h_data.wait()
        self.local.apply(local_rows, _unpack(data.view(local_rows.numel(), width), self._like))

    def nothing(self) -> MemoryUpdate:
        """An update of no rows (what a rank whose slices of a batch are all empty sends to ``apply``)."""
        return MemoryUpdate(torch.zeros(0, dtype=torch.int64, device=self.device), self._like)

    def _exchange_counts(self, counts: list[int]) -> list[int]:
        send = torch.tensor(counts, dtype=torch.int64, device=self.device)
        return all_to_all(send, [1] * self.world, [1] * self.world, group=self.group, stats=self.stats,
                          kind="tgn_counts").wait().tolist()

    def gather_all(self) -> TGNMemoryState:
        """The whole state on every rank, rows in global node order (a collective; for checks and saving)."""
        n = self.owners.owner.shape[0]
        full = TGNMemoryState(n, self.local.memory_dim, self.local.edge_dim, device=self.device)
        handle = self.fetch(torch.arange(n))
        rows = handle.wait()
        full.apply(torch.arange(n, device=self.device), rows)
        return full
