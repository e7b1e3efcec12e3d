"""``haloflow::padded_unique``'s CPU body (packed keys, one ``np.sort``) against its stock formula, beyond the
op table's row: batch sizes either side of a power of two, values as wide as the packing allows, and wider."""

import pytest
import torch

from haloflow.kernels.unique import cpu, stock


@pytest.mark.parametrize("n", [0, 1, 2, 1023, 1024, 1025, 53_248])
def test_the_packed_sort_gives_the_stock_integers(n):
    g = torch.Generator().manual_seed(n)
    pad = 3 * n + 7
    x = torch.randint(0, pad, (n,), generator=g)
    for got, want in zip(cpu(x, pad), stock(x, pad)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("pad", [2 ** 51, 2 ** 62])  # 52 bits + 11 for n = 2,000 pack into 63; 63 bits do not
def test_values_as_wide_as_the_packing_allows_and_wider(pad):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(pad - 500, pad, (2000,), generator=g)
    uniq, inverse = cpu(x, pad)
    want = stock(x, pad)
    assert torch.equal(uniq, want[0]) and torch.equal(inverse, want[1])
    assert torch.equal(uniq[inverse], x)


def test_int32_and_negative_values_give_the_stock_result():
    g = torch.Generator().manual_seed(2)
    for x in (torch.randint(0, 300, (700,), generator=g, dtype=torch.int32),
              torch.randint(-50, 300, (700,), generator=g)):
        got, want = cpu(x, 300), stock(x, 300)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
