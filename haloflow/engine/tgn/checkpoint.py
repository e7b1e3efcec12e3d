"""TGN's rows in a checkpoint: each rank's memory and mailbox rows, saved by GLOBAL node id.

::

    rank r holds rows of the nodes owners.owner == r, in the order owners.row gives them
    saved:   Piece(table 0, rows (0, N), ids = those nodes' global ids, arrays = memory, last_update, mail_*)
    loaded:  any K' (any partition) reads its own nodes' rows back with ``rows_at(0, its ids, name)``

So a run checkpointed at K resumes at K' with every node's memory where the uninterrupted run has it.
"""

from __future__ import annotations

import numpy as np
import torch

from haloflow.engine.checkpoint import LoadedCheckpoint, Piece
from haloflow.engine.tgn.memory import ShardedMemory

__all__ = ["MEMORY_FIELDS", "owned_ids", "memory_piece", "load_memory"]

MEMORY_FIELDS = ("memory", "last_update", "mail_other", "mail_feat", "mail_t", "mail_eid")


def owned_ids(memory: ShardedMemory, rank: int) -> torch.Tensor:
    """Global ids of ``rank``'s nodes, in the order of its memory rows."""
    owners = memory.owners
    gids = np.nonzero(owners.owner == rank)[0]
    return torch.from_numpy(gids[np.argsort(owners.row[gids], kind="stable")]).long()


def memory_piece(memory: ShardedMemory, rank: int, num_nodes: int) -> Piece:
    """This rank's memory and mailbox rows, keyed by global node id (any partition re-reads them)."""
    local = memory.local
    return Piece(0, (0, num_nodes), (0, local.memory_dim), {name: getattr(local, name) for name in MEMORY_FIELDS},
                 ids=owned_ids(memory, rank))


def load_memory(memory: ShardedMemory, loaded: LoadedCheckpoint, rank: int) -> None:
    """Put this rank's nodes' rows from ``loaded`` into its memory (in place)."""
    gids, local = owned_ids(memory, rank), memory.local
    with torch.no_grad():
        for name in MEMORY_FIELDS:
            getattr(local, name).copy_(loaded.rows_at(0, gids, name).to(local.memory.device))
