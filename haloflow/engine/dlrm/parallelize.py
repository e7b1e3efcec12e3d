"""``parallelize_dlrm``: this rank's DLRM for a ``ShardingPlan``, whatever K (one process is a group of one).

Applied in a fixed order (the model itself has no distributed code)::

    1. tables  -> ShardedEmbeddingCollection in place of ``model.embeddings``: this rank's shards of the plan
                  and its data-parallel replicas, each initialised alone with the values ``DLRM(config)`` holds
                  in those cells (parameters with sparse gradients, or rows in ``stores`` with the optimizer
                  fused); ``DLRM.forward`` is unchanged - its ``embed_start`` now routes ids, looks up the
                  shards and starts the pooled exchange, and the bottom MLP overlaps it
    2. device  -> the MLPs (and the tables' parameters) moved to ``device``, in ``dtype``: before step 3, whose
                  gradient buckets take the parameters' device and type
    3. MLPs    -> replicas (data-parallel); their gradients are summed over the ranks by ``BucketedGradSync``
                  (reduce-scatter + all-gather in fixed order, so every replica stays bit-identical), on a
                  process group of their own, so that their collectives, started from autograd hooks, never
                  interleave differently with the embedding exchanges on different ranks

On a group of one (``group=None``, e.g. ``table_wise_plan(table_sizes, dim, 1)``) every table is one local slot,
the exchanges are local copies and the MLP sync does nothing: the single-process ``DLRM`` (or, with stores, the
``StoreTables`` model), bit for bit. One step on rank r of K, with the global batch of B samples split into
contiguous slices (``split_sizes``)::

    logits = net(dense_r, sparse_r, batch_sizes)              # (B_r,)
    loss = dlrm_loss(logits, labels_r, global_batch_size=B)   # the K losses add up to the global mean
    loss.backward()
    net.finish_step()      # data-parallel tables' gradient sum, MLP gradient sync, row stores' fused update
    mlp_optimizer.step()   # a torch optimizer over net.parameters(): the MLPs, and the tables when not in stores

K ranks compute the floats one process computes, for a fixed V (``engine/logical.py``): the plan is made for V
logical ranks and hosted by the K (a row-wise table's partial sums added in logical-rank order), each MLP layer
gives every sample the bits of its logical worker's slice and sums the weight gradient over the workers by one
tree (the ranks' part of the tree in ``BucketedGradSync``), and a replicated table's rows are coalesced over the
global batch in sample order. Without that (``--no-k-invariance``: V = K) the MLP weight gradients are sums over
samples in an order that depends on K, and once a ReLU input lies within that rounding of zero the runs part by
far more than rounding. ``tests/engine/dlrm/test_exact.py`` holds the equality (K = 1, 2, 4) and the control.
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
from haloflow.engine.logical import sliced_mlp
from haloflow.kernels.interaction import interaction
from haloflow.errors import ConfigError
from haloflow.models.dlrm import DLRM, DLRMConfig, check_fits
from haloflow.partition.planner.types import ShardingPlan

__all__ = ["DistributedDLRM", "parallelize_dlrm", "shard_dlrm"]


class DistributedDLRM(nn.Module):
    """This rank's DLRM: the single-device model with sharded tables in place (``parallelize_dlrm``).

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

    def forward(self, dense: Tensor, sparse: JaggedBatch, batch_sizes: Sequence[int] | None = None,
                slices: Sequence[int] | None = None) -> Tensor:
        """``DLRM.forward``; ``batch_sizes`` (every rank's B_r) spares the lookup a collective to learn them.

        ``slices``: the sizes of this rank's logical workers' slices of its B_r samples (``engine/logical.py``).
        The lookup runs once over all B_r samples (a bag's sum does not depend on the other bags), the
        interaction sample by sample; each MLP layer gives every sample its slice's bits and its weight gradient
        is the tree sum of the slices' gradients (``logical.sliced_mlp``)::

            pooled = lookup(sparse)                                   (B_r, T, D), one exchange
            logits = top(interaction(bottom(dense), pooled))          (B_r,), layers sliced
        """
        model = self.model
        model.embeddings.batch_sizes = batch_sizes
        if slices is None:
            return model(dense, sparse)
        slices = [b for b in slices if b > 0]  # an empty slice (a batch smaller than V) adds nothing
        handle = model.embed_start(sparse)
        z = sliced_mlp(model.bottom, dense, slices)  # (B_r, D), overlaps the lookup
        pooled = handle.wait()  # (B_r, T, D)
        return sliced_mlp(model.top, interaction(z, pooled), slices).squeeze(1)  # (B_r,)

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

    def finish_step(self) -> None:
        """Everything between ``loss.backward()`` and the torch optimizer's step: the gradient syncs
        (``finish_grad_sync``, collectives that wait for every rank), then, when the tables live in row stores,
        their fused update. Parameters' tables are left to the torch optimizer."""
        self.finish_grad_sync()
        if self.embeddings.stores is not None:
            self.embeddings.step()

    def to_dlrm(self) -> DLRM:
        """The whole model on every rank (a collective): for checks against the single-process run and saving."""
        full = DLRM(self.config)
        with torch.no_grad():
            for bag, w in zip(full.embeddings.tables, self.embeddings.full_tables()):
                bag.weight.copy_(w)
            full.bottom.load_state_dict(self.bottom.state_dict())
            full.top.load_state_dict(self.top.state_dict())
        return full


