from pathlib import Path

import pytest
import torch

from haloflow.engine.comm import CommStats, all_to_all
from haloflow.engine.dlrm.embedding_dist import pooled_exchange, sparse_grad_all_reduce
from tests.conftest import run_torchrun

SCRIPTS = Path(__file__).parents[1] / "scripts"


def test_single_process_all_to_all_is_a_copy_and_checks_sizes():
    x = torch.arange(5)
    assert torch.equal(all_to_all(x, [5], [5], group=None).wait(), x)
    with pytest.raises(ValueError, match="send has 5 elements but the splits add up to 4"):
        all_to_all(x, [4], [4], group=None)


def test_pooled_exchange_places_and_sums_columns_with_gradients():
    # One process: the "received" block is our own (B, 3); columns 0 and 2 both land in output column 1.
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    out = pooled_exchange(x, [2], [3], torch.tensor([1, 0, 1]), 2, group=None).wait()
    assert torch.equal(out, torch.tensor([[2.0, 4.0], [5.0, 10.0]]))
    out.backward(torch.tensor([[10.0, 20.0], [30.0, 40.0]]))
    assert torch.equal(x.grad, torch.tensor([[20.0, 10.0, 20.0], [40.0, 30.0, 40.0]]))


def test_pooled_exchange_rejects_a_wrong_shape():
    with pytest.raises(ValueError, match=r"send has shape \(2, 3\), expected \(2, 4\)"):
        pooled_exchange(torch.zeros(2, 3), [2], [4], torch.arange(4), 4, group=None)


def test_sparse_grad_single_process_is_coalesced():
    g = torch.sparse_coo_tensor(torch.tensor([[2, 0, 2]]), torch.tensor([[1.0], [2.0], [3.0]]), (4, 1),
                                check_invariants=True)
    (out,) = sparse_grad_all_reduce([g], group=None).wait()
    assert out.is_coalesced()
    assert torch.equal(out.to_dense(), torch.tensor([[2.0], [0.0], [4.0], [0.0]]))


def test_comm_stats_snapshot_leaves_out_empty_kinds():
    s = CommStats()
    s.record("pooled", 0)
    s.record("input_values", 24)
    s.record("input_values", 8)
    assert s.snapshot() == {"input_values": 32}
    assert s.calls["input_values"] == 2 and s.total() == 32


@pytest.mark.slow
def test_collectives_on_three_ranks():
    proc = run_torchrun(SCRIPTS / "dlrm_collectives.py", 3, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "COLLECTIVES OK" in proc.stdout
