"""``shard_dlrm``: turn a single-device ``DLRM`` into this rank's part of a model-parallel DLRM.

Applied in a fixed order (the model itself has no distributed code)::

    1. tables  -> ShardedEmbeddingCollection: this rank copies its shards' rows (and its data-parallel
                  replicas) out of the model's tables, so every layout starts from the same weights
    2. MLPs    -> replicas of bottom and top (data-parallel); their gradients are summed over the ranks by
                  ``BucketedGradSync`` (buckets all-gathered while backward runs, summed in rank order, so
                  every replica stays bit-identical), on a process group of their own
    3. forward =  embed start (ids all-to-all, lookups, pooled exchange started)
                  -> bottom MLP (overlaps the exchange) -> wait -> interaction -> top MLP

One step on rank r of K, with the global batch of B samples split into contiguous slices::

    logits = model(dense_r, sparse_r, batch_sizes)      # (B_r,)
    loss = dlrm_loss(logits, labels_r, global_batch_size=B)   # sums to the single-process mean over ranks
    loss.backward(); model.finish_grad_sync(); sgd.step()

The MLP gradients use a second process group so that their collectives, started from autograd hooks, can
never interleave differently with the embedding exchanges on different ranks.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from haloflow.data.jagged import JaggedBatch
from haloflow.engine import halo
from haloflow.engine.embedding_dist import CommStats, Group
from haloflow.engine.grad_sync import BucketedGradSync
from haloflow.engine.sharded_embedding import ShardedEmbeddingCollection, ShardedPooledHandle
from haloflow.models.dlrm import DLRM, interaction
from haloflow.partition.planner.types import ShardingPlan

__all__ = ["DistributedDLRM", "shard_dlrm"]


class DistributedDLRM(nn.Module):
    """This rank's DLRM: sharded tables plus MLP replicas (build with ``shard_dlrm``).

    Shapes:
        dense (B_r, num_dense), sparse lengths (T, B_r) -> logits (B_r,)
    """

    def __init__(self, model: DLRM, embeddings: ShardedEmbeddingCollection, grad_group: Group | None):
        super().__init__()
        self.config = model.config
        self.embeddings = embeddings
        self.bottom = copy.deepcopy(model.bottom)
        self.top = copy.deepcopy(model.top)
        self.stats = embeddings.stats
        self._grad_stats = halo.CommStats()
        self._dense_sync = BucketedGradSync(self.dense_parameters(), grad_group, stats=self._grad_stats)

    def embed_start(self, sparse: JaggedBatch, batch_sizes: Sequence[int] | None = None) -> ShardedPooledHandle:
        return self.embeddings.start(sparse, batch_sizes)

    def forward(self, dense: Tensor, sparse: JaggedBatch, batch_sizes: Sequence[int] | None = None) -> Tensor:
        handle = self.embed_start(sparse, batch_sizes)  # ids routed, shards looked up, exchange started
        z = self.bottom(dense)  # (B_r, D), while the pooled vectors travel
        pooled = handle.wait()  # (B_r, T, D)
        return self.top(interaction(z, pooled)).squeeze(1)  # (B_r,)

    def dense_parameters(self) -> list[nn.Parameter]:
        return [*self.bottom.parameters(), *self.top.parameters()]

    def finish_grad_sync(self) -> None:
        """After backward: wait for the MLP all-reduces and sum the data-parallel tables' gradients."""
        self.embeddings.sync_grads()
        self._dense_sync.wait()
        if self._grad_stats.grad_bytes:
            self.stats.record("dense_grad", self._grad_stats.grad_bytes)  # sent to the K-1 peers
            self._grad_stats.reset()

    def to_dlrm(self) -> DLRM:
        """The whole model on every rank (a collective): for checks against the single-process run and saving."""
        full = DLRM(self.config)
        with torch.no_grad():
            for bag, w in zip(full.embeddings.tables, self.embeddings.full_tables()):
                bag.weight.copy_(w)
            full.bottom.load_state_dict(self.bottom.state_dict())
            full.top.load_state_dict(self.top.state_dict())
        return full


def shard_dlrm(model: DLRM, plan: ShardingPlan, group: Group | None, *, dp_grad: str = "sparse",
               stats: CommStats | None = None) -> DistributedDLRM:
    """Shard ``model`` by ``plan`` over ``group`` (None: one process; the plan's world size must then be 1).

    Every rank must hold an identical ``model`` (same config and seed) and call this together: it creates
    the MLP gradient group (a collective) when ``group`` is not None.

    Raises:
        PlanError: the plan does not fit the model's tables or the group's size.
    """
    embeddings = ShardedEmbeddingCollection.from_tables(model.embeddings, plan, group=group, dp_grad=dp_grad,
                                                        stats=stats)
    grad_group = None
    if group is not None:
        grad_group = dist.new_group(ranks=dist.get_process_group_ranks(group))
    return DistributedDLRM(model, embeddings, grad_group)
