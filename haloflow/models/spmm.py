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

Two kernels compute ``CSR @ dense``:

- ``"numba"``: rows in parallel (``prange``), one pass over nnz, each entry reads one row of F floats of x and
  accumulates it into the output row (which stays in L1). Cost: nnz x F multiply-adds, nnz x F x 4 bytes read.
- ``"torch"``: ``torch.sparse.mm`` on a ``torch.sparse_csr`` tensor (MKL on x86 CPU builds).

Measured by ``benchmarks/gcn.py`` (2 threads, 200,000 nodes, 2.2 M entries; forward ms, best of 3; the 2-core
machine was shared with other jobs, so the absolute numbers moved 2x between runs, the order did not at 40/128):

    width              16      40     128
    numba   run 1    27.4    41.9   128.0      backward (A^T @ G, same kernel): 27.0 / 41.9 / 126.9
    torch   run 1    18.8    51.8   187.5                                       18.1 / 49.8 / 191.9
    numba   run 2    37.7    75.1   208.4
    torch   run 2    55.9   234.5   322.3
    numba   run 3    11.4    40.3   111.2      (quietest run) backward 12.4 / 37.9 / 123.6
    torch   run 3    17.9    55.6   192.4                                     18.1 / 51.1 / 190.2
    torch.sparse.mm autograd backward, run 3:   204 / 204 / 345  (what the transpose built once saves)

Re-measured 2026-12-02 (same graph, 2 threads, 7 rounds alternating the kernels in one process, nothing else
running; medians, forward / backward ms) the order had turned, at every width and with either malloc setting
(``haloflow/_malloc.py``)::

    width              16            40             128
    numba          31.3 / 34.9   56.9 / 60.9   133.2 / 133.9
    torch          15.5 / 16.8   40.2 / 41.7   103.7 / 118.2     numba / torch: 1.96 / 1.41 / 1.20 forward

and ``bench gcn``'s epoch with the torch kernel took 0.83x the numba one's. The numba kernel now runs slower on two
threads than on one (width 16: 28.7 against 23.3 ms; the row gathers are bound by memory latency and the two vCPUs
share it), while MKL's ``mkl_sparse_s_mm`` behind ``torch.sparse.mm`` still gains. So the default
(`DEFAULT_KERNEL`) is "torch"; "numba" stays selectable (``--kernel numba``) and tested. Both are deterministic
and give the same floats at any thread count (rows are independent; each row is summed in one order).
Tensors on another device (CUDA) always use the torch kernel, with the CSR copied there once.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse
import torch
from numba import njit, prange

from haloflow.errors import ConfigError
from haloflow.models.config import DEFAULT_KERNEL, KERNELS
from haloflow.utils.threads import follow_torch_threads

__all__ = ["SparseOperator", "KERNELS", "DEFAULT_KERNEL", "csr_transpose"]

@njit(parallel=True, cache=True)
def _csr_spmm_kernel(indptr, indices, values, x, out):  # pragma: no cover - compiled
    # out[r, :] = sum_j values[j] * x[indices[j], :] for j in row r. Rows are independent: prange over rows.
    # Two entries per step: two independent row gathers in flight hide some of the random-access latency
    # (about 15% faster at width 128 than one entry per step); the output row stays in L1.
    n_rows = indptr.shape[0] - 1
    f = x.shape[1]
    for r in prange(n_rows):
        o = out[r]
        for k in range(f):
            o[k] = 0.0
        j = indptr[r]
        end = indptr[r + 1]
        while j + 1 < end:
            v0 = values[j]
            v1 = values[j + 1]
            x0 = x[indices[j]]
            x1 = x[indices[j + 1]]
            for k in range(f):
                o[k] += v0 * x0[k] + v1 * x1[k]
            j += 2
        if j < end:
            v0 = values[j]
            x0 = x[indices[j]]
            for k in range(f):
                o[k] += v0 * x0[k]


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
    """One CSR matrix in the forms the kernels want, with per-dtype value copies made on first use."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, shape: tuple[int, int]):
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.int64)
        self.shape = shape
        self._values = {np.dtype(values.dtype): np.ascontiguousarray(values)}
        self._torch: dict = {}  # dtype or (dtype, device) -> torch.sparse_csr tensor

    def values(self, dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype not in self._values:
            base = next(iter(self._values.values()))
            self._values[dtype] = base.astype(dtype)
        return self._values[dtype]

    def torch_csr(self, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
        device = torch.device("cpu") if device is None else torch.device(device)
        if device.type != "cpu":
            key = (dtype, device)
            if key not in self._torch:
                self._torch[key] = self.torch_csr(dtype).to(device)  # copied to the device once
            return self._torch[key]
        if dtype not in self._torch:
            vals = torch.from_numpy(self.values(torch.empty((), dtype=dtype).numpy().dtype))
            with warnings.catch_warnings():  # "sparse CSR support is in beta": known, and covered by our tests
                warnings.simplefilter("ignore", UserWarning)
                self._torch[dtype] = torch.sparse_csr_tensor(
                    torch.from_numpy(self.indptr), torch.from_numpy(self.indices), vals, size=self.shape,
                    check_invariants=False,  # validated once in SparseOperator.__init__
                )
        return self._torch[dtype]

    def matmul(self, x: torch.Tensor, kernel: str) -> torch.Tensor:
        x = x.detach().contiguous()  # (C, F); autograd is handled by _SpMM
        if kernel == "torch" or x.device.type != "cpu":
            return torch.sparse.mm(self.torch_csr(x.dtype, x.device), x)  # (R, F)
        out = torch.empty((self.shape[0], x.shape[1]), dtype=x.dtype)  # (R, F)
        if self.shape[1] == 0:
            return out.zero_()
        if x.shape[1] and self.shape[0]:
            _sync_numba_threads()
            _csr_spmm_kernel(self.indptr, self.indices, self.values(x.numpy().dtype), x.numpy(), out.numpy())
        return out


def _sync_numba_threads() -> None:
    follow_torch_threads()  # see haloflow.utils.threads: keeps torchrun's OMP_NUM_THREADS=1 ranks at one core


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op: "SparseOperator", x: torch.Tensor) -> torch.Tensor:
        ctx.op = op
        return op._fwd.matmul(x, op.kernel)  # (R, F)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        op: SparseOperator = ctx.op
        grad_x = op._bwd.matmul(grad_out, op.kernel) if ctx.needs_input_grad[1] else None  # (C, F)
        return None, grad_x


class SparseOperator:
    """A constant ``(R, C)`` sparse matrix; ``A @ x`` is autograd-aware with backward ``A^T @ grad``.

    Args:
        indptr: int (R+1,) row offsets.
        indices: int (nnz,) column of each entry, in ``[0, C)``.
        values: float (nnz,) entry values (float32 usually; float64 inputs get a float64 copy on first use).
        shape: ``(R, C)``; rectangular is fine (the engine multiplies by ``A_halo`` of shape (n_inner, n_halo)).
        kernel: ``"numba"`` or ``"torch"`` (see the module docstring); default `DEFAULT_KERNEL`.

    Shapes:
        ``x``: (C, F) -> (R, F), same dtype and device as x (non-CPU tensors use the torch kernel).

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
        return _SpMM.apply(self, x)

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
