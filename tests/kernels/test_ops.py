"""One table over every op in ``haloflow.kernels``: each body against the stock formula (bit for bit where the op
says so), the CPU body at 1 and 2 threads, ``torch.library.opcheck`` of the custom ops, gradcheck of the stock
formula in float64, and the GPU bodies in Triton's interpreter on CPU tensors.

A new op is one file in ``haloflow/kernels/`` and one row in `CASES` here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np
import pytest
import scipy.sparse
import torch

from haloflow import kernels
from haloflow.kernels import attend as attend_mod
from haloflow.kernels import cos_encode as cos_mod
from haloflow.kernels import gru_gates as gru_mod
from haloflow.kernels import interaction as inter_mod
from haloflow.kernels import keyed_dropout as drop_mod

OPS = kernels.registry()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------ inputs
def _csr(dtype, seed=0, shape=(50, 40), density=0.15):
    rng = np.random.default_rng(seed)
    a = scipy.sparse.random(*shape, density=density, format="csr", random_state=rng, dtype=np.float64)
    a.sort_indices()
    t = a.T.tocsr()
    t.sort_indices()
    as_t = lambda m: (torch.from_numpy(m.indptr.astype(np.int64)), torch.from_numpy(m.indices.astype(np.int64)),
                      torch.from_numpy(m.data).to(dtype))
    return as_t(a), as_t(t), a.shape


def _small(dtype) -> bool:
    """float64 inputs serve the gradchecks (a Jacobian column per input element): kept small."""
    return dtype == torch.float64


def spmm_inputs(dtype):
    (ip, ix, v), _, (r, c) = _csr(dtype)
    x = torch.randn(c, 3 if _small(dtype) else 16, generator=_gen(1), dtype=dtype)
    return (x, ip, ix, v, c)


def spmm_op_args(dtype):
    csr, csr_t, (r, c) = _csr(dtype)
    x = torch.randn(c, 3 if _small(dtype) else 16, generator=_gen(1), dtype=dtype)
    return (x, *csr, *csr_t, "torch")


def dropout_inputs(dtype, relu=False):
    n, f = (12, 7) if _small(dtype) else (64, 37)
    h = torch.randn(n, f, generator=_gen(2), dtype=dtype)
    ids = torch.randint(0, 10**12, (n,), generator=_gen(3))
    return (h, ids, drop_mod.base_key(3, 7, 1), drop_mod.threshold(0.3), 1 / 0.7, relu, True)


def masked_scale_inputs(dtype):
    g = torch.randn(64, 37, generator=_gen(4), dtype=dtype)
    mask = (torch.rand(64, 37, generator=_gen(5)) < 0.6).to(torch.uint8)
    return (g, mask, 1 / 0.6)


def _time(dtype, n=300, d=50):
    n, d = (40, 6) if _small(dtype) else (n, d)
    w = torch.from_numpy(1.0 / 10.0 ** np.linspace(0, 9, d)).to(dtype)
    b = torch.randn(d, generator=_gen(6), dtype=dtype) * 0.3
    # float32: gaps up to ~8 hours in seconds (|a| up to 3e4, the compiled reduction's range); float64 (the stock
    # formula's gradcheck): small, so that central differences of cos(dt w) are accurate
    dt = (torch.rand(n, generator=_gen(7), dtype=dtype) ** 3 * (3e4 if dtype == torch.float32 else 30.0))
    mask = torch.rand(n, generator=_gen(8)) < 0.7
    return dt, w, b, mask


def cos_inputs(dtype):
    dt, w, b, mask = _time(dtype)
    return (dt, w, b, mask, True)


def cos_backward_inputs(dtype):
    dt, w, b, mask = _time(dtype)
    _, sin_a = cos_mod.stock(dt, w, b, mask, True)
    grad = torch.randn(dt.shape[0], w.shape[0], generator=_gen(9), dtype=dtype)
    return (dt, w, sin_a, mask, grad, True)


def _attention(dtype, q_n=20, h=2, k=5, n=15, m=6, f=3, t=4):
    qk = torch.randn(q_n, h, m + f + t, generator=_gen(10), dtype=dtype)
    mem = torch.randn(n, m, generator=_gen(11), dtype=dtype)
    phi = torch.randn(q_n, k, t, generator=_gen(12), dtype=dtype)
    rows = torch.randint(0, n, (q_n, k), generator=_gen(13))
    feat = torch.randn(q_n, k, f, generator=_gen(14), dtype=dtype)
    mask = torch.rand(q_n, k, generator=_gen(15)) < 0.7
    mask[0] = False  # a query without neighbours
    rows = rows.masked_fill(~mask, 0)
    mult = (torch.rand(q_n, h, k, generator=_gen(16)) < 0.8).to(dtype) / 0.8
    return qk, mem, phi, rows, feat, mask, mult


def attend_inputs(dtype):
    return _attention(dtype)


def attend_backward_inputs(dtype):
    args = _attention(dtype)
    p, pd, _ = attend_mod.stock(*args)
    g_pd = torch.randn(pd.shape, generator=_gen(17), dtype=dtype)
    g_xbar = torch.randn(args[0].shape, generator=_gen(18), dtype=dtype)
    return (*args, p, pd, g_pd, g_xbar, True)


def _gru(dtype, n=40, m=12):
    n, m = (8, 3) if _small(dtype) else (n, m)
    g = lambda s, *shape: torch.randn(*shape, generator=_gen(s), dtype=dtype)
    return g(19, n, 3 * m), g(20, n, 4 * m), g(21, m), g(22, n, m)


def gru_inputs(dtype):
    return _gru(dtype)


def gru_backward_inputs(dtype):
    xp, hp, b_gh, h = _gru(dtype)
    _, rz, n, gh_n = gru_mod.stock(xp, hp, b_gh, h)
    return (torch.randn(h.shape, generator=_gen(23), dtype=dtype), rz, n, gh_n, h)


def interaction_inputs(dtype):
    z = torch.randn(8, 4, generator=_gen(24), dtype=dtype)
    pooled = torch.randn(8, 5, 4, generator=_gen(25), dtype=dtype)
    return (z, pooled, inter_mod.pair_index(6, z.device))


def interaction_backward_inputs(dtype):
    z, pooled, flat = interaction_inputs(dtype)
    out, v = inter_mod.stock(z, pooled, flat)
    return (torch.randn(out.shape, generator=_gen(26), dtype=dtype), v, flat)


def _bags(seed, n_rows=30, batch=6, max_len=4):
    lengths = torch.randint(0, max_len + 1, (batch,), generator=_gen(seed))
    ids = torch.randint(0, n_rows, (int(lengths.sum()),), generator=_gen(seed + 1))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return ids, offsets, lengths


def sgd_rows_inputs(dtype):
    ids, offsets, _ = _bags(27)
    weight = torch.randn(30, 4, generator=_gen(29), dtype=dtype)
    grad = torch.randn(6, 2, 4, generator=_gen(30), dtype=dtype)
    return (weight, ids, offsets, grad, 1, 0.1)


def sgd_tables_inputs(dtype):
    tables = [_bags(31 + 2 * t) for t in range(3)]
    weights = tuple(torch.randn(30, 4, generator=_gen(40 + t), dtype=dtype) for t in range(3))
    lengths = torch.stack([lens for _, _, lens in tables])  # (T, B)
    grad = torch.randn(6, 3, 4, generator=_gen(44), dtype=dtype)
    return (weights, tuple(ids for ids, _, _ in tables), tuple(off for _, off, _ in tables), lengths,
            [int(lens.sum()) for _, _, lens in tables], grad, 0.1)


def newest_inputs(dtype):
    n, u = 20, 30
    state = [torch.randn(n, 5, generator=_gen(45), dtype=dtype), torch.zeros(n, dtype=torch.float64),
             torch.randn(n, 5, generator=_gen(46), dtype=dtype), torch.randn(n, 2, generator=_gen(47), dtype=dtype),
             torch.zeros(n, dtype=torch.float64), torch.full((n,), -1, dtype=torch.int64)]
    rows = torch.randint(0, n, (u,), generator=_gen(48))
    eids = torch.randint(0, 10, (u,), generator=_gen(49))  # ties: the later update row wins in both bodies
    update = [torch.randn(u, 5, generator=_gen(50), dtype=dtype), torch.rand(u, dtype=torch.float64),
              torch.randn(u, 5, generator=_gen(51), dtype=dtype), torch.randn(u, 2, generator=_gen(52), dtype=dtype),
              torch.rand(u, dtype=torch.float64), eids]
    return (state, rows, update, eids)


def plan_inputs(dtype, policy="lookahead", admit_all=False, ring=True, seed=53):
    """A cache directory in mid-training (R rows, S slots, some free, some dirty, two pinned) and a batch of
    distinct rows padded with R: ``cache_plan``'s arguments."""
    from haloflow.kernels.cache_plan import NEVER, POLICY_CODES

    g = _gen(seed)
    R, S, D, u = 60, 12, 3, 12
    rows = torch.randperm(R, generator=g)
    slot_id = torch.full((S + 1,), -1, dtype=torch.int64)
    slot_id[:S - 2] = rows[:S - 2]  # two free slots
    id_slot = torch.full((R + 1,), -1, dtype=torch.int64)
    id_slot[slot_id[:S - 2]] = torch.arange(S - 2)
    last_use = torch.randint(0, 6, (S + 1,), generator=g)
    last_use[[1, 4]] = 6  # used by a batch not yet updated: pinned
    dirty = torch.rand(S + 1, generator=g) < 0.5
    pending = torch.zeros(S + 1, dtype=torch.bool)
    score = torch.randint(0, 6, (R + 1,), generator=g)  # small counts: ties
    next_use = torch.where(torch.rand(R + 1, generator=g) < 0.5, NEVER, torch.randint(3, 12, (R + 1,), generator=g))
    slot_score = torch.where(slot_id >= 0, score[slot_id.clamp(min=0)], 0)  # the slots' copies of their rows'
    slot_next = torch.where(slot_id >= 0, next_use[slot_id.clamp(min=0)], NEVER)
    batch = torch.sort(torch.cat([rows[2:6], rows[S:S + 5]])).values  # 4 cached (2 of them pinned slots), 5 not
    uniq = torch.cat([batch, torch.full((u - batch.numel(),), R)])
    nxt = torch.where(torch.rand(u, generator=g) < 0.4, NEVER, torch.randint(6, 12, (u,), generator=g))
    slots = [torch.randn(S + 1, D, generator=g, dtype=dtype), torch.rand(S + 1, generator=g, dtype=dtype)]
    backing = [torch.randn(R + 1, D, generator=g, dtype=dtype), torch.rand(R + 1, generator=g, dtype=dtype)]
    counts = torch.zeros(6, dtype=torch.int64)
    return (uniq, id_slot, slot_id, last_use, dirty, pending, score, next_use, slot_score, slot_next,
            nxt if ring else next_use[:0], counts, slots, backing, 7, 8, 7, 6, 5, POLICY_CODES[policy], admit_all, True)


