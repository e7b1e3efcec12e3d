"""``haloflow::cache_plan`` beyond the kernels table's one case: the numba body makes the stock formula's
decisions, bit for bit, for every policy, with and without Belady's bypass and the ring of next uses, and the
plan it leaves is a directory (each cached row in one slot, pinned slots kept, counts that add up)."""

from __future__ import annotations

import pytest
import torch

from haloflow.kernels._registry import OPS
from haloflow.kernels.cache_plan import POLICY_CODES

from tests.kernels.test_ops import _same, plan_inputs, run_plan

OP = OPS["cache_plan"]


@pytest.mark.parametrize("policy", list(POLICY_CODES))
@pytest.mark.parametrize("admit_all", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_numba_plan_makes_the_stock_decisions(policy, admit_all, seed):
    args = plan_inputs(torch.float32, policy=policy, admit_all=admit_all, ring=seed % 2 == 0, seed=seed)
    _same(run_plan(OP.cpu, args), run_plan(OP.stock, args), bitwise=True, atol=0)


@pytest.mark.parametrize("body", ["stock", "cpu"])
@pytest.mark.parametrize("policy", list(POLICY_CODES))
def test_a_plan_leaves_a_directory(body, policy):
    args = list(plan_inputs(torch.float32, policy=policy, admit_all=True, seed=5))
    uniq, id_slot, slot_id, last_use, pending, counts = args[0], args[1], args[2], args[3], args[5], args[11]
    R, S = id_slot.numel() - 1, slot_id.numel() - 1
    pinned_before = last_use[:S] >= args[17]
    held_before = slot_id.clone()
    slot, hit, cached = getattr(OP, body)(*args)
    real = uniq < R
    for i in torch.nonzero(real & cached).flatten().tolist():  # a cached row is in the slot it was given
        assert id_slot[uniq[i]] == slot[i] and slot_id[slot[i]] == uniq[i]
    assert torch.all(slot[~cached] == S)  # the others are served from the backing rows
    cached_rows = slot_id[:S][slot_id[:S] >= 0]
    assert cached_rows.unique().numel() == cached_rows.numel()  # no row in two slots
    kept = pinned_before & ~torch.isin(torch.arange(S), slot[hit])  # pinned, and not this batch's hit
    assert torch.equal(slot_id[:S][kept], held_before[:S][kept])  # pinned slots are never victims
    assert bool(pending[slot[cached & ~hit]].all())  # admitted rows wait for their batch's update
    lookups, hits, misses, admitted = counts[:4].tolist()
    assert lookups == int(real.sum()) == hits + misses and admitted == int((cached & ~hit & real).sum()) > 0
    score, next_use, slot_score, slot_next = args[6], args[7], args[8], args[9]
    held = slot_id[:S] >= 0  # the slots' copies agree with their rows
    if policy != "lru":
        assert torch.equal(slot_score[:S][held], score[slot_id[:S][held]])
    if policy.startswith("lookahead"):
        assert torch.equal(slot_next[:S][held], next_use[slot_id[:S][held]])


@pytest.mark.parametrize("seed", range(6))
def test_the_numba_announcement_writes_the_stock_ring(seed):
    from tests.kernels.test_ops import announce_inputs, run_announce

    args = announce_inputs(torch.float32, seed=seed)
    ann = OPS["cache_announce"]
    _same(run_announce(ann.cpu, args), run_announce(ann.stock, args), bitwise=True, atol=0)
