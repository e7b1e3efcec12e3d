"""engine/tgn/memory: ``ShardedMemory`` against the single-process ``TGNMemoryState`` (the oracle), on one process
with a permuted row map and on 2 real gloo ranks owning interleaved nodes; the bytes each exchange sends."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.engine.tgn.memory import NodeOwners, ShardedMemory
from haloflow.errors import ConfigError
from haloflow.models.tgn_memory import MemoryRows, MemoryUpdate, TGNMemoryState
from tests.conftest import run_torchrun
from tests.engine.scripts.sharded_memory import F, FIELDS, M, N, OWNER, QUERIES, SIZES, arrays, owners, update

SCRIPTS = Path(__file__).parents[1] / "scripts"
PERM = NodeOwners(owner=np.zeros(4, dtype=np.int64), row=np.array([2, 0, 3, 1]), counts=(4,))  # node v at row[v]


def _rows(values: list[float], eids: list[int], m: int = 2, f: int = 1) -> MemoryRows:
    """Rows whose every field is filled from ``values[i]`` (so a row's origin is visible)."""
    v = torch.tensor(values, dtype=torch.float32)
    return MemoryRows(memory=v[:, None].repeat(1, m), last_update=v.double(), mail_other=-v[:, None].repeat(1, m),
                      mail_feat=v[:, None].repeat(1, f) + 0.25, mail_t=v.double() + 0.5, mail_eid=torch.tensor(eids))


def _equal(state: TGNMemoryState, oracle: TGNMemoryState) -> None:
    for name, want in arrays(oracle).items():
        np.testing.assert_array_equal(getattr(state, name).cpu().numpy(), want, err_msg=name)


# ------------------------------------------------------------------------------------------------ one process
def test_blocks_may_leave_a_part_empty():
    owners_ = NodeOwners.blocks(2, 3)
    assert owners_.counts == (1, 1, 0) and owners_.num_parts == 3
    assert owners_.owner.tolist() == [0, 1] and owners_.row.tolist() == [0, 0]


def test_newest_event_wins_and_rows_go_through_the_row_map():
    mem = ShardedMemory(PERM, memory_dim=2, edge_dim=1)
    # node 1 written three times (events 5, 9, 3: event 9's row wins), node 3 once, node 0 once, node 2 never
    mem.apply(MemoryUpdate(torch.tensor([1, 3, 1, 0, 1]), _rows([1.0, 2.0, 3.0, 4.0, 5.0], [5, 2, 9, 4, 3])))
    assert mem.local.mail_eid.tolist() == [9, 2, 4, -1]  # local rows: node 1 at 0, node 3 at 1, node 0 at 2
    whole = mem.gather_all()
    assert whole.mail_eid.tolist() == [4, 9, -1, 2]  # back in node order
    assert whole.memory[:, 0].tolist() == [4.0, 3.0, 0.0, 2.0]
    assert whole.mail_other[:, 1].tolist() == [-4.0, -3.0, 0.0, -2.0]
    assert whole.mail_feat[:, 0].tolist() == [4.25, 3.25, 0.0, 2.25]
    assert whole.last_update.tolist() == [4.0, 3.0, 0.0, 2.0] and whole.mail_t.tolist() == [4.5, 3.5, 0.0, 2.5]
    got = mem.fetch(torch.tensor([2, 1, 3])).wait()
    assert got.mail_eid.tolist() == [-1, 9, 2] and got.memory[:, 1].tolist() == [0.0, 3.0, 2.0]
    assert got.last_update.dtype == torch.float64 and got.mail_eid.dtype == torch.int64


def test_one_process_follows_the_single_process_state():
    perm = np.random.default_rng(0).permutation(N)
    mem = ShardedMemory(NodeOwners(np.zeros(N, dtype=np.int64), perm, (N,)), memory_dim=M, edge_dim=F)
    oracle = TGNMemoryState(N, M, F)
    for step in range(2):
        both = MemoryUpdate.cat([update(step, 0), update(step, 1)])
        mem.apply(both)
        oracle.apply(both.node_ids, both.rows)
        _equal(mem.gather_all(), oracle)
        ids = torch.tensor(QUERIES[step][0])
        got, want = mem.fetch(ids).wait(), oracle.gather(ids)
        for name in FIELDS:
            assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_reset_empties_the_memory_and_gather_all_is_a_copy():
    mem = ShardedMemory(PERM, memory_dim=2, edge_dim=1)
    mem.apply(MemoryUpdate(torch.tensor([0, 2]), _rows([1.0, 2.0], [0, 1])))
    whole = mem.gather_all()
    whole.memory.zero_()
    assert mem.gather_all().memory[:, 0].tolist() == [1.0, 0.0, 2.0, 0.0]
    mem.reset()
    _equal(mem.gather_all(), TGNMemoryState(4, 2, 1))


def test_owners_for_another_number_of_ranks_are_refused():
    with pytest.raises(ConfigError, match="the node owners are for 3 parts but 1 processes run"):
        ShardedMemory(NodeOwners.blocks(6, 3), memory_dim=2, edge_dim=0)


@pytest.mark.parametrize("backend, device", [
    ("gloo", "cpu"),
    pytest.param("nccl", "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")),
])
def test_the_exchanges_of_a_one_rank_group_follow_the_single_process_state(backend, device):
    """A process group of one rank takes the exchange path (counts, requests, packed replies) on ``device``:
    on NCCL every tensor it sends must live on the device, the row numbers it asks for too."""
    import torch.distributed as dist

    if dist.is_initialized():  # pragma: no cover - never in this test process
        pytest.skip("a process group is already initialised")
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        perm = np.random.default_rng(1).permutation(N)
        mem = ShardedMemory(NodeOwners(np.zeros(N, dtype=np.int64), perm, (N,)), memory_dim=M, edge_dim=F,
                            group=dist.group.WORLD, device=device)
        oracle = TGNMemoryState(N, M, F)
        for step in range(2):
            both = MemoryUpdate.cat([update(step, 0), update(step, 1)])
            mem.apply(MemoryUpdate(both.node_ids, both.rows.to(device)))
            oracle.apply(both.node_ids, both.rows)
            ids = torch.tensor(QUERIES[step][0])
            got, want = mem.fetch(ids).wait(), oracle.gather(ids)
            for name in FIELDS:
                assert torch.equal(getattr(got, name).cpu(), getattr(want, name)), name
        _equal(mem.gather_all(), oracle)
        assert mem.stats.bytes["tgn_fetch"] == 0 and mem.stats.calls["tgn_fetch"] == 6  # no peer: nothing sent
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------ 2 ranks
def _oracle_states() -> list[TGNMemoryState]:
    """The one-process state after each step of the script (state0, state1), then after reset (state2)."""
    oracle, states = TGNMemoryState(N, M, F), []
    for step in range(2):
        both = MemoryUpdate.cat([update(step, 0), update(step, 1)])
        oracle.apply(both.node_ids, both.rows)
        states.append(oracle.clone())
    states.append(TGNMemoryState(N, M, F))
    return states


