"""Sparse @ dense products with a fast backward: `SparseOperator`.

An ``(R, C)`` sparse matrix in CSR, with its transpose (``(C, R)``, also CSR) built once at construction, so the
backward of ``y = A @ x`` is one more forward-style SpMM instead of torch's generic sparse autograd (FACTS.md:
that backward is 2.5-6x slower than an SpMM with a precomputed transpose)::

    A (R=3, C=4)                      A^T (C=4, R=3), built once
      row 0: cols [1, 3]  vals [a, b]   row 0: (empty)
      row 1: (empty)                    row 1: cols [0, 2]  vals [a, c]
      row 2: cols [1]     vals [c]      row 2: (empty)
                                        row 3: cols [0]     vals [b]

    forward   y  = A   @ x     (C, F) -> (R, F)
    backward  gx = A^T @ gy    (R, F) -> (C, F)      the values are constants: no gradient for them

The product itself is the op ``haloflow::spmm`` (``haloflow/kernels/spmm.py``): ``kernel="torch"`` is
``torch.sparse.mm`` (the default, and what runs on any device); the other name in ``KERNELS`` is a compiled
row-parallel CPU body; the measurements behind the default are there.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse
import torch

from haloflow.kernels.spmm import spmm
from haloflow.errors import ConfigError
from haloflow.models.config import DEFAULT_KERNEL, KERNELS

__all__ = ["SparseOperator", "KERNELS", "DEFAULT_KERNEL", "csr_transpose"]

def csr_transpose(
    indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR arrays of ``A^T`` (shape ``(C, R)``), column indices sorted inside each row.

    Cost: one counting sort by column, O(nnz + R + C) (scipy's CSR -> CSC conversion, which walks the rows in order,
    so rows stay ascending inside a transposed row). A comparison sort took 8.5 s of 10.5 at 50 M entries.
    """
    n_rows, n_cols = shape
    csc = scipy.sparse.csr_matrix((values, indices, indptr), shape=(n_rows, n_cols), copy=False).tocsc()
    return (csc.indptr.astype(np.int64, copy=False), csc.indices.astype(np.int64, copy=False),
            csc.data.astype(values.dtype, copy=False))


class _CSR:
    """One CSR matrix as int64 / value tensors, copied once per (dtype, device) it is multiplied on."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, shape: tuple[int, int]):
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.int64)
        self.shape = shape
        self._values = np.ascontiguousarray(values)
        self._tensors: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, ...]] = {}

    def values(self, dtype: np.dtype) -> np.ndarray:
        return self._values.astype(dtype, copy=False)

    def tensors(self, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indptr, indices, values) with values in ``dtype``, on ``device`` (copied there once)."""
        key = (dtype, device)
        if key not in self._tensors:
            vals = torch.from_numpy(self._values).to(dtype)
            self._tensors[key] = tuple(t.to(device) for t in (torch.from_numpy(self.indptr),
                                                               torch.from_numpy(self.indices), vals))
        return self._tensors[key]


class SparseOperator:
    """A constant ``(R, C)`` sparse matrix; ``A @ x`` is autograd-aware with backward ``A^T @ grad``.

    Args:
        indptr: int (R+1,) row offsets.
        indices: int (nnz,) column of each entry, in ``[0, C)``.
        values: float (nnz,) entry values (float32 usually; float64 inputs get a float64 copy on first use).
        shape: ``(R, C)``; rectangular is fine (the engine multiplies by ``A_halo`` of shape (n_inner, n_halo)).
        kernel: one of ``KERNELS`` (``haloflow/kernels/spmm.py``); default `DEFAULT_KERNEL`.

    Shapes:
        ``x``: (C, F) -> (R, F), same dtype and device as x (the compiled body runs on the CPU only).

    Cost: building the transpose is O(nnz + C) once; each product is one pass over nnz reading F values per entry.
    """

    def __init__(
        self,
        indptr: np.ndarray,
        indices: np.ndarray,
        values: np.ndarray,
        shape: tuple[int, int],
        *,
        kernel: str = DEFAULT_KERNEL,
    ):
        indptr, indices, values = (np.asarray(a) for a in (indptr, indices, values))
        shape = (int(shape[0]), int(shape[1]))
        _validate(indptr, indices, values, shape, kernel)
        self.shape = shape
        self.kernel = kernel
        self._fwd = _CSR(indptr, indices, values, shape)
        t_indptr, t_indices, t_values = csr_transpose(self._fwd.indptr, self._fwd.indices, values, shape)
        self._bwd = _CSR(t_indptr, t_indices, t_values, (shape[1], shape[0]))

    @property
    def nnz(self) -> int:
        return int(self._fwd.indices.shape[0])

    def __matmul__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[0] != self.shape[1]:
            raise ConfigError(
                f"SparseOperator of shape {self.shape} needs x of shape ({self.shape[1]}, F), got {tuple(x.shape)}"
            )
        csr = self._fwd.tensors(x.dtype, x.device)
        csr_t = self._bwd.tensors(x.dtype, x.device)
        return spmm(x, csr, csr_t, self.kernel)  # (R, F)

    def t_matmul(self, g: torch.Tensor) -> torch.Tensor:
        """``A^T @ g`` (the backward's product), without autograd. Shapes: g (R, F) -> (C, F)."""
        csr = self._fwd.tensors(g.dtype, g.device)
        csr_t = self._bwd.tensors(g.dtype, g.device)
        with torch.no_grad():
            return spmm(g, csr_t, csr, self.kernel)

    def sparse_csr(self, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
        """The matrix as a ``torch.sparse_csr`` tensor (what a plain torch program would multiply by)."""
        indptr, indices, values = self._fwd.tensors(dtype, torch.device(device))
        with warnings.catch_warnings():  # "sparse CSR support is in beta": known
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(indptr, indices, values, size=self.shape)

    def to_dense(self) -> torch.Tensor:
        """The matrix as a dense float64 tensor (for tests and small inputs)."""
        dense = torch.zeros(self.shape, dtype=torch.float64)
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self._fwd.indptr))
        vals = torch.from_numpy(self._fwd.values(np.float64))
        dense.index_put_((torch.from_numpy(rows), torch.from_numpy(self._fwd.indices)), vals, accumulate=True)
        return dense

    def __repr__(self) -> str:
        return f"SparseOperator(shape={self.shape}, nnz={self.nnz:,}, kernel={self.kernel!r})"


def _validate(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, shape: tuple[int, int], kernel: str):
    n_rows, n_cols = shape
    if kernel not in KERNELS:
        raise ConfigError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if n_rows < 0 or n_cols < 0:
        raise ConfigError(f"shape must be non-negative, got {shape}")
    if indptr.ndim != 1 or indptr.shape[0] != n_rows + 1:
        raise ConfigError(f"indptr must have R + 1 = {n_rows + 1} entries for shape {shape}, got {indptr.shape}")
    if indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise ConfigError("indptr must start at 0 and be non-decreasing")
    nnz = int(indptr[-1])
    if indices.shape != (nnz,) or values.shape != (nnz,):
        raise ConfigError(
            f"indptr[-1] = {nnz} entries, but indices has shape {indices.shape} and values {values.shape}"
        )
    if nnz and (int(indices.min()) < 0 or int(indices.max()) >= n_cols):
        bad = int(indices.min()) if int(indices.min()) < 0 else int(indices.max())
        raise ConfigError(f"column index {bad} is out of range: expected columns in [0, {n_cols})")
    if not np.issubdtype(values.dtype, np.floating):
        raise ConfigError(f"values must be floating point, got {values.dtype}")