def run_plan(body, args):
    """A plan on copies of the directory: its three outputs, then every tensor it may write (the real rows and
    slots: the pads hold whatever the padded writes left)."""
    args = [([t.clone() for t in a] if isinstance(a, list) else a.clone() if isinstance(a, torch.Tensor) else a)
            for a in args]
    out = list(body(*args))
    R, S = args[1].shape[0] - 1, args[2].shape[0] - 1
    state = [args[1][:R], args[2][:S], args[3][:S], args[4][:S], args[5][:S], args[6][:R], args[7][:R], args[8][:S],
             args[9][:S], args[11]]
    return out + state + [b[:R] for b in args[13]] + [s[:S] for s in args[12]]


def announce_inputs(dtype, seed=54):
    """A lookahead directory's ring (L = 5 batches of cap 8) with batches 6..9 announced, and batch 10's rows."""
    from haloflow.kernels.cache_plan import NEVER

    g = _gen(seed)
    R, L, cap, a = 40, 5, 8, 10
    last_batch = torch.where(torch.rand(R + 1, generator=g) < 0.3, -1, torch.randint(2, a, (R + 1,), generator=g))
    last_pos = torch.randint(0, cap, (R + 1,), generator=g)
    next_use = torch.where(torch.rand(R + 1, generator=g) < 0.3, NEVER, torch.randint(4, a, (R + 1,), generator=g))
    ring = torch.where(torch.rand(L * cap + 1, generator=g) < 0.5, NEVER, torch.randint(5, a, (L * cap + 1,),
                                                                                          generator=g))
    uniq = torch.cat([torch.sort(torch.randperm(R, generator=g)[:6]).values, torch.full((2,), R)])
    S = 10
    id_slot = torch.full((R + 1,), -1, dtype=torch.int64)
    id_slot[torch.randperm(R, generator=g)[:S]] = torch.arange(S)
    slot_next = torch.full((S + 1,), NEVER, dtype=torch.int64)
    cached = id_slot >= 0
    slot_next[id_slot[cached]] = next_use[cached]
    return (uniq, ring, last_batch, last_pos, next_use, id_slot, slot_next, a, L, cap, 7)


