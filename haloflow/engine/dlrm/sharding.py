"""``shard_dlrm``: make a single-device ``DLRM`` this rank's part of a model-parallel DLRM.

Applied in a fixed order (the model itself has no distributed code)::

    1. tables  -> ShardedEmbeddingCollection put in place of ``model.embeddings``: this rank copies its shards'
                  rows (and its data-parallel replicas) out of the model's tables, so every layout starts from
                  the same weights; ``DLRM.forward`` is unchanged - its ``embed_start`` now routes ids,
                  looks up the shards and starts the pooled exchange, and the bottom MLP overlaps it
    2. MLPs    -> replicas (data-parallel); their gradients are summed over the ranks by ``BucketedGradSync``
                  (reduce-scatter + all-gather in fixed order, so every replica stays bit-identical), on a
                  process group of their own

One step on rank r of K, with the global batch of B samples split into contiguous slices::

    logits = model(dense_r, sparse_r, batch_sizes)      # (B_r,)
    loss = dlrm_loss(logits, labels_r, global_batch_size=B)   # sums to the single-process mean over ranks
    loss.backward(); model.finish_grad_sync(); sgd.step()
    (tables in row stores: ... model.finish_grad_sync(); model.embeddings.step(); mlp_optimizer.step())

The MLP gradients use a second process group so that their collectives, started from autograd hooks, can
never interleave differently with the embedding exchanges on different ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from haloflow.data.jagged import JaggedBatch
from haloflow.engine.comm import CommStats, Group
from haloflow.engine.dlrm.shard_stores import ShardStores
from haloflow.engine.dlrm.sharded_embedding import ShardedEmbeddingCollection
from haloflow.engine.grad_sync import BucketedGradSync
from haloflow.models.dlrm import DLRM, DLRMConfig
from haloflow.partition.planner.types import ShardingPlan

__all__ = ["DistributedDLRM", "shard_dlrm", "build_sharded_dlrm"]


class DistributedDLRM(nn.Module):
    """This rank's DLRM: the single-device model with sharded tables in place (build with ``shard_dlrm``).

    Shapes:
        dense (B_r, num_dense), sparse lengths (T, B_r) -> logits (B_r,)
    """

    def __init__(self, model: DLRM, embeddings: ShardedEmbeddingCollection, grad_group: Group | None):
        super().__init__()
        model.embeddings = embeddings  # the swap: DLRM.forward now runs the sharded lookup
        self.model = model
        self.config = model.config
        self.stats = embeddings.stats
        self._dense_sync = BucketedGradSync(model.dense_parameters(), grad_group, stats=self.stats, kind="dense_grad")

    @property
    def embeddings(self) -> ShardedEmbeddingCollection:
        return self.model.embeddings

    @property
    def bottom(self) -> nn.Module:
        return self.model.bottom

    @property
    def top(self) -> nn.Module:
        return self.model.top

    def forward(self, dense: Tensor, sparse: JaggedBatch, batch_sizes: Sequence[int] | None = None) -> Tensor:
        """``DLRM.forward``; ``batch_sizes`` (every rank's B_r) spares the lookup a collective to learn them."""
        self.model.embeddings.batch_sizes = batch_sizes
        return self.model(dense, sparse)

    def dense_parameters(self) -> list[nn.Parameter]:
        return self.model.dense_parameters()

    @property
    def dense_buckets(self) -> list[int]:
        """Element counts of the MLP gradient buckets (what ``predict_step_bytes`` needs)."""
        return self._dense_sync.bucket_sizes if self._dense_sync.group is not None else [
            sum(p.numel() for p in self.dense_parameters())]

    def finish_grad_sync(self) -> None:
        """After backward: sum the data-parallel tables' gradients and wait for the MLP gradient sync."""
        self.embeddings.sync_grads()
        self._dense_sync.wait()

    def to_dlrm(self) -> DLRM:
        """The whole model on every rank (a collective): for checks against the single-process run and saving."""
        full = DLRM(self.config)
        with torch.no_grad():
            for bag, w in zip(full.embeddings.tables, self.embeddings.full_tables()):
                bag.weight.copy_(w)
            full.bottom.load_state_dict(self.bottom.state_dict())
            full.top.load_state_dict(self.top.state_dict())
        return full


def build_sharded_dlrm(config: DLRMConfig, plan: ShardingPlan, group: Group | None, *, dp_grad: str = "sparse",
                       stats: CommStats | None = None, device: torch.device | None = None,
                       stores: ShardStores | None = None) -> DistributedDLRM:
    """This rank's DLRM built from ``config`` and ``plan`` alone: its shards and replicas are initialised in place
    (the values ``DLRM(config)`` would hold in those cells), so no rank ever allocates a table it does not own and
    the plan's per-rank memory is the real one. Every rank calls it together (it creates the MLP gradient group).

    ``stores``: keep the shards in row stores with the optimizer fused (and caches; see ``shard_stores``); then
    ``model.embeddings.step()`` after ``finish_grad_sync()`` updates the tables, and a torch optimizer over
    ``model.parameters()`` sees only the MLPs.
    """
    embeddings = ShardedEmbeddingCollection.from_plan(plan, config.table_sizes, config.embedding_dim,
                                                      seed=config.seed, group=group, dp_grad=dp_grad, stats=stats,
                                                      stores=stores)
    model = DLRM(config, embeddings=embeddings)
    if device is not None:
        model = model.to(device)
    grad_group = None
    if group is not None:
        grad_group = dist.new_group(ranks=dist.get_process_group_ranks(group))
    return DistributedDLRM(model, model.embeddings, grad_group)


def shard_dlrm(model: DLRM, plan: ShardingPlan, group: Group | None, *, dp_grad: str = "sparse",
               stats: CommStats | None = None) -> DistributedDLRM:
    """Shard ``model`` by ``plan`` over ``group`` (None: one process; the plan's world size must then be 1).

    ``model.embeddings`` is replaced by this rank's shards (the model object is reused, not copied). Every rank
    must hold an identical ``model`` (same config and seed) and call this together: it creates the MLP gradient
    group (a collective) when ``group`` is not None.

    Raises:
        PlanError: the plan does not fit the model's tables or the group's size.
    """
    embeddings = ShardedEmbeddingCollection.from_tables(model.embeddings, plan, group=group, dp_grad=dp_grad,
                                                        stats=stats)
    grad_group = None
    if group is not None:
        grad_group = dist.new_group(ranks=dist.get_process_group_ranks(group))
    return DistributedDLRM(model, embeddings, grad_group)