@pytest.mark.slow
def test_two_ranks_hold_what_one_process_holds(tmp_path):
    proc = run_torchrun(SCRIPTS / "sharded_memory.py", 2, [tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    states = _oracle_states()
    owner = np.asarray(OWNER)
    width = 4 * (2 * M + F) + 24  # bytes of one packed row, as the module docstring says
    for r in range(2):
        got = np.load(tmp_path / f"rank{r}.npz")
        for i, want in enumerate(states):  # the whole state, gathered on every rank
            for name, arr in arrays(want).items():
                np.testing.assert_array_equal(got[f"state{i}.{name}"], arr, err_msg=f"rank {r} state{i} {name}")
        seen_by_fetch = [TGNMemoryState(N, M, F), states[0], states[1]]  # fetch s comes after s applies
        for step, source in enumerate(seen_by_fetch):  # fetched rows in the order asked, from both owners
            want = source.gather(torch.tensor(QUERIES[step][r], dtype=torch.int64))
            for name in FIELDS:
                np.testing.assert_array_equal(got[f"fetch{step}.{name}"], getattr(want, name).numpy(),
                                              err_msg=f"rank {r} fetch{step} {name}")
        # bytes to the peer only: requests 8 per row asked of it, replies `width` per row it asked of me;
        # apply: the row number (8) and the packed row per row it owns; counts: one int64 each way
        peer = 1 - r
        counted = json.loads((tmp_path / f"rank{r}.json").read_text())
        asked = int((owner[QUERIES[0][r]] == peer).sum())
        asked_of_me = int((owner[QUERIES[0][peer]] == r).sum())
        assert counted["fetch0"] == {"tgn_counts": 8, "tgn_fetch": 8 * asked + width * asked_of_me}
        sent = int((owner[update(0, r).node_ids.numpy()] == peer).sum())
        assert sent > 0 and SIZES[0][r] > sent
        assert counted["apply0"] == {"tgn_counts": 8, "tgn_apply": (8 + width) * sent}