def run_announce(body, args):
    """An announcement on copies: the ring (not its sink) and the rows' state (not the pad row's)."""
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    body(*args)
    R, S = args[2].shape[0] - 1, args[6].shape[0] - 1
    return [args[1][:-1], args[2][:R], args[3][:R], args[4][:R], args[6][:S]]


def rows_inputs(dtype, seed=55):
    """A cache's slots (S = 10) and backing rows (R = 50, width 4) and a batch of 9 distinct rows padded with R: 5
    in slots (hits; 4 of them fresh, the fifth's slot pending), 4 not; ``cache_gather``'s arguments."""
    g = _gen(seed)
    S, R, u = 10, 50, 12
    uniq = torch.cat([torch.sort(torch.randperm(R, generator=g)[:9]).values, torch.full((u - 9,), R)])
    slot = torch.full((u,), S)
    slot[:5] = torch.randperm(S, generator=g)[:5]
    hit = torch.zeros(u, dtype=torch.bool)
    hit[:5] = True
    pending = torch.zeros(S + 1, dtype=torch.bool)
    pending[slot[4]] = True  # admitted, not yet written: read from the backing rows
    pending[S] = True  # the pad slot's flag says nothing
    return (torch.randn(S + 1, 4, generator=g, dtype=dtype), torch.randn(R + 1, 4, generator=g, dtype=dtype),
            slot, uniq, hit, pending)


