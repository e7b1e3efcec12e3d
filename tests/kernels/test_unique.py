"""``haloflow::padded_unique``'s and ``haloflow::table_unique``'s CPU bodies (packed keys, one ``np.sort``) against
their stock formulas, beyond the op table's rows: batch sizes either side of a power of two, values as wide as the
packing allows, and wider; for ``table_unique`` also the inputs its packing cannot take."""

import pytest
import torch

from haloflow.kernels.unique import both_cpu, both_stock, cpu, stock


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


def _batch(n: int, sizes: list[int], seed: int, dtype=torch.int64):
    """n ids in bags of 0-4 over tables of ``sizes`` rows: (ids, lengths, tables, row_offsets)."""
    g = torch.Generator().manual_seed(seed)
    lengths, tables, total = [], [], 0
    while total < n:
        k = min(int(torch.randint(0, 5, (1,), generator=g)), n - total)
        lengths.append(k), tables.append(int(torch.randint(0, len(sizes), (1,), generator=g)))
        total += k
    ids = torch.cat([torch.randint(0, sizes[t], (k,), generator=g, dtype=dtype) for k, t in zip(lengths, tables)]
                    or [torch.zeros(0, dtype=dtype)])
    offsets = torch.tensor([0, *sizes[:-1]]).cumsum(0)
    return ids, torch.tensor(lengths, dtype=torch.int64), torch.tensor(tables, dtype=torch.int64), offsets


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 1025, 53_248])
def test_rows_and_their_distinct_values_in_one_pass_are_the_stock_integers(n):
    sizes = [7, 1000, 40_000, 3]
    args = (*_batch(n, sizes, seed=n), sum(sizes))
    got, want = both_cpu(*args), both_stock(*args)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
    rows, uniq, inverse = got
    assert torch.equal(uniq[inverse], rows)


def test_inputs_the_packing_cannot_take_give_the_stock_result_or_its_error():
    sizes = [50, 300]
    ids, lengths, tables, offsets = _batch(700, sizes, seed=3)
    wide = (ids, lengths, tables, offsets, 2 ** 62)  # the pad does not pack
    narrow = (ids.int(), lengths, tables, offsets, 350)  # int32 ids
    negative = (ids - 60, lengths, tables, offsets, 350)  # rows below 0
    for args in (wide, narrow, negative):
        got, want = both_cpu(*args), both_stock(*args)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
    bad = tables.clone()
    bad[0] = 2  # no table 2: the stock formula's own error
    with pytest.raises(IndexError):
        both_stock(ids, lengths, bad, offsets, 350)
    with pytest.raises(IndexError):
        both_cpu(ids, lengths, bad, offsets, 350)
