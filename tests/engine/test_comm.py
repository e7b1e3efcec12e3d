"""engine/comm: the small gathers and the uneven all-gather, exact at K = 1 and on 2 and 3 real gloo ranks with
uneven and empty blocks; CommStats' sums of kinds; a peer that has gone named in the error."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.engine.comm import (
    CommStats,
    all_gather_cat,
    all_gather_rows,
    all_gather_uneven,
    group_rank,
    group_size,
    wait_work,
)
from tests.conftest import run_torchrun

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
from comm_gathers import SIZES, block, floats, ints, row  # noqa: E402


# ------------------------------------------------------------------------------------------------ one process
def test_one_process_gathers_return_its_own_data():
    assert (group_rank(None), group_size(None)) == (0, 1)
    rows = all_gather_rows([1, 2.5, -3], None, "test")
    assert rows.dtype == torch.float64 and torch.equal(rows, torch.tensor([[1.0, 2.5, -3.0]], dtype=torch.float64))
    x = torch.tensor([4, 1, 7])
    assert all_gather_cat(x, None) is x
    got = all_gather_uneven(torch.tensor([1.5, 2.5]), [2], group=None).wait()
    assert got.dtype == torch.float32 and torch.equal(got, torch.tensor([1.5, 2.5]))
    assert torch.equal(all_gather_uneven(torch.zeros(0), [0], group=None).wait(), torch.zeros(0))
    wait_work(None, "nothing in flight")  # no handle: nothing to wait for


def test_uneven_gather_checks_this_ranks_block_size():
    with pytest.raises(ValueError, match=r"all_gather_uneven: send has 2 elements but recv_splits\[0\] is 3"):
        all_gather_uneven(torch.zeros(2), [3], group=None)


def test_comm_stats_sums_kinds_and_resets():
    s = CommStats()
    s.record("halo", 100)
    s.record("halo", 20)
    s.record("halo_grad", 7)
    s.record("grad", 64)
    s.record("pooled", 0)
    s.record_blocked("halo", 0.25)
    s.record_blocked("halo_grad", 0.5)
    s.record_blocked("grad", 2.0)
    assert (s.halo_bytes, s.halo_exchanges, s.grad_bytes) == (127, 3, 64)
    assert (s.halo_blocked_s, s.grad_blocked_s, s.blocked_s) == (0.75, 2.0, 2.75)
    assert s.total() == 191 and s.calls["pooled"] == 1
    assert s.snapshot() == {"grad": 64, "halo": 120, "halo_grad": 7}  # sorted, the empty kind left out
    s.reset()
    assert (s.total(), s.halo_exchanges, s.blocked_s, s.snapshot()) == (0, 0, 0.0, {})


# ------------------------------------------------------------------------------------------------ K ranks
def _expected_bytes(r: int, k: int) -> dict:
    return {"gather_test": 8 * SIZES[r] * (k - 1)}  # float64 block, once to every peer (none from an empty one)


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 3])
def test_gathers_on_k_ranks_are_exact_and_in_rank_order(tmp_path, k):
    proc = run_torchrun(SCRIPTS / "comm_gathers.py", k, [tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want_rows = np.array([row(p, k) for p in range(k)], dtype=np.float64)
    want_ints = torch.cat([ints(p) for p in range(k)]).numpy()
    want_floats = torch.cat([floats(p) for p in range(k)]).numpy()
    want_uneven = torch.cat([block(p) for p in range(k)]).numpy()
    for r in range(k):
        got = np.load(tmp_path / f"rank{r}.npz")
        np.testing.assert_array_equal(got["rows"], want_rows)
        assert got["ints"].dtype == np.int64 and got["floats"].dtype == np.float32
        np.testing.assert_array_equal(got["ints"], want_ints)
        np.testing.assert_array_equal(got["floats"], want_floats)
        assert got["nothing"].shape == (0,)
        assert got["uneven"].dtype == np.float64
        np.testing.assert_array_equal(got["uneven"], want_uneven)
        np.testing.assert_array_equal(got["uneven_again"], want_uneven)
        stats = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert stats["bytes"] == _expected_bytes(r, k)
        assert stats["calls"] == {"gather_test": 1}
        # time blocked is counted under the kind of the wait (rank 1 sends nothing but still receives)
        assert stats["blocked"] == ["gather_test"]
    if k == 2:  # the script's lost-peer epilogue
        pid, message = (tmp_path / "lost_peer.txt").read_text().split("\n", 1)
        assert re.match(rf"rank 0: exchanging losses failed - rank 1 \(pid {pid}\) has exited \(", message), message
