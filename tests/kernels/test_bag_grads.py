"""``haloflow::bag_row_grads``' CPU body against its stock formula at a batch's size, bit for bit: the additions in
the occurrences' order (``index_add_``'s on the CPU), also for a gradient that is not contiguous (the backward of
a sum hands one over expanded)."""

import pytest
import torch

from haloflow.kernels.bag_grads import cpu, stock


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_numba_pass_adds_in_the_stock_order(dtype):
    g = torch.Generator().manual_seed(3)
    n, D = 26 * 256, 16
    lengths = torch.randint(0, 4, (n,), generator=g)
    nnz = int(lengths.sum())
    inverse = torch.randint(0, 900, (nnz,), generator=g)  # hot rows: many occurrences each
    grad = torch.randn(n, D, generator=g, dtype=dtype)
    assert torch.equal(cpu(grad, inverse, lengths, 1000), stock(grad, inverse, lengths, 1000))
    expanded = torch.randn(1, D, generator=g, dtype=dtype).expand(n, D)
    assert torch.equal(cpu(expanded, inverse, lengths, 1000), stock(expanded, inverse, lengths, 1000))