def scatter_inputs(dtype):
    """``rows_inputs``' cache and batch, updated values of its rows, and which of them go to slots (the 5 in
    slots): ``cache_scatter``'s arguments."""
    slots, backing, slot, uniq, hit, pending = rows_inputs(dtype)
    S, R, u = slots.shape[0] - 1, backing.shape[0] - 1, uniq.shape[0]
    values = torch.randn(u, 4, generator=_gen(56), dtype=dtype)
    state = (torch.rand(S + 1, generator=_gen(57), dtype=dtype), torch.rand(R + 1, generator=_gen(58), dtype=dtype),
             torch.rand(u, generator=_gen(59), dtype=dtype))  # a row-wise state: one value a row
    dirty = torch.rand(S + 1, generator=_gen(60)) < 0.5
    return ([slots, state[0]], [backing, state[1]], [values, state[2]], slot, uniq, slot < S, dirty, pending)


def run_scatter(body, args):
    """A scatter on copies: the real slots and backing rows (the pads hold whatever the padded writes left), and
    the real slots' marks."""
    slots, backing, values, slot, uniq, cached, dirty, pending = args
    slots, backing = [t.clone() for t in slots], [t.clone() for t in backing]
    dirty, pending = dirty.clone(), pending.clone()
    body(slots, backing, values, slot, uniq, cached, dirty, pending)
    return [t[:-1] for t in slots] + [t[:-1] for t in backing] + [dirty[:-1], pending[:-1]]


def unique_inputs(dtype):
    """A batch's rows (n = 40, many repeated, two equal to the pad) and the pad: ``padded_unique``'s arguments."""
    x = torch.randint(0, 12, (40,), generator=_gen(57))
    x[[3, 17]] = 12
    return (x, 12)


def table_rows_inputs(dtype):
    """Ids of 7 bags (one empty) over 3 tables of 5, 9 and 4 rows laid end to end: ``table_rows``' arguments."""
    g = _gen(58)
    lengths = torch.tensor([2, 0, 3, 1, 4, 2, 1])
    tables = torch.tensor([0, 1, 1, 2, 0, 2, 1])
    sizes = torch.tensor([5, 9, 4])
    ids = torch.cat([torch.randint(0, int(sizes[t]), (int(n),), generator=g) for n, t in zip(lengths, tables)])
    return (ids, lengths, tables, torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)]))


def table_unique_inputs(dtype):
    """``table_rows``' batch and the pad (row 18, after the 3 tables' 18 rows): ``table_unique``'s arguments."""
    return (*table_rows_inputs(dtype), 18)


