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

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit
from torch import Tensor, nn

from haloflow.data.criteo import KAGGLE_TABLE_SIZES
from haloflow.data.jagged import JaggedBatch
from haloflow.errors import ConfigError
from haloflow.models.keyed_init import keyed_uniform_rows

__all__ = [
    "KAGGLE_TABLE_SIZES",
    "DLRMConfig",
    "PooledHandle",
    "CompletedHandle",
    "EmbeddingTables",
    "DLRM",
    "interaction",
    "dlrm_loss",
    "fused_sgd_bag",
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
            return _FusedSGDBags.apply(sparse, counts, self.fused_sgd_lr, *(bag.weight for bag in self.tables))
        bag_offsets = sparse.bag_offsets().unbind(0)  # T x (B+1,), each starting at 0
        per_table = sparse.values.split(counts)  # T x (nnz_t,) views
        pooled = [
            F.embedding_bag(ids, bag.weight, offsets, mode="sum", sparse=True, include_last_offset=True)  # (B, D)
            for ids, offsets, bag in zip(per_table, bag_offsets, self.tables)
        ]
        return torch.stack(pooled, dim=1)  # (B, T, D)

    def start(self, sparse: JaggedBatch) -> PooledHandle:
        return CompletedHandle(self(sparse))


class _FusedSGDBags(torch.autograd.Function):
    """Sum-pooled lookups of every table; the backward applies SGD to the rows in place and returns no gradient
    for the weights (see ``EmbeddingTables.fused_sgd_lr``). One function for all T tables rather than T
    ``fused_sgd_bag`` calls stacked: those get their gradients as strided slices of the stack's, copied per table
    (measured 1.07x against this 1.16x plain at full Kaggle, batch 2,048)."""

    @staticmethod
    def forward(ctx, sparse: JaggedBatch, counts: list[int], lr: float, *weights: Tensor) -> Tensor:
        T, B = sparse.lengths.shape
        per_table = sparse.values.split(counts)  # T x (nnz_t,)
        offsets = sparse.bag_offsets().unbind(0)  # T x (B+1,)
        pooled = torch.stack([F.embedding_bag(ids, w, off, mode="sum", include_last_offset=True)
                              for ids, off, w in zip(per_table, offsets, weights)], dim=1)  # (B, T, D)
        ctx.per_table, ctx.offsets, ctx.lr, ctx.weights = per_table, offsets, lr, weights
        ctx.lengths, ctx.counts = sparse.lengths, counts
        return pooled

    @staticmethod
    def backward(ctx, grad: Tensor):
        T = len(ctx.weights)
        grad = grad.contiguous()  # (B, T, D)
        if grad.device.type == "cpu":
            for t, (w, ids, off) in enumerate(zip(ctx.weights, ctx.per_table, ctx.offsets)):
                _apply_sgd(w, ids, off, grad, t, ctx.lr)
        else:
            _apply_sgd_tables(ctx.weights, ctx.per_table, ctx.lengths, ctx.counts, grad, ctx.lr)
        ctx.weights = ctx.per_table = ctx.offsets = ctx.lengths = None
        return (None, None, None, *([None] * T))


def _apply_sgd_tables(weights: tuple[Tensor, ...], per_table: tuple[Tensor, ...], lengths: Tensor, counts: list[int],
                      grad: Tensor, lr: float) -> None:
    """Every table's ``_apply_sgd`` by ``index_add_``, with the bag of every id found once for all T tables (one
    ``repeat_interleave`` whose size is known on the host: no device sync; was one sync per table, and on an H200
    the fused step ran at 0.61x plain PyTorch's).

    Shapes: lengths (T, B); per_table T x (nnz_t,) with nnz_t = counts[t]; grad (B, T, D)."""
    T, B = lengths.shape
    with torch.no_grad():
        bags = torch.arange(B, device=grad.device).repeat(T).repeat_interleave(
            lengths.reshape(-1), output_size=sum(counts))  # (nnz,) bag of every id, table after table
        for t, (w, ids, bag) in enumerate(zip(weights, per_table, bags.split(counts))):
            w.index_add_(0, ids, grad[:, t].index_select(0, bag), alpha=-lr)


def fused_sgd_bag(ids: Tensor, offsets: Tensor, weight: Tensor, lr: float) -> Tensor:
    """Sum-pooled bags of one table with SGD fused into the backward (see ``EmbeddingTables.fused_sgd_lr``): the
    rows of ``weight`` are updated in place when the gradient arrives, and ``weight`` gets no ``.grad``.

    Shapes:
        ids int64 (nnz,), offsets int64 (B+1,) (bag bounds, the last one the end), weight (N, D) -> (B, D)
    """
    return _FusedSGDBag.apply(ids, offsets, lr, weight)


class _FusedSGDBag(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: Tensor, offsets: Tensor, lr: float, weight: Tensor) -> Tensor:
        ctx.ids, ctx.offsets, ctx.lr, ctx.weight = ids, offsets, lr, weight
        return F.embedding_bag(ids, weight, offsets, mode="sum", include_last_offset=True)  # (B, D)

    @staticmethod
    def backward(ctx, grad: Tensor):
        _apply_sgd(ctx.weight, ctx.ids, ctx.offsets, grad.unsqueeze(1), 0, ctx.lr)
        ctx.weight = ctx.ids = ctx.offsets = None
        return None, None, None, None


def _apply_sgd(weight: Tensor, ids: Tensor, offsets: Tensor, grad: Tensor, t: int, lr: float, *,
               compiled: bool | None = None) -> None:
    """weight[ids in bag b] -= lr * grad[b, t], one occurrence at a time, in place. grad (B, T, D).
    ``compiled``: the numba loop (default on the CPU) or ``index_add_`` (any device; the tests run both)."""
    with torch.no_grad():
        if compiled if compiled is not None else grad.device.type == "cpu":  # no (nnz, D) gradient rows built
            w = weight.detach().numpy()
            _sgd_rows(w, ids.numpy(), offsets.numpy(), grad.contiguous().numpy(), t, float(w.dtype.type(-lr)))
        else:
            bag = torch.repeat_interleave(torch.arange(offsets.numel() - 1, device=grad.device), offsets.diff(),
                                          output_size=ids.numel())  # the size known here: no device sync
            weight.index_add_(0, ids, grad[:, t].index_select(0, bag), alpha=-lr)


@njit(cache=True)
def _sgd_rows(w, ids, offsets, grad, t, alpha):  # pragma: no cover - compiled
    """w[ids[k]] += alpha * grad[b, t] for every id k of bag b (offsets (B+1,)), in the ids' order: the additions
    of torch's sparse SGD update, one occurrence at a time. Torch adds with a fused multiply-add (one rounding);
    here the product and sum are taken in float64 and rounded once to w's type (``alpha``: -lr in w's type, as a
    float), which gives the same float32 but in rare double-rounding ties."""
    D = w.shape[1]
    for b in range(offsets.shape[0] - 1):
        for k in range(offsets[b], offsets[b + 1]):
            r = ids[k]
            for d in range(D):
                w[r, d] = np.float64(w[r, d]) + alpha * np.float64(grad[b, t, d])


def _mlp(widths: list[int], generator: torch.Generator | None, last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (m, n) in enumerate(zip(widths[:-1], widths[1:])):
        lin = torch.nn.utils.skip_init(nn.Linear, m, n)  # filled below; leaves the global RNG alone
        with torch.no_grad():
            # Reference DLRM init: W ~ N(0, sqrt(2/(m+n))), b ~ N(0, sqrt(1/n)).
            lin.weight.normal_(0.0, math.sqrt(2.0 / (m + n)), generator=generator)
            lin.bias.normal_(0.0, math.sqrt(1.0 / n), generator=generator)
        layers.append(lin)
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def interaction(z: Tensor, pooled: Tensor) -> Tensor:
    """Dot-product interaction without self pairs, in the reference order (row i > column j, row-major).

    Shapes:
        z (B, D), pooled (B, T, D) -> (B, D + (T+1)T/2): ``[z, <v_i, v_j> for i in 1..T for j in 0..i-1]``
        where v_0 = z and v_i = pooled[:, i-1].

    The same dots as ``torch.bmm(v, v.transpose(1, 2))[:, li, lj]``; the backward differs from autograd's for
    that expression in how the pairs' gradients reach G (B, T+1, T+1): one ``index_copy_`` into the strictly lower
    triangle, where autograd's scattered them with an accumulating ``index_put`` (2.6 ms of a 45 ms Kaggle step at
    batch 2,048, the interaction's largest part); then ``grad v = G v + G^T v`` as autograd computes it.
    """
    B, T, D = pooled.shape
    return _Interaction.apply(z, pooled, _pair_index(T + 1, z.device))


_PAIRS: dict[tuple[int, str], Tensor] = {}


def _pair_index(n: int, device: torch.device) -> Tensor:
    """Flat positions i * n + j of the pairs i > j of an (n, n) matrix, in row-major order (cached)."""
    key = (n, str(device))
    if key not in _PAIRS:
        li, lj = torch.tril_indices(n, n, offset=-1, device=device)
        _PAIRS[key] = li * n + lj
    return _PAIRS[key]


class _Interaction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor, pooled: Tensor, flat: Tensor) -> Tensor:
        B, T, D = pooled.shape
        v = torch.cat([z.unsqueeze(1), pooled], dim=1)  # (B, n, D), n = T + 1
        dots = torch.bmm(v, v.transpose(1, 2)).view(B, -1)  # (B, n * n)
        out = torch.empty((B, D + flat.numel()), dtype=z.dtype, device=z.device)
        out[:, :D] = z
        out[:, D:] = dots.index_select(1, flat)
        ctx.save_for_backward(v, flat)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        v, flat = ctx.saved_tensors  # (B, n, D), (P,)
        B, n, D = v.shape
        g = torch.zeros((B, n * n), dtype=grad.dtype, device=grad.device)
        g.index_copy_(1, flat, grad[:, D:])  # strictly lower triangle
        g = g.view(B, n, n)
        grad_v = torch.baddbmm(torch.bmm(g, v), g.transpose(1, 2), v)  # (G + G^T) v, (B, n, D)
        grad_z = grad_v[:, 0] + grad[:, :D]
        return grad_z, grad_v[:, 1:], None


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
