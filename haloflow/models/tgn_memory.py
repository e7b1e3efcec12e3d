"""TGN's node state as plain tensors: `TGNMemoryState`, the rows it hands out (`MemoryRows`) and takes back
(`MemoryUpdate`).

One row per node; every field is indexed by the same row number, so a partition can own a contiguous block of
rows and answer ``gather`` / ``apply`` for them::

    row v     memory[v]      (M,)   s_v, the node's memory after its last update
              last_update[v]        time of the event that produced s_v (float64; 0 before any)
              mail_other[v]  (M,)   mailbox, "last" aggregator: the one pending message of v, from the
              mail_feat[v]   (F,)   newest event that touched v. Its full form is
              mail_t[v]             [ s_v, s_other, e, phi(mail_t - last_update) ]; s_v is memory[v] itself
              mail_eid[v]           (v's memory does not change while the message waits), so only the rest is
                                    stored. mail_eid = global event id, -1 when the box is empty.

The message is turned into a memory update at the start of the next batch that needs v (`TGN.update_memory`);
the time encoding is applied then, so the encoder gets gradients through the GRU input.

Several writers may send a row for the same node in one batch (two events of the batch touch it, or two ranks
process events that touch it): ``apply``, called once with all of a batch's rows, keeps per node the row with the
largest ``mail_eid`` -- the newest event, which is exactly what the "last" aggregator asks for, whatever the order
the rows arrive in. (Their memories agree: every writer computed s_v from the same stored row.)
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from haloflow.kernels.newest_rows import write_newest
from haloflow.errors import ConfigError

__all__ = ["TGNMemoryState", "MemoryRows", "MemoryUpdate"]


@dataclass(frozen=True, eq=False)
class MemoryRows:
    """Rows of a `TGNMemoryState` for some nodes (what an owner sends to the process that needs them).

    Shapes:
        memory float32 (n, M);  last_update float64 (n,);  mail_other float32 (n, M);  mail_feat float32 (n, F);
        mail_t float64 (n,);  mail_eid int64 (n,).
    """

    memory: torch.Tensor
    last_update: torch.Tensor
    mail_other: torch.Tensor
    mail_feat: torch.Tensor
    mail_t: torch.Tensor
    mail_eid: torch.Tensor

    def __len__(self) -> int:
        return int(self.memory.shape[0])

    def to(self, device: torch.device | str) -> MemoryRows:
        return MemoryRows(*(getattr(self, f.name).to(device) for f in fields(self)))

    @staticmethod
    def cat(parts: list[MemoryRows]) -> MemoryRows:
        """Rows of several senders, one after another (e.g. what an all-to-all brought back)."""
        return MemoryRows(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(MemoryRows)))


@dataclass(frozen=True, eq=False)
class MemoryUpdate:
    """New rows for some nodes after a batch (what goes back to the owners): the memory the batch used, which
    becomes the node's memory, and the node's new message.

    Shapes:
        node_ids int64 (u,) global ids (may repeat);  rows: as `MemoryRows` with n = u.
    """

    node_ids: torch.Tensor
    rows: MemoryRows

    @staticmethod
    def cat(parts: list[MemoryUpdate]) -> MemoryUpdate:
        return MemoryUpdate(torch.cat([p.node_ids for p in parts]), MemoryRows.cat([p.rows for p in parts]))


class TGNMemoryState:
    """The memory and mailbox of ``num_rows`` nodes (row layout in the module docstring), without gradients.

    Single-process, row = global node id. A partition owning global ids ``[lo, hi)`` makes one of ``hi - lo``
    rows and calls ``gather`` / ``apply`` with ``global id - lo``.

    Args:
        num_rows: N, the nodes held.
        memory_dim: M.
        edge_dim: F, the edge-feature columns carried by a message (0 without features).
    """

    def __init__(self, num_rows: int, memory_dim: int, edge_dim: int = 0, *, device: torch.device | str = "cpu"):
        if num_rows < 0 or memory_dim < 1 or edge_dim < 0:
            raise ConfigError(f"TGNMemoryState needs num_rows >= 0, memory_dim >= 1, edge_dim >= 0, got "
                              f"{num_rows}, {memory_dim}, {edge_dim}")
        self.num_rows, self.memory_dim, self.edge_dim = num_rows, memory_dim, edge_dim
        self.memory = torch.zeros(num_rows, memory_dim, device=device)  # (N, M)
        self.last_update = torch.zeros(num_rows, dtype=torch.float64, device=device)  # (N,)
        self.mail_other = torch.zeros(num_rows, memory_dim, device=device)  # (N, M)
        self.mail_feat = torch.zeros(num_rows, edge_dim, device=device)  # (N, F)
        self.mail_t = torch.zeros(num_rows, dtype=torch.float64, device=device)  # (N,)
        self.mail_eid = torch.full((num_rows,), -1, dtype=torch.int64, device=device)  # (N,) -1: empty box

    def reset(self) -> None:
        """Back to the state before any event (TGN resets the memory at the start of every epoch)."""
        for t in (self.memory, self.last_update, self.mail_other, self.mail_feat, self.mail_t):
            t.zero_()
        self.mail_eid.fill_(-1)

    def gather(self, rows: torch.Tensor) -> MemoryRows:
        """Copies of the rows ``rows`` (int64 (n,)): the input of one batch's computation."""
        rows = rows.to(self.memory.device)
        return MemoryRows(self.memory[rows], self.last_update[rows], self.mail_other[rows], self.mail_feat[rows],
                          self.mail_t[rows], self.mail_eid[rows])

    def apply(self, rows: torch.Tensor, update: MemoryRows) -> None:
        """Write one batch's ``update`` into rows ``rows`` (int64 (u,), may repeat); per row the newest
        ``mail_eid`` among the update's rows wins and replaces what was stored.

        All rows of a batch go in ONE call (an owner concatenates what every sender brought, `MemoryUpdate.cat`, in
        any order): a second call for the same batch would overwrite the first whatever its event ids.

        Cost: one sort of u keys and one indexed copy of every field (``kernels.write_newest``).
        """
        if rows.shape != (len(update),):
            raise ConfigError(f"apply: rows must have shape ({len(update)},) like the update, got {tuple(rows.shape)}")
        if update.memory.shape[1:] != (self.memory_dim,) or update.mail_feat.shape[1:] != (self.edge_dim,):
            raise ConfigError(f"apply: rows of width M={self.memory_dim}, F={self.edge_dim} expected, got "
                              f"{tuple(update.memory.shape[1:])} and {tuple(update.mail_feat.shape[1:])}")
        if rows.numel() == 0:
            return
        rows = rows.to(self.memory.device)
        write_newest([getattr(self, name) for name in _FIELDS], rows,
                             [getattr(update, name) for name in _FIELDS], update.mail_eid)

    def clone(self) -> TGNMemoryState:
        """A deep copy (to evaluate from a saved state, or to compare two runs)."""
        out = TGNMemoryState(0, self.memory_dim, self.edge_dim, device=self.memory.device)
        out.num_rows = self.num_rows
        for name in ("memory", "last_update", "mail_other", "mail_feat", "mail_t", "mail_eid"):
            setattr(out, name, getattr(self, name).clone())
        return out

    def __repr__(self) -> str:
        pending = int((self.mail_eid >= 0).sum())
        return (f"TGNMemoryState({self.num_rows:,} rows, M={self.memory_dim}, F={self.edge_dim}, "
                f"{pending:,} pending messages)")


_FIELDS = ("memory", "last_update", "mail_other", "mail_feat", "mail_t", "mail_eid")