def bag_grads_inputs(dtype):
    """Gradients of 6 bags (one empty) of width 3 and their 9 occurrences' rows among 5 distinct rows (some rows
    in several bags, one twice in a bag): ``bag_row_grads``' arguments."""
    lengths = torch.tensor([2, 0, 3, 1, 2, 1])
    inverse = torch.tensor([0, 3, 1, 1, 4, 3, 2, 0, 1])
    return (torch.randn(6, 3, generator=_gen(59), dtype=dtype), inverse, lengths, 5)


def uniform_inputs(dtype):
    return (0x1234_5678_9ABC_DEF0, (3, 40), (1, 17), 0.25)


# ------------------------------------------------------------------------------------------------ the table
def _returns(body, args):
    out = body(*args)
    return list(out) if isinstance(out, tuple) else [out]


def sgd_update_inputs(dtype):
    """37 distinct rows of 50 (a length no vector width divides), then the pad row 50 three times with zero
    gradients, as ``padded_unique`` pads a batch: ``sgd_update``'s arguments."""
    weight = torch.randn(51, 5, generator=_gen(61), dtype=dtype)
    weight[50] = 0.0
    index = torch.cat([torch.randperm(50, generator=_gen(62))[:37], torch.full((3,), 50)])
    grad = torch.randn(40, 5, generator=_gen(63), dtype=dtype) * 7
    grad[37:] = 0.0
    return (weight, index, grad, 0.1)


def _in_place(position: int):
    """Run a body that writes into args[position] (a tensor, or a list/tuple of them) on a copy; return it."""
    def run(body, args):
        args = list(args)
        target = args[position]
        copy = [t.clone() for t in target] if isinstance(target, (list, tuple)) else target.clone()
        args[position] = type(target)(copy) if isinstance(target, tuple) else copy
        body(*args)
        return copy if isinstance(copy, list) else [copy]
    return run


@dataclass(frozen=True)
class Case:
    op: str
    inputs: Callable  # dtype -> the bodies' positional arguments
    run: Callable = _returns  # (body, args) -> list of output tensors
    atol: float = 1e-5  # tolerance of a body that is not bitwise (float32)
    op_args: Callable | None = None  # dtype -> the custom op's arguments, when they differ from the bodies'
    grad_inputs: tuple[int, ...] = ()  # differentiable argument positions, for gradcheck of the custom op


CASES = [
    Case("spmm", spmm_inputs, atol=1e-5, op_args=spmm_op_args, grad_inputs=(0,)),
    Case("keyed_dropout", dropout_inputs, grad_inputs=(0,)),
    Case("masked_scale", masked_scale_inputs, grad_inputs=()),
    Case("cos_encode", cos_inputs, atol=2e-6, grad_inputs=(0, 1, 2)),
    Case("cos_encode_backward", cos_backward_inputs, atol=1e-3),
    Case("attend", attend_inputs, atol=1e-5, grad_inputs=(0, 1, 2)),
    Case("attend_backward", attend_backward_inputs, atol=1e-5),
    Case("gru_gates", gru_inputs, atol=1e-6, grad_inputs=(0, 1, 2, 3)),
    Case("gru_gates_backward", gru_backward_inputs, atol=1e-6),
    Case("interaction", interaction_inputs, grad_inputs=(0, 1)),
    Case("interaction_backward", interaction_backward_inputs),
    Case("sgd_rows", sgd_rows_inputs, run=_in_place(0), atol=1e-6),
    Case("sgd_tables", sgd_tables_inputs, run=_in_place(0), atol=1e-6),
    Case("write_newest", newest_inputs, run=_in_place(0)),
    Case("keyed_uniform", uniform_inputs),
    Case("cache_plan", plan_inputs, run=run_plan),
    Case("cache_announce", announce_inputs, run=run_announce),
    Case("cache_gather", rows_inputs),
    Case("padded_unique", unique_inputs),
    Case("table_rows", table_rows_inputs),
    Case("table_unique", table_unique_inputs),
    Case("bag_row_grads", bag_grads_inputs, grad_inputs=()),
    Case("cache_scatter", scatter_inputs, run=run_scatter),
    Case("sgd_update", sgd_update_inputs, run=_in_place(0)),
]
BY_NAME = {c.op: c for c in CASES}


def test_every_registered_op_has_a_row_and_every_row_an_op():
    assert sorted(BY_NAME) == sorted(OPS)


