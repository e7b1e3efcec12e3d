import numpy as np
import pytest
import scipy.sparse as sp
import torch

from haloflow.errors import ConfigError
from haloflow.models.spmm import KERNELS, SparseOperator, csr_transpose

# Hand-written (3, 4) matrix:  [[0, 2, 0, -1],
#                               [0, 0, 0,  0],
#                               [3, 0.5, 0, 0]]
INDPTR = np.array([0, 2, 2, 4])
INDICES = np.array([1, 3, 0, 1])
VALUES = np.array([2.0, -1.0, 3.0, 0.5], dtype=np.float32)


def _random_csr(rng, n_rows, n_cols, density, dtype=np.float32):
    a = sp.random(n_rows, n_cols, density=density, format="csr", random_state=rng, dtype=np.float64)
    a.sort_indices()
    return a.indptr, a.indices, a.data.astype(dtype), a.toarray()


@pytest.mark.parametrize("kernel", KERNELS)
def test_hand_written_forward_is_exact(kernel):
    op = SparseOperator(INDPTR, INDICES, VALUES, (3, 4), kernel=kernel)
    x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])
    expected = torch.tensor([[2 * 2.0 - 4.0, 2 * 20.0 - 40.0], [0.0, 0.0], [3.0 + 1.0, 30.0 + 10.0]])
    assert torch.equal(op @ x, expected)


@pytest.mark.parametrize("kernel", KERNELS)
def test_hand_written_backward_is_the_transpose(kernel):
    op = SparseOperator(INDPTR, INDICES, VALUES, (3, 4), kernel=kernel)
    x = torch.zeros(4, 1, requires_grad=True)
    (op @ x).backward(torch.tensor([[1.0], [5.0], [2.0]]))
    # column sums weighted by the upstream gradient: x0 <- 3*2, x1 <- 2*1 + 0.5*2, x2 <- 0, x3 <- -1*1
    assert torch.equal(x.grad, torch.tensor([[6.0], [3.0], [0.0], [-1.0]]))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", [(30, 30), (17, 41), (41, 5)])
def test_random_rectangular_matches_dense(kernel, shape, rng):
    indptr, indices, values, dense = _random_csr(rng, *shape, density=0.2)
    op = SparseOperator(indptr, indices, values, shape, kernel=kernel)
    x = torch.from_numpy(rng.standard_normal((shape[1], 7)).astype(np.float32)).requires_grad_()
    g = torch.from_numpy(rng.standard_normal((shape[0], 7)).astype(np.float32))
    y = op @ x
    y.backward(g)
    d = torch.from_numpy(dense.astype(np.float32))
    torch.testing.assert_close(y, d @ x.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, d.T @ g, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(op.to_dense(), torch.from_numpy(dense.astype(np.float32)).double())


@pytest.mark.parametrize("kernel", KERNELS)
def test_gradcheck_float64(kernel, rng):
    indptr, indices, values, _ = _random_csr(rng, 9, 6, density=0.4, dtype=np.float64)
    op = SparseOperator(indptr, indices, values, (9, 6), kernel=kernel)
    x = torch.from_numpy(rng.standard_normal((6, 3))).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: op @ t, (x,))


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernels_agree_and_empty_operator_gives_zeros(kernel, rng):
    indptr, indices, values, _ = _random_csr(rng, 50, 40, density=0.1)
    x = torch.from_numpy(rng.standard_normal((40, 33)).astype(np.float32))
    ref = SparseOperator(indptr, indices, values, (50, 40), kernel="torch") @ x
    torch.testing.assert_close(SparseOperator(indptr, indices, values, (50, 40), kernel=kernel) @ x, ref)
    empty = SparseOperator(np.zeros(4, dtype=np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), (3, 5),
                           kernel=kernel)
    assert torch.equal(empty @ torch.ones(5, 2), torch.zeros(3, 2))


def test_csr_transpose_matches_scipy(rng):
    indptr, indices, values, dense = _random_csr(rng, 23, 31, density=0.15)
    t_indptr, t_indices, t_values = csr_transpose(indptr, indices, values, (23, 31))
    t = sp.csr_matrix(dense.T)
    t.sort_indices()
    assert np.array_equal(t_indptr, t.indptr)
    assert np.array_equal(t_indices, t.indices)
    assert np.array_equal(t_values, t.data.astype(np.float32))


def test_errors_name_the_problem():
    with pytest.raises(ConfigError, match=r"needs x of shape \(4, F\), got \(3, 2\)"):
        SparseOperator(INDPTR, INDICES, VALUES, (3, 4)) @ torch.ones(3, 2)
    with pytest.raises(ConfigError, match=r"column index 3 is out of range: expected columns in \[0, 3\)"):
        SparseOperator(INDPTR, INDICES, VALUES, (3, 3))
    with pytest.raises(ConfigError, match="indptr must have R \\+ 1 = 5 entries"):
        SparseOperator(INDPTR, INDICES, VALUES, (4, 4))
    with pytest.raises(ConfigError, match="kernel must be one of"):
        SparseOperator(INDPTR, INDICES, VALUES, (3, 4), kernel="cuda")


def test_numba_kernels_leave_torchs_thread_count_alone():
    """numba's OpenMP pool, started by its first parallel kernel, reset the OpenMP thread count torch reads: a
    torchrun rank given OMP_NUM_THREADS=1 then ran torch's ops on every core (seen as 2 ranks x 2 threads)."""
    import os
    import subprocess
    import sys

    code = ("import numpy as np, torch\n"
            "from haloflow.models.spmm import SparseOperator\n"
            "op = SparseOperator(np.array([0, 1, 2]), np.array([1, 0]), np.ones(2, np.float32), (2, 2))\n"
            "op @ torch.ones(2, 3)\n"
            "print(torch.get_num_threads())\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"
