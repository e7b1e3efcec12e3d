"""``parallelize_tgn``: make a single-device ``TGN`` one rank's part of a TGN whose node memory is sharded.

Applied in a fixed order (the model itself has no distributed code)::

    1. memory  -> ShardedMemory: node v's memory and mailbox row lives with owners.owner[v] (a partition's part,
                  or a block of ids); rows a rank's batch reads are fetched from their owners by all-to-all, the
                  batch's messages go back to them (``engine/tgn/memory.py``)
    2. weights -> replicas; their gradients summed over the ranks by ``BucketedGradSync`` (reduce-scatter +
                  all-gather in a fixed order, so every replica stays bit-identical)

On a group of one (``group=None``) both are the single-process model: every row is local, the sync a no-op.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from haloflow.engine.comm import CommStats, Group
from haloflow.engine.grad_sync import BucketedGradSync
from haloflow.engine.tgn.memory import NodeOwners, ShardedMemory
from haloflow.models.tgn import TGN

__all__ = ["ParallelTGN", "parallelize_tgn"]


class ParallelTGN(NamedTuple):
    """What `parallelize_tgn` returns: the (unchanged) model, this rank's share of the memory, the gradient sync."""

    model: TGN
    memory: ShardedMemory
    grad_sync: BucketedGradSync


def parallelize_tgn(model: TGN, owners: NodeOwners, group: Group | None = None, *, edge_dim: int,
                    device: torch.device | None = None, stats: CommStats | None = None) -> ParallelTGN:
    """Shard ``model``'s node memory by ``owners`` over ``group`` and sum its gradients over the ranks.

    Every rank calls it together with the same model (same config and seed). ``grad_sync.wait()`` must run between
    ``backward()`` and the optimizer step.
    """
    stats = stats if stats is not None else CommStats()
    device = device if device is not None else next(model.parameters()).device
    # 1. the node memory, owned by partition
    memory = ShardedMemory(owners, memory_dim=model.config.memory_dim, edge_dim=edge_dim, group=group,
                           device=device, stats=stats)
    # 2. replicated weights, gradients summed in buckets
    sync = BucketedGradSync(model.parameters(), group, stats=stats)
    return ParallelTGN(model, memory, sync)
