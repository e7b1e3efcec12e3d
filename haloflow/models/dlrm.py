"""DLRM (Naumov et al., 2019, https://arxiv.org/abs/1906.00091) for one device.

::

    dense (B, 13) --bottom MLP--> z (B, D) ------------------------------+
                                                                         |
    sparse JaggedBatch (T features) --EmbeddingTables--> pooled (B, T, D)|
                                                                         v
                         interaction: [z, e_0 .. e_{T-1}] (B, T+1, D) -> dots of every pair i > j
                                      (B, T(T+1)/2), concatenated after z -> (B, D + T(T+1)/2)
                                                                         |
                                                  top MLP ---> logits (B,)  (sigmoid inside the loss)

Criteo Kaggle configuration (FACTS.md): D = 16, bottom 13-512-256-64-16, top 367-512-256-1, ReLU after every
layer except the last top one. ``367 = 16 + 27*26/2``.

The embedding lookup is split into start and wait (``handle = self.embed_start(sparse); z = bottom(dense);
pooled = handle.wait()``), so that a sharded collection put in place of ``self.embeddings`` can run its
all-to-all while the bottom MLP computes. The local tables return an already-completed handle. No distributed
code lives here: anything that replaces ``embeddings`` only needs ``start(sparse) -> handle`` with ``wait()``.

Shapes:
    dense (B, num_dense) float32; sparse JaggedBatch with lengths (T, B); output logits (B,)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from haloflow.kernels.sgd_bags import fused_sgd_bags
from haloflow.data.criteo import KAGGLE_TABLE_SIZES
from haloflow.data.jagged import JaggedBatch
from haloflow.errors import ConfigError
from haloflow.kernels.interaction import interaction
from haloflow.kernels.keyed_uniform import keyed_uniform_rows

__all__ = [
    "KAGGLE_TABLE_SIZES",
    "DLRMConfig",
    "PooledHandle",
    "CompletedHandle",
    "EmbeddingTables",
    "DLRM",
    "interaction",
    "dlrm_loss",
]


@dataclass(frozen=True, kw_only=True)
class DLRMConfig:
    """Sizes of a DLRM. The defaults are the Criteo Kaggle configuration except ``table_sizes``.

    Args:
        table_sizes: rows per embedding table, one table per sparse feature (26 for Criteo).
        num_dense: dense features per sample (13 for Criteo).
        embedding_dim: D, the width of every table and of the bottom MLP's output.
        bottom_mlp: hidden widths of the bottom MLP; a last layer to ``embedding_dim`` is added.
        top_mlp: hidden widths of the top MLP; a last layer to 1 logit is added.
        seed: seeds the initial weights, so that two processes building the same config hold the same model.
    """

    table_sizes: tuple[int, ...]
    num_dense: int = 13
    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (512, 256, 64)  # 13-512-256-64-16
    top_mlp: tuple[int, ...] = (512, 256)  # 367-512-256-1
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_sizes", tuple(int(s) for s in self.table_sizes))
        object.__setattr__(self, "bottom_mlp", tuple(int(s) for s in self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(int(s) for s in self.top_mlp))
        if not self.table_sizes or min(self.table_sizes) < 1:
            raise ConfigError(f"DLRMConfig.table_sizes must be non-empty positive ints, got {self.table_sizes}")
        for name in ("num_dense", "embedding_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"DLRMConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("bottom_mlp", "top_mlp"):
            if any(w < 1 for w in getattr(self, name)):
                raise ConfigError(f"DLRMConfig.{name} widths must be >= 1, got {getattr(self, name)}")

    @classmethod
    def kaggle(cls, **overrides) -> DLRMConfig:
        """The Criteo Kaggle model (33.8 M embedding rows, 2.2 GB of float32)."""
        return cls(table_sizes=KAGGLE_TABLE_SIZES, **overrides)

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def interaction_dim(self) -> int:
        """Width of the interaction output: D plus one dot per pair of the T+1 vectors (367 for Kaggle)."""
        n = self.num_tables + 1
        return self.embedding_dim + n * (n - 1) // 2


class PooledHandle(Protocol):
    """What ``start`` of an embedding collection returns; ``wait()`` gives pooled (B, T, D)."""

    def wait(self) -> Tensor: ...


class CompletedHandle:
    """A handle whose result is already there (the single-device lookup)."""

    def __init__(self, value: Tensor):
        self._value = value

    def wait(self) -> Tensor:
        return self._value


class EmbeddingTables(nn.Module):
    """One sum-pooled ``nn.EmbeddingBag`` per sparse feature, with sparse gradients.

    Rows start as the reference DLRM's U(-1/sqrt(n), 1/sqrt(n)), drawn by ``keyed_uniform_rows`` from
    (seed, table, row, column): a sharded run builds each shard alone with the very same values.

    ``fused_sgd_lr``: SGD with this learning rate fused into the backward (TorchRec's fused optimizer): each
    table's rows are updated in place as the gradient arrives, ``w[id] -= lr * grad pooled[bag of id]`` per
    occurrence, with no sparse gradient built, coalesced or added by an optimizer; the weights then get no
    ``.grad`` (a ``torch.optim`` optimizer over ``model.parameters()`` skips them). The same floats as
    ``torch.optim.SGD(lr)`` on the sparse gradients in float32 (tested bit for bit: the sparse path also adds one
    occurrence at a time, in the ids' order); in float64 to rounding. Training only (an evaluation, or a forward
    under ``no_grad``, is a plain lookup); one backward per forward; off the CPU the update is ``index_add_``
    (not yet run on a GPU).

    Shapes:
        sparse JaggedBatch lengths (T, B) -> pooled (B, T, D); an empty bag pools to zeros.
    """

    def __init__(self, table_sizes: tuple[int, ...], dim: int, seed: int = 0, *, fused_sgd_lr: float | None = None):
        super().__init__()
        if fused_sgd_lr is not None and not fused_sgd_lr > 0:
            raise ConfigError(f"EmbeddingTables.fused_sgd_lr must be > 0, got {fused_sgd_lr}")
        self.dim, self.fused_sgd_lr = dim, fused_sgd_lr
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(n, dim, mode="sum", sparse=True,
                            _weight=keyed_uniform_rows(seed, t, n, (0, n), (0, dim)))
            for t, n in enumerate(table_sizes)
        )

    def forward(self, sparse: JaggedBatch) -> Tensor:
        T, B = sparse.lengths.shape
        if T != len(self.tables):
            raise ConfigError(f"sparse batch has {T} features but the model has {len(self.tables)} tables")
        # One read of T numbers to cut the values per table (a device sync on an accelerator).
        counts = sparse.lengths.sum(1).tolist()
        if self.fused_sgd_lr is not None and self.training and torch.is_grad_enabled():
            return fused_sgd_bags(sparse.values, sparse.lengths, sparse.bag_offsets(), counts,
                                          self.fused_sgd_lr, [bag.weight for bag in self.tables])
        bag_offsets = sparse.bag_offsets().unbind(0)  # T x (B+1,), each starting at 0
        per_table = sparse.values.split(counts)  # T x (nnz_t,) views
        pooled = [
            F.embedding_bag(ids, bag.weight, offsets, mode="sum", sparse=True, include_last_offset=True)  # (B, D)
            for ids, offsets, bag in zip(per_table, bag_offsets, self.tables)
        ]
        return torch.stack(pooled, dim=1)  # (B, T, D)

    def start(self, sparse: JaggedBatch) -> PooledHandle:
        return CompletedHandle(self(sparse))

    def rectangles(self, replicas: bool = True) -> list:
        """``(table, rows, cols, weight)`` of every table, whole (what checkpoints save and load)."""
        return [(t, (0, bag.weight.shape[0]), (0, bag.weight.shape[1]), bag.weight) for t, bag in enumerate(self.tables)]


def _empty_linear(m: int, n: int) -> nn.Linear:
    """``nn.Linear(m, n)`` with uninitialised parameters: no init run, the global RNG untouched. Built on the meta
    device and given fresh parameters, not ``torch.nn.utils.skip_init``, whose ``to_empty`` goes through
    ``torch._refs`` and imports sympy: 0.35 s of every DLRM process's start-up (2-core Xeon VM, 2026-12-08)."""
    lin = nn.Linear(m, n, device="meta")
    lin.weight = nn.Parameter(torch.empty(n, m))
    lin.bias = nn.Parameter(torch.empty(n))
    return lin


def _mlp(widths: list[int], generator: torch.Generator | None, last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (m, n) in enumerate(zip(widths[:-1], widths[1:])):
        lin = _empty_linear(m, n)  # filled below; leaves the global RNG alone
        with torch.no_grad():
            # Reference DLRM init: W ~ N(0, sqrt(2/(m+n))), b ~ N(0, sqrt(1/n)).
            lin.weight.normal_(0.0, math.sqrt(2.0 / (m + n)), generator=generator)
            lin.bias.normal_(0.0, math.sqrt(1.0 / n), generator=generator)
        layers.append(lin)
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def dlrm_loss(logits: Tensor, labels: Tensor, *, global_batch_size: int | None = None) -> Tensor:
    """Binary cross-entropy with logits, mean over the batch.

    With ``global_batch_size`` the sum is divided by it instead of by the local batch: K ranks each holding a
    slice of one global batch then add up to exactly the single-process mean.
    """
    if global_batch_size is None:
        return F.binary_cross_entropy_with_logits(logits, labels)
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / global_batch_size


def check_fits(config: DLRMConfig, table_elements: int | None = None) -> None:
    """Raise ``ConfigError`` when the float32 tables and MLP weights of ``config`` alone exceed the memory this
    host has free (a table_sizes of 10**12 or an --embedding-dim of 10**9 would otherwise fail in the allocator).

    ``table_elements``: the table cells this process holds (a rank's shards and replicas); None: every table whole.
    """
    from haloflow.utils.memory import available_bytes, format_bytes

    widths = [([config.num_dense, *config.bottom_mlp, config.embedding_dim]),
              ([config.interaction_dim, *config.top_mlp, 1])]
    mlp = sum(a * b + b for w in widths for a, b in zip(w[:-1], w[1:]))
    cells = config.embedding_dim * sum(config.table_sizes) if table_elements is None else table_elements
    need, have = 4 * (cells + mlp), available_bytes()
    if have is not None and need > have:
        held = "" if table_elements is None else f", of which this rank holds {table_elements:,} cells"
        raise ConfigError(f"the model needs at least {format_bytes(need)} ({len(config.table_sizes)} tables of "
                          f"{sum(config.table_sizes):,} rows in all x embedding_dim {config.embedding_dim}{held}, and "
                          f"the MLPs), but this machine has {format_bytes(have)} free: expected smaller tables or "
                          "embedding_dim, or the tables sharded over more ranks (--nproc)", field="embedding_dim")


class DLRM(nn.Module):
    """The DLRM of the module docstring. ``forward(dense, sparse) -> logits (B,)``.

    ``embeddings``: a collection to use instead of building the whole tables (a sharded one holds only this
    rank's rows); anything with ``start(sparse) -> handle``.
    """

    def __init__(self, config: DLRMConfig, embeddings: nn.Module | None = None):
        super().__init__()
        self.config = config
        gen = torch.Generator().manual_seed(config.seed)
        D = config.embedding_dim
        if embeddings is None:  # before any allocation: the whole tables and the MLPs live in this process
            check_fits(config)
        self.bottom = _mlp([config.num_dense, *config.bottom_mlp, D], gen, last_relu=True)
        self.top = _mlp([config.interaction_dim, *config.top_mlp, 1], gen, last_relu=False)
        self.embeddings = embeddings if embeddings is not None else EmbeddingTables(config.table_sizes, D, config.seed)

    def embed_start(self, sparse: JaggedBatch) -> PooledHandle:
        """Start the lookup; whatever sits in ``self.embeddings`` decides whether it runs in the background."""
        return self.embeddings.start(sparse)

    def forward(self, dense: Tensor, sparse: JaggedBatch) -> Tensor:
        handle = self.embed_start(sparse)
        z = self.bottom(dense)  # (B, D), overlaps a sharded lookup's all-to-all
        pooled = handle.wait()  # (B, T, D)
        return self.top(interaction(z, pooled)).squeeze(1)  # (B,)

    def dense_parameters(self) -> list[nn.Parameter]:
        """The MLP weights (dense gradients); the tables' weights get sparse gradients."""
        return [*self.bottom.parameters(), *self.top.parameters()]
