"""Run under torchrun (K ranks): every collective of ``embedding_dist`` against values built by hand.

Rank p's data is a pure function of (p, K), so every rank can build what every peer sends and check what it
received exactly. Exits non-zero on a mismatch; rank 0 prints ``COLLECTIVES OK``.
"""

from __future__ import annotations

import torch

from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.engine.comm import CommStats, all_gather_uneven, all_to_all
from haloflow.engine.dlrm.embedding_dist import (
    jagged_all_to_all,
    pooled_exchange,
    sparse_grad_all_reduce,
)


def lengths_for(src: int, dst: int) -> torch.Tensor:
    return torch.tensor([(src + dst + i) % 3 for i in range(src + 1)], dtype=torch.int64)  # (src+1,) counts


def values_for(src: int, dst: int) -> torch.Tensor:
    n = int(lengths_for(src, dst).sum())
    return 1000 * src + 100 * dst + torch.arange(n)


def main() -> None:
    ctx = init_from_env(timeout_s=60, device="cpu")
    r, K, g = ctx.rank, ctx.world_size, ctx.group
    stats = CommStats()

    # 1. plain all-to-all with uneven splits
    send = torch.cat([torch.full((p + r + 1,), float(10 * r + p)) for p in range(K)])
    got = all_to_all(send, [p + r + 1 for p in range(K)], [r + s + 1 for s in range(K)], group=g).wait()
    want = torch.cat([torch.full((r + s + 1,), float(10 * s + r)) for s in range(K)])
    assert torch.equal(got, want), (got, want)

    # 2. jagged all-to-all: counts first, then values; bytes sent to peers only
    h = jagged_all_to_all([lengths_for(r, d) for d in range(K)], [values_for(r, d) for d in range(K)],
                          [s + 1 for s in range(K)], group=g, stats=stats)
    rec = h.wait()
    assert torch.equal(rec.lengths, torch.cat([lengths_for(s, r) for s in range(K)]))
    assert torch.equal(rec.values, torch.cat([values_for(s, r) for s in range(K)]))
    assert rec.value_splits == [int(lengths_for(s, r).sum()) for s in range(K)]
    peers = [d for d in range(K) if d != r]
    assert stats.bytes["input_lengths"] == 8 * sum(r + 1 for _ in peers)
    assert stats.bytes["input_values"] == 8 * sum(values_for(r, d).numel() for d in peers)

    # 3. pooled exchange as a reduce-scatter: every rank holds partial sums (B_global, 2) of one output
    #    table of width 2; rank r receives the sum over sources of its rows; backward sends the gradient
    #    block to every source.
    sizes = [2 + p for p in range(K)]  # uneven local batches
    Bg = sum(sizes)

    def partial(p):
        return torch.arange(Bg * 2, dtype=torch.float32).view(Bg, 2) * (p + 1)

    x = partial(r).requires_grad_()
    cols = torch.tensor([0, 1] * K)
    out = pooled_exchange(x, sizes, [2] * K, cols, 2, group=g, stats=stats, kind="reduce_scatter").wait()
    lo = sum(sizes[:r])
    want = sum(partial(p) for p in range(K))[lo:lo + sizes[r]]
    torch.testing.assert_close(out, want)
    weight = torch.arange(out.numel(), dtype=torch.float32).view_as(out) + 100 * r
    (out * weight).sum().backward()
    # d/dx[p rows of rank q] = weight on rank q
    want_grad = torch.cat([torch.arange(sizes[q] * 2, dtype=torch.float32).view(sizes[q], 2) + 100 * q
                           for q in range(K)])
    assert torch.equal(x.grad, want_grad), (x.grad, want_grad)
    assert stats.bytes["reduce_scatter"] == 4 * 2 * sum(sizes[q] for q in peers)
    assert stats.bytes["reduce_scatter_grad"] == 4 * 2 * sizes[r] * (K - 1)

    # 4. pooled all-to-all where rank 0 sends nothing (width 0) and output columns come in reversed order
    widths = [0] + [1] * (K - 1)
    y = torch.full((Bg, widths[r]), float(r)).requires_grad_()
    cols = torch.tensor(list(range(K - 2, -1, -1)))  # source s (>= 1) fills column K-1-s
    out = pooled_exchange(y, sizes, widths, cols, K - 1, group=g).wait()
    want = torch.tensor([float(K - 1 - c) for c in range(K - 1)]).expand(sizes[r], K - 1)
    assert torch.equal(out, want), (out, want)
    out.sum().backward()
    assert torch.equal(y.grad, torch.ones(Bg, widths[r]))

    # 5. sparse gradients of a replicated table: the coalesced sum of every rank's rows
    def grad_of(p):
        idx = torch.tensor([[p % 5, 3, p % 5]])
        return torch.sparse_coo_tensor(idx, torch.ones(3, 2) * (p + 1), (5, 2), check_invariants=True)

    summed = sparse_grad_all_reduce([grad_of(r)], group=g, stats=stats).wait()[0]
    want = sum(grad_of(p).to_dense() for p in range(K))
    assert torch.equal(summed.to_dense(), want)
    unique = int(grad_of(r).coalesce().indices().shape[1])
    assert stats.bytes["dp_grad_indices"] == 8 * unique * (K - 1)
    assert stats.bytes["dp_grad_values"] == 4 * 2 * unique * (K - 1)

    # 6. uneven all-gather by point-to-point sends: rank 1's block is empty, every other rank's has r + 2 values
    def block(p):
        return torch.arange(0 if p == 1 else p + 2, dtype=torch.float64) + 10 * p

    got = all_gather_uneven(block(r), [block(p).numel() for p in range(K)], group=g, stats=stats,
                            kind="gather_test").wait()
    assert torch.equal(got, torch.cat([block(p) for p in range(K)])), got
    assert stats.bytes["gather_test"] == 8 * block(r).numel() * (K - 1)

    if r == 0:
        print("COLLECTIVES OK", dict(stats.snapshot()))
    shutdown()


if __name__ == "__main__":
    main()
