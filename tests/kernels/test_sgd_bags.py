"""haloflow/kernels/sgd_bags.py: the fused SGD update's bodies against index_add_ and against each other."""

import torch

from haloflow.kernels.sgd_bags import sgd_rows_cpu, sgd_rows_stock, sgd_tables_stock


def test_the_fused_update_off_the_cpu_is_index_add_with_the_same_result():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 20, (60,), generator=g)  # repeated rows
    offsets = torch.tensor([0, 0, 7, 19, 19, 33, 60])  # (B+1,) with empty bags
    grad = torch.randn(6, 3, 4, generator=g, dtype=torch.float64)  # (B, T, D); table t = 1
    w = torch.randn(20, 4, generator=g, dtype=torch.float64)
    a, b = w.clone(), w.clone()
    sgd_rows_cpu(a, ids, offsets, grad, 1, 0.3)
    sgd_rows_stock(b, ids, offsets, grad, 1, 0.3)
    bag = torch.repeat_interleave(torch.arange(6), offsets.diff())
    want = w.index_add(0, ids, grad[bag, 1], alpha=-0.3)
    torch.testing.assert_close(a, want, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(b, want, rtol=0, atol=0)
    assert not torch.equal(a, w)


def test_the_update_of_every_table_at_once_off_the_cpu_equals_one_table_at_a_time():
    """`sgd_tables_stock` (the fused backward off the CPU: one repeat_interleave for all tables, no device sync)
    gives each table exactly what `sgd_rows_stock` gives it alone; run here on CPU tensors, bags empty and repeated."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([[2, 0, 3, 1], [0, 0, 4, 2], [1, 1, 1, 1]])  # (T, B)
    counts = lengths.sum(1).tolist()
    per_table = tuple(torch.randint(0, 9, (c,), generator=g) for c in counts)  # repeated rows
    grad = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)  # (B, T, D)
    weights = tuple(torch.randn(9, 5, generator=g, dtype=torch.float64) for _ in counts)
    want = [w.clone() for w in weights]
    offsets = tuple(torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)]) for n in lengths)
    for t, (w, ids, off) in enumerate(zip(want, per_table, offsets)):
        sgd_rows_stock(w, ids, off, grad, t, 0.2)
    sgd_tables_stock(weights, per_table, offsets, lengths, counts, grad, 0.2)
    for got, w in zip(weights, want):
        torch.testing.assert_close(got, w, rtol=0, atol=0)