def parallelize_dlrm(config: DLRMConfig, plan: ShardingPlan, group: Group | None, *, dp_grad: str = "sparse",
                     stats: CommStats | None = None, device: torch.device | None = None,
                     stores: ShardStores | None = None, dtype: torch.dtype | None = None,
                     fused_sgd_lr: float | None = None, k_invariant: bool = False) -> DistributedDLRM:
    """This rank's DLRM built from ``config`` and ``plan`` alone, by the steps of the module docstring: no rank
    ever allocates a table it does not own, so the plan's per-rank memory is the real one. Every rank calls it
    together (it creates the MLP gradient group, a collective, when ``group`` is not None).

    Args:
        group: the plan's ranks; None: one process (the plan's world size must then be 1).
        dp_grad: "sparse" or "dense" sum of the data-parallel tables' gradients.
        stats: where the collectives count their bytes (a fresh ``CommStats`` by default).
        device: where the MLPs and the tables' parameters go (row stores use ``stores.device``).
        stores: keep the shards in row stores with the optimizer fused (and caches; see ``shard_stores``); then
            ``finish_step()`` updates the tables, and a torch optimizer over ``parameters()`` sees the MLPs only.
        dtype: floating type of the weights (None: float32); float64 makes the layouts agree far beyond float32
            rounding, for parity checks. Row stores hold float32 rows, so they take no other type.
        fused_sgd_lr: SGD at this rate fused into the backward of this rank's shards (without ``stores``); the
            torch optimizer then steps the MLPs and the data-parallel replicas.
        k_invariant: a ``plan`` for V logical ranks hosted by the K of ``group`` (V / K each) and replicated
            tables' gradients summed in global sample order, so that the floats depend on V only (with
            ``slices`` given to ``forward``; ``engine/logical.py``).

    Raises:
        PlanError: the plan does not fit the tables or the group's size.
        ConfigError: a ``dtype`` other than float32 with ``stores``.
    """
    if stores is not None and dtype not in (None, stores.dtype):
        raise ConfigError(f"the row stores hold {stores.dtype} rows, but dtype {dtype} was asked for: expected "
                          "the stores' dtype (ShardStores(dtype=...)), None, or stores=None", field="dtype")
    # 1. tables: this rank's shards and replicas, built in place (once they fit what this host has free)
    rank = dist.get_rank(group) if group is not None else 0
    per = max(plan.world_size // (dist.get_world_size(group) if group is not None else 1), 1)  # logical per rank
    check_fits(config, sum(s.num_rows * s.num_cols for tp in plan.tables for s in tp.shards if s.rank // per == rank))
    embeddings = ShardedEmbeddingCollection.from_plan(plan, config.table_sizes, config.embedding_dim,
                                                      seed=config.seed, group=group, dp_grad=dp_grad, stats=stats,
                                                      stores=stores, fused_sgd_lr=fused_sgd_lr,
                                                      k_invariant=k_invariant)
    model = DLRM(config, embeddings=embeddings)
    # 2. device and type, before the gradient buckets are laid out
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    # 3. MLP replicas, gradients summed on a group of their own
    return DistributedDLRM(model, model.embeddings, _grad_group(group))


def shard_dlrm(model: DLRM, plan: ShardingPlan, group: Group | None, *, dp_grad: str = "sparse",
               stats: CommStats | None = None) -> DistributedDLRM:
    """Shard an existing ``model`` by ``plan`` over ``group`` (None: one process; the plan's world size must then
    be 1): steps 1 and 3 of the module docstring, the tables copied out of the model's whole tables.

    ``model.embeddings`` is replaced by this rank's shards (the model object is reused, not copied). Every rank
    must hold an identical ``model`` (same config and seed) and call this together.

    Raises:
        PlanError: the plan does not fit the model's tables or the group's size.
    """
    embeddings = ShardedEmbeddingCollection.from_tables(model.embeddings, plan, group=group, dp_grad=dp_grad,
                                                        stats=stats)
    return DistributedDLRM(model, embeddings, _grad_group(group))


def _grad_group(group: Group | None) -> Group | None:
    """A second group of the same ranks for the MLP gradients (a collective); None alone."""
    if group is None:
        return None
    return dist.new_group(ranks=dist.get_process_group_ranks(group))
