"""Cost model: byte prediction by hand, and time arithmetic on a hand-built two-part load."""

import pytest

from haloflow.engine.gcn.cost_model import EpochCost, PartLoad, Rates, halo_bytes_per_epoch, predict_epoch
from haloflow.errors import ConfigError
from haloflow.models.gcn import GCNConfig

# 3 layers 8 -> 6 -> 6 -> 2: layer 1 aggregates first (width 6), layer 2 transforms first (width 2)
MODEL = GCNConfig(in_dim=8, out_dim=2, hidden_dim=6, num_layers=3)
LOADS = [PartLoad(n_inner=10, n_halo=3, n_send=4, nnz_inner=20, nnz_halo=5),
         PartLoad(n_inner=10, n_halo=4, n_send=3, nnz_inner=18, nnz_halo=6)]


def test_halo_bytes_by_hand():
    # (sends + halo rows) of both parts = 14 rows per direction pair, widths 6 + 2, 4 bytes
    assert halo_bytes_per_epoch(LOADS, MODEL) == 14 * (6 + 2) * 4
    assert halo_bytes_per_epoch([PartLoad.whole(20, 40)], MODEL) == 0


def test_communication_only_model_is_the_bytes_over_bandwidth():
    rates = Rates(spmm_s=0.0, gemm_s=0.0, elem_s=0.0, byte_s=1e-6)
    cost = predict_epoch(LOADS, MODEL, rates)
    params = 8 * 6 + 6 + 6 * 6 + 6 + 6 * 2 + 2
    per_rank = 2 * 7 * (6 + 2) * 4 * 1e-6  # forward and backward, 7 rows each way on either part
    assert cost.compute_s == 0.0
    assert cost.comm_s == pytest.approx(per_rank + params * 4 * 1e-6)
    assert cost.total_s == pytest.approx(cost.comm_s)  # nothing to hide behind


def test_overlap_hides_communication_behind_the_inner_spmm():
    rates = Rates(spmm_s=1e-3, gemm_s=0.0, elem_s=0.0, byte_s=1e-9)
    with_overlap, without = predict_epoch(LOADS, MODEL, rates), predict_epoch(LOADS, MODEL, rates, overlap=False)
    assert with_overlap.exposed_s < without.exposed_s == pytest.approx(without.comm_s)
    assert EpochCost(1, 2, 3) + EpochCost(1, 1, 1) == EpochCost(2, 3, 4)


def test_other_work_is_per_activation_element():
    base = Rates(spmm_s=1e-3, gemm_s=1e-6, elem_s=1e-5, byte_s=1e-9)
    more = Rates(spmm_s=1e-3, gemm_s=1e-6, elem_s=1e-5, byte_s=1e-9, other_s=1e-4)
    one = [PartLoad.whole(20, 40)]
    # 20 nodes x (6 + 6 + 2) activation elements of layers 1..3
    assert predict_epoch(one, MODEL, more).compute_s - predict_epoch(one, MODEL, base).compute_s == pytest.approx(
        20 * 14 * 1e-4)


def test_rates_must_be_non_negative():
    with pytest.raises(ConfigError, match="Rates.byte_s must be >= 0, got -1"):
        Rates(spmm_s=0, gemm_s=0, elem_s=0, byte_s=-1)
