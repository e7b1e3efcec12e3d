"""Sparse (categorical) features of a batch in TorchRec's keyed-jagged layout.

Feature-major: all of feature 0's ids for samples 0..B-1, then all of feature 1's, and so on. Each (feature,
sample) pair holds a bag of zero or more ids (one id for Criteo's one-hot features, several for multi-hot)::

    T = 2 features, B = 3 samples

                   sample 0   sample 1   sample 2
    feature 0      [7]        [1, 4]     []            lengths[0] = [1, 2, 0]
    feature 1      [3]        [3]        [9, 2, 5]     lengths[1] = [1, 1, 3]

    lengths (T, B) = [[1, 2, 0],
                      [1, 1, 3]]
    values  (nnz,) = [7, 1, 4, 3, 3, 9, 2, 5]          nnz = lengths.sum() = 8
                      |-f0----| |-f1---------|
    offsets (T*B+1,) = [0, 1, 3, 3, 4, 5, 8]           bag (t, b) = values[offsets[t*B+b] : offsets[t*B+b+1]]
    feature_offsets (T+1,) = [0, 3, 8]                 feature t  = values[feature_offsets[t] : feature_offsets[t+1]]

Splitting a batch for data parallelism cuts every feature's row of ``lengths`` at the same sample boundaries,
so each part is again feature-major (part k holds samples ``starts[k] .. starts[k+1]-1`` of every feature).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from haloflow.errors import ConfigError

__all__ = ["JaggedBatch", "ClickBatch", "split_sizes"]


def split_sizes(batch_size: int, k_parts: int) -> list[int]:
    """Sizes of ``k_parts`` contiguous slices of ``batch_size`` samples: the first ``B % K`` get one extra.

    The same rule as ``torch.tensor_split``, so dense tensors and jagged batches split at the same places.
    """
    if k_parts < 1:
        raise ConfigError(f"k_parts must be >= 1, got {k_parts}")
    q, r = divmod(batch_size, k_parts)
    return [q + 1 if k < r else q for k in range(k_parts)]


@dataclass(frozen=True, eq=False)
class JaggedBatch:
    """Bags of ids per (feature, sample); see the module docstring for the layout.

    Args:
        lengths: int64 (T, B), number of ids of feature t in sample b (>= 0).
        values: int64 (nnz,), the ids, feature-major; ``nnz == lengths.sum()``.

    Shapes:
        lengths (T, B); values (nnz,); offsets() (T*B+1,); feature_offsets() (T+1,)
    """

    lengths: torch.Tensor
    values: torch.Tensor

    def __post_init__(self) -> None:
        if self.lengths.dim() != 2:
            raise ConfigError(f"JaggedBatch.lengths must be 2-D (T, B), got shape {tuple(self.lengths.shape)}")
        if self.values.dim() != 1:
            raise ConfigError(f"JaggedBatch.values must be 1-D (nnz,), got shape {tuple(self.values.shape)}")
        for name, t in (("lengths", self.lengths), ("values", self.values)):
            if t.dtype != torch.int64:
                raise ConfigError(f"JaggedBatch.{name} must be int64, got {t.dtype}")
        if self.lengths.device != self.values.device:
            raise ConfigError(f"JaggedBatch lengths on {self.lengths.device} but values on {self.values.device}")
        # Checking the sum reads every length; on an accelerator that would be a device sync per batch, so the
        # check runs on CPU tensors only (where batches are built).
        if self.lengths.device.type == "cpu":
            nnz = int(self.lengths.sum())
            if nnz != self.values.numel():
                raise ConfigError(f"JaggedBatch: lengths sum to {nnz} but values has {self.values.numel()} ids")
            if self.lengths.numel() and int(self.lengths.min()) < 0:
                raise ConfigError("JaggedBatch.lengths must be >= 0, found a negative length")

    # ------------------------------------------------------------------ sizes
    @property
    def num_features(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[1])

    @property
    def device(self) -> torch.device:
        return self.values.device

    def offsets(self) -> torch.Tensor:
        """Start of every bag in ``values``, feature-major, plus the end: int64 (T*B+1,)."""
        out = torch.zeros(self.lengths.numel() + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(self.lengths.reshape(-1), 0, out=out[1:])
        return out

    def feature_offsets(self) -> torch.Tensor:
        """Start of every feature's ids in ``values``, plus the end: int64 (T+1,)."""
        out = torch.zeros(self.num_features + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(self.lengths.sum(1), 0, out=out[1:])
        return out

    def bag_offsets(self) -> torch.Tensor:
        """Per-feature bag starts relative to the feature's own ids, with the end: int64 (T, B+1).

        Row t is what ``nn.EmbeddingBag(..., include_last_offset=True)`` takes as ``offsets`` for feature t.
        """
        out = torch.zeros(self.num_features, self.batch_size + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(self.lengths, 1, out=out[:, 1:])
        return out

    # ------------------------------------------------------------------ views
    def feature(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feature t alone: ``(lengths_t (B,), values_t (sum lengths_t,))``; values_t is a view."""
        if not 0 <= t < self.num_features:
            raise IndexError(f"feature {t} out of range for a batch of {self.num_features} features")
        bounds = self.feature_offsets().tolist()  # reads T+1 numbers (a sync on an accelerator)
        return self.lengths[t], self.values[bounds[t] : bounds[t + 1]]

    def split_batch(self, k_parts: int | Sequence[int]) -> list[JaggedBatch]:
        """Cut the samples into contiguous slices: ``k_parts`` as a count (sizes from ``split_sizes``) or sizes.

        Part k keeps every feature's bags of its samples, still feature-major. One pass over nnz.
        """
        sizes = split_sizes(self.batch_size, k_parts) if isinstance(k_parts, int) else [int(s) for s in k_parts]
        if sum(sizes) != self.batch_size or min(sizes, default=0) < 0:
            raise ConfigError(f"split sizes {sizes} must be >= 0 and sum to the batch size {self.batch_size}")
        T = self.num_features
        # ids per (feature, part): (T, K); then cut values into T*K consecutive chunks, feature-major.
        per_part = torch.stack([c.sum(1) for c in self.lengths.split(sizes, dim=1)], dim=1)  # (T, K)
        chunks = self.values.split(per_part.reshape(-1).tolist())  # T*K chunks, (t, k) at t*K + k
        K = len(sizes)
        parts = []
        for k, lens in enumerate(self.lengths.split(sizes, dim=1)):
            vals = [chunks[t * K + k] for t in range(T)]
            values = torch.cat(vals) if vals else self.values.new_empty(0)
            parts.append(JaggedBatch(lens.contiguous(), values))
        return parts

    @staticmethod
    def cat(batches: Sequence[JaggedBatch]) -> JaggedBatch:
        """Join batches with the same features along the sample axis (the inverse of ``split_batch``)."""
        if not batches:
            raise ConfigError("JaggedBatch.cat needs at least one batch")
        T = batches[0].num_features
        if any(b.num_features != T for b in batches):
            raise ConfigError(f"JaggedBatch.cat: feature counts differ: {[b.num_features for b in batches]}")
        lengths = torch.cat([b.lengths for b in batches], dim=1)  # (T, sum B)
        per_feature = [b.values.split(b.lengths.sum(1).tolist()) for b in batches]  # [batch][t]
        values = torch.cat([per_feature[i][t] for t in range(T) for i in range(len(batches))])
        return JaggedBatch(lengths, values)

    # ------------------------------------------------------------------ builders
    @staticmethod
    def from_dense(ids: torch.Tensor) -> JaggedBatch:
        """One id per (sample, feature), as in Criteo: ids int (B, T) -> lengths all ones (T, B)."""
        if ids.dim() != 2:
            raise ConfigError(f"from_dense expects ids of shape (B, T), got {tuple(ids.shape)}")
        B, T = ids.shape
        values = ids.t().reshape(-1).to(torch.int64)  # (T*B,) feature-major
        return JaggedBatch(torch.ones(T, B, dtype=torch.int64, device=ids.device), values)

    @staticmethod
    def from_lists(bags: Sequence[Sequence[Sequence[int]]]) -> JaggedBatch:
        """Build from nested lists ``bags[t][b] = [ids...]`` (for tests and small examples)."""
        T = len(bags)
        B = len(bags[0]) if T else 0
        if any(len(f) != B for f in bags):
            raise ConfigError(f"from_lists: every feature needs {B} samples, got {[len(f) for f in bags]}")
        lengths = torch.tensor([[len(bag) for bag in f] for f in bags], dtype=torch.int64).reshape(T, B)
        values = torch.tensor([i for f in bags for bag in f for i in bag], dtype=torch.int64)
        return JaggedBatch(lengths, values)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> JaggedBatch:
        return JaggedBatch(
            self.lengths.to(device, non_blocking=non_blocking), self.values.to(device, non_blocking=non_blocking)
        )

    def pin_memory(self) -> JaggedBatch:
        return JaggedBatch(self.lengths.pin_memory(), self.values.pin_memory())

    def to_lists(self) -> list[list[list[int]]]:
        """The inverse of ``from_lists``: ``[t][b] -> ids``."""
        offs = self.offsets().tolist()
        vals = self.values.tolist()
        B = self.batch_size
        return [[vals[offs[t * B + b] : offs[t * B + b + 1]] for b in range(B)] for t in range(self.num_features)]

    def __repr__(self) -> str:
        return f"JaggedBatch(num_features={self.num_features}, batch_size={self.batch_size}, nnz={self.values.numel()})"


class ClickBatch(NamedTuple):
    """One batch of click data, as the Criteo loader and the synthetic generator yield it.

    Shapes:
        dense float32 (B, num_dense); sparse JaggedBatch lengths (T, B); labels float32 (B,) in {0, 1}
    """

    dense: torch.Tensor
    sparse: JaggedBatch
    labels: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ClickBatch:
        return ClickBatch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
        )

    def split_batch(self, k_parts: int | Sequence[int]) -> list[ClickBatch]:
        """Contiguous sample slices, the same cut for dense, sparse and labels (see ``split_sizes``)."""
        sizes = split_sizes(self.batch_size, k_parts) if isinstance(k_parts, int) else [int(s) for s in k_parts]
        sparse = self.sparse.split_batch(sizes)
        dense = self.dense.split(sizes)
        labels = self.labels.split(sizes)
        return [ClickBatch(d, s, y) for d, s, y in zip(dense, sparse, labels)]