def _same(got, want, *, bitwise: bool, atol: float):
    assert len(got) == len(want)
    for a, e in zip(got, want):
        if bitwise:
            assert a.dtype == e.dtype and a.shape == e.shape and torch.equal(a, e), (a, e)
        else:
            torch.testing.assert_close(a, e, rtol=atol, atol=atol * max(1.0, float(e.abs().max()) if e.numel() else 1.0))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.op)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cpu_body_equals_the_stock_formula(case, dtype):
    op = OPS[case.op]
    if op.cpu is None:
        pytest.skip(f"{case.op} has no CPU body of its own")
    args = case.inputs(dtype)
    _same(case.run(op.cpu, args), case.run(op.stock, args), bitwise="cpu" in op.bitwise,
          atol=case.atol if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("case", [c for c in CASES if OPS[c.op].cpu is not None], ids=lambda c: c.op)
def test_the_cpu_body_gives_the_same_bits_at_one_and_two_threads(case):
    op = OPS[case.op]
    args = case.inputs(torch.float32)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(case.run(op.cpu, args))
    finally:
        torch.set_num_threads(before)
    _same(runs[0], runs[1], bitwise=True, atol=0)


CUSTOM = [c for c in CASES if OPS[c.op].custom_op is not None]


@pytest.mark.parametrize("case", CUSTOM, ids=lambda c: c.op)
def test_opcheck(case):
    op = OPS[case.op]
    args = (case.op_args or case.inputs)(torch.float64)
    args = tuple(a.clone().requires_grad_(i in case.grad_inputs) if isinstance(a, torch.Tensor) else a
                 for i, a in enumerate(args))
    torch.library.opcheck(op.custom_op, args)


@pytest.mark.parametrize("case", [c for c in CUSTOM if c.grad_inputs], ids=lambda c: c.op)
def test_gradcheck_of_the_stock_formula_in_float64(case):
    """float64 CPU tensors take the stock formula in every op with a compiled body (their numba bodies are float32),
    but keyed_dropout's and spmm's CPU bodies, whose backward is the same linear map."""
    op = OPS[case.op]
    args = list((case.op_args or case.inputs)(torch.float64))

    def f(*diff):
        full = list(args)
        for i, t in zip(case.grad_inputs, diff):
            full[i] = t
        out = op.custom_op(*full)
        return out if isinstance(out, torch.Tensor) else tuple(o for o in out if o.requires_grad)

    diff = tuple(args[i].clone().requires_grad_() for i in case.grad_inputs)
    assert torch.autograd.gradcheck(f, diff, eps=1e-6, atol=1e-5, rtol=1e-4)


TRITON_CHECK = r"""
import json, sys, torch
from haloflow.kernels import keyed_dropout as m
from haloflow.kernels._registry import OPS
op = OPS["keyed_dropout"]
assert op.gpu is not None
ok = []
for dtype in (torch.float32, torch.float64):
    for relu in (False, True):
        for shape in ((64, 37), (3, 1), (0, 5)):
            h = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
            ids = torch.randint(0, 2**62, (shape[0],), generator=torch.Generator().manual_seed(2))
            # keys: negative and positive as int64, and one inside int32 (Triton types such an argument i32)
            for base in (m.base_key(3, 7, 1), m.base_key(2**63 + 5, 0, 9), 12345):
                args = (h, ids, base, m.threshold(0.3), 1 / 0.7, relu, True)
                got, want = op.gpu(*args), op.stock(*args)
                ok.append(all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want)))
print(json.dumps({"cases": len(ok), "equal": sum(ok)}))
"""


def test_the_triton_keyed_dropout_equals_the_stock_formula_bit_for_bit_in_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", TRITON_CHECK], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got == {"cases": 36, "equal": 36}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.op)
def test_a_body_that_changes_one_value_is_caught(case):
    """The control: the comparison above fails when a body's output moves by one float32 ulp."""
    op = OPS[case.op]
    args = case.inputs(torch.float32)
    want = case.run(op.stock, args)
    moved = [t.clone() for t in want]
    target = next((t for t in moved if t.is_floating_point() and t.numel()), None)
    if target is None:
        pytest.skip("no floating-point output")
    flat = target.view(-1)
    flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf"), dtype=flat.dtype))
    with pytest.raises(AssertionError):
        _same(moved, want, bitwise=True, atol=0)
