"""CSR @ dense with a precomputed transpose for the backward: ``haloflow::spmm``.

``y = A @ x`` for an ``(R, C)`` CSR matrix ``A`` whose transpose ``A^T`` (also CSR) was built once by the caller
(`haloflow.models.spmm.SparseOperator`), so the backward ``gx = A^T @ gy`` is one more forward-style product
instead of torch's generic sparse autograd (FACTS.md: that backward is 2.5-6x slower)::

    A (R=3, C=4)                      A^T (C=4, R=3)
      row 0: cols [1, 3]  vals [a, b]   row 1: cols [0, 2]  vals [a, c]
      row 2: cols [1]     vals [c]      row 3: cols [0]     vals [b]

    forward   y  = A   @ x     (C, F) -> (R, F)
    backward  gx = A^T @ gy    (R, F) -> (C, F)      the values are constants: no gradient for them

Bodies (``kernel`` picks on the CPU; the stock formula runs everywhere else):

- stock, ``kernel="torch"``: ``torch.sparse.mm`` on a ``torch.sparse_csr`` tensor (MKL on x86 CPU builds).
- CPU, ``kernel="numba"``: rows in parallel (``prange``), one pass over nnz, each entry reads one row of F floats
  of x and accumulates it into the output row (which stays in L1). Cost: nnz x F multiply-adds, nnz x F x 4 bytes.

Measured by ``benchmarks/gcn.py`` (2 threads, 200,000 nodes, 2.2 M entries; 2026-12-02, 7 rounds alternating the
bodies in one process, nothing else running; medians, forward / backward ms)::

    width              16            40             128
    numba          31.3 / 34.9   56.9 / 60.9   133.2 / 133.9
    torch          15.5 / 16.8   40.2 / 41.7   103.7 / 118.2     numba / torch: 1.96 / 1.41 / 1.20 forward

so the default (``DEFAULT_KERNEL`` in ``models/config.py``) is "torch"; the numba gathers are bound by memory
latency, and the two vCPUs share it (28.7 ms at 2 threads against 23.3 at 1, width 16). Both bodies are
deterministic and give the same floats at any thread count (rows are independent; each row is summed in one
order); they differ from each other in the order of a row's sum (tested to float32 rounding).
"""

from __future__ import annotations

import warnings

import torch
from numba import njit, prange

from haloflow.host.threads import follow_torch_threads
from haloflow.kernels._registry import Op, _tracing, register

__all__ = ["spmm"]


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


def stock(x: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, n_cols: int
          ) -> torch.Tensor:
    """``torch.sparse.mm`` of the CSR (indptr, indices, values; (R, n_cols)) and x (n_cols, F) -> (R, F)."""
    with warnings.catch_warnings():  # "sparse CSR support is in beta": known, and covered by our tests
        warnings.simplefilter("ignore", UserWarning)
        a = torch.sparse_csr_tensor(indptr, indices, values, size=(indptr.shape[0] - 1, n_cols),
                                    check_invariants=False)  # validated once by SparseOperator
    return torch.sparse.mm(a, x)


def numba_body(x: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, n_cols: int
               ) -> torch.Tensor:
    """The compiled CPU body (same shapes as `stock`)."""
    out = torch.empty((indptr.shape[0] - 1, x.shape[1]), dtype=x.dtype)  # (R, F)
    if n_cols == 0:
        return out.zero_()
    if x.shape[1] and out.shape[0]:
        follow_torch_threads()
        _csr_spmm_kernel(indptr.numpy(), indices.numpy(), values.numpy(), x.numpy(), out.numpy())
    return out


_SCHEMA_DOC = "x (C, F); A = (indptr, indices, values) (R, C); A^T = (t_indptr, t_indices, t_values) (C, R)"


def _body(x: torch.Tensor, kernel: str):
    """The body ``kernel`` names on the CPU; the stock formula on any other device (the custom op and the eager
    calls alike)."""
    return numba_body if kernel == "numba" and x.device.type == "cpu" else stock


@torch.library.custom_op("haloflow::spmm", mutates_args=())
def _spmm(x: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, t_indptr: torch.Tensor,
          t_indices: torch.Tensor, t_values: torch.Tensor, kernel: str) -> torch.Tensor:
    return stock(x.contiguous(), indptr, indices, values, t_indptr.shape[0] - 1)


@_spmm.register_kernel("cpu")
def _spmm_cpu(x, indptr, indices, values, t_indptr, t_indices, t_values, kernel):
    return _body(x, kernel)(x.contiguous(), indptr, indices, values, t_indptr.shape[0] - 1)


@_spmm.register_fake
def _spmm_fake(x, indptr, indices, values, t_indptr, t_indices, t_values, kernel):
    return x.new_empty((indptr.shape[0] - 1, x.shape[1]))


def _setup(ctx, inputs, output):
    ctx.csr = inputs[1:]


def _backward(ctx, grad):
    indptr, indices, values, t_indptr, t_indices, t_values, kernel = ctx.csr
    gx = _spmm(grad, t_indptr, t_indices, t_values, indptr, indices, values, kernel)  # A^T @ gy: (C, F)
    return gx, None, None, None, None, None, None, None


_spmm.register_autograd(_backward, setup_context=_setup)


class _EagerSpmm(torch.autograd.Function):
    """Eager calls: the custom op's bodies and backward, called directly. Through the custom op a product paid the
    dispatcher's ~30 us and, on its first call, torch's import of ``torch._dynamo`` (its device kernels are
    guarded against torch.compile: ~1.7 s of CPU at a training process's start)."""

    @staticmethod
    def forward(ctx, x, indptr, indices, values, t_indptr, t_indices, t_values, kernel):
        ctx.csr = (indptr, indices, values, t_indptr, t_indices, t_values, kernel)
        return _body(x, kernel)(x.detach().contiguous(), indptr, indices, values, t_indptr.shape[0] - 1)  # (R, F)

    @staticmethod
    def backward(ctx, grad):
        indptr, indices, values, t_indptr, t_indices, t_values, kernel = ctx.csr
        gx = _EagerSpmm.apply(grad, t_indptr, t_indices, t_values, indptr, indices, values, kernel)  # A^T @ gy
        return gx, None, None, None, None, None, None, None


def spmm(x: torch.Tensor, csr: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
         csr_t: tuple[torch.Tensor, torch.Tensor, torch.Tensor], kernel: str = "torch") -> torch.Tensor:
    """``A @ x``, differentiable in x (backward ``A^T @ grad``).

    Args:
        x: (C, F) dense, on the device and of the dtype of the CSR values.
        csr: ``(indptr int64 (R+1,), indices int64 (nnz,), values (nnz,))`` of A, on x's device.
        csr_t: the same of ``A^T`` (C, R).
        kernel: ``"torch"`` (the stock formula) or ``"numba"`` (the compiled CPU body; other devices: stock).

    Shapes:
        x (C, F) -> (R, F).
    """
    if _tracing((x, *csr)):  # torch.compile and friends see ``torch.ops.haloflow.spmm``
        return _spmm(x, *csr, *csr_t, kernel)
    return _EagerSpmm.apply(x, *csr, *csr_t, kernel)


OP = register(Op("spmm", stock=stock, cpu=numba_body, bitwise=frozenset(), custom_op=torch.ops.haloflow.spmm,
                 doc="CSR @ dense, backward by a transpose built once (torch.sparse.mm | numba rows)"))
