"""HaloAggregator against the dense single-device operator on 3 real gloo processes; parallelize_gcn's checks."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.engine.gcn.parallelize import HaloAggregator, HaloConfig, parallelize_gcn, split_part_operators
from haloflow.errors import ConfigError
from haloflow.models.aggregate import LocalAggregator
from haloflow.models.gcn import GCN, GCNConfig
from tests.conftest import run_torchrun
from tests.engine.scripts.common import parts_of, small_dataset

SCRIPTS = Path(__file__).parents[1] / "scripts"
K = 3


@pytest.mark.parametrize("norm", ["gcn", "mean"])
def test_split_operators_are_the_rows_of_the_global_operator(norm):
    dataset = small_dataset()
    dense = LocalAggregator(dataset.graph, norm).op.to_dense()  # (N, N) original ids
    for part in parts_of(dataset, 2, method="metis"):
        a_inner, a_halo = split_part_operators(part, norm)
        orig = torch.from_numpy(part.orig_ids)
        new_to_orig = np.empty(part.book.num_nodes, dtype=np.int64)
        for p in parts_of(dataset, 2, method="metis"):
            new_to_orig[p.inner_gids] = p.orig_ids
        halo_orig = torch.from_numpy(new_to_orig[part.halo_gids])
        assert torch.equal(a_inner.to_dense(), dense[orig][:, orig])
        assert torch.equal(a_halo.to_dense(), dense[orig][:, halo_orig])


def test_single_process_part_needs_no_group():
    dataset = small_dataset()
    (part,) = parts_of(dataset, 1)
    agg = HaloAggregator(part, None)
    x = torch.from_numpy(dataset.features[part.orig_ids])
    torch.testing.assert_close(agg.aggregate(0, x), (LocalAggregator(dataset.graph).op @ torch.from_numpy(
        dataset.features))[torch.from_numpy(part.orig_ids)])
    with pytest.raises(ConfigError, match="has .* halo nodes but no process group"):
        HaloAggregator(parts_of(dataset, 2)[0], None)


def test_config_validation():
    with pytest.raises(ConfigError, match="schedule must be one of .*got 'late'"):
        HaloConfig(schedule="late")
    with pytest.raises(ConfigError, match="staleness must be 0 .* or 1 .*, got 2"):
        HaloConfig(staleness=2)
    with pytest.raises(ConfigError, match=r"halo_keep must be in \(0, 1\], got 0.0"):
        HaloConfig(halo_keep=0.0)
    with pytest.raises(ConfigError, match="choose one approximation"):
        HaloConfig(staleness=1, halo_keep=0.5)


@pytest.fixture(scope="module")
def aggregate_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("aggregate")
    proc = run_torchrun(SCRIPTS / "aggregate.py", K, [out], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(K)]


def _oracle_setup():
    sys.path.insert(0, str(SCRIPTS))
    from aggregate import EPOCHS, inputs

    dataset = small_dataset()
    parts = parts_of(dataset, K, method="random", seed=1)
    owner = np.empty(dataset.num_nodes, dtype=np.int64)
    new_to_orig = np.empty(dataset.num_nodes, dtype=np.int64)
    for p in parts:
        owner[p.orig_ids] = p.part_id
        new_to_orig[p.inner_gids] = p.orig_ids
    return dataset, parts, owner, new_to_orig, EPOCHS, inputs


@pytest.mark.slow
def test_exact_and_stale_match_the_dense_operator(aggregate_run):
    dataset, parts, owner, _, epochs, inputs = _oracle_setup()
    same = torch.from_numpy(owner[:, None] == owner[None, :])  # (N, N) True inside a part
    for norm in ("gcn", "mean"):
        a = LocalAggregator(dataset.graph, norm).op.to_dense()  # (N, N) float64
        for epoch in range(epochs):
            x, c = (torch.from_numpy(t) for t in inputs(dataset.num_nodes, epoch))
            y, g = a @ x, a.t() @ c
            for r, p in enumerate(parts):
                rows = torch.from_numpy(p.orig_ids)
                torch.testing.assert_close(torch.from_numpy(aggregate_run[r][f"exact_{norm}_y{epoch}"]), y[rows].float())
                torch.testing.assert_close(torch.from_numpy(aggregate_run[r][f"exact_{norm}_g{epoch}"]), g[rows].float())
    # stale: remote columns see the previous epoch's x, and send back the previous epoch's gradient
    a = LocalAggregator(dataset.graph, "gcn").op.to_dense()
    a_in, a_out = a * same, a * ~same
    for epoch in range(epochs):
        x, c = (torch.from_numpy(t) for t in inputs(dataset.num_nodes, epoch))
        xp, cp = (torch.from_numpy(t) for t in inputs(dataset.num_nodes, max(epoch - 1, 0)))
        y = a_in @ x + a_out @ xp
        g = a_in.t() @ c + a_out.t() @ cp
        for r, p in enumerate(parts):
            rows = torch.from_numpy(p.orig_ids)
            torch.testing.assert_close(torch.from_numpy(aggregate_run[r][f"stale_y{epoch}"]), y[rows].float())
            torch.testing.assert_close(torch.from_numpy(aggregate_run[r][f"stale_g{epoch}"]), g[rows].float())


@pytest.mark.slow
def test_sampled_keeps_a_scaled_subset(aggregate_run):
    dataset, parts, owner, new_to_orig, epochs, inputs = _oracle_setup()
    a = LocalAggregator(dataset.graph, "gcn").op.to_dense()
    for epoch in range(epochs):
        x, c = (torch.from_numpy(t) for t in inputs(dataset.num_nodes, epoch))
        g = torch.zeros_like(x)
        kept_sets = []
        for r, p in enumerate(parts):
            kept = np.zeros(dataset.num_nodes, dtype=bool)
            kept[new_to_orig[aggregate_run[r][f"sampled_kept{epoch}"]]] = True
            kept_sets.append(kept.sum())
            # columns of rank r's rows: own nodes, plus kept halo nodes scaled by 1 / 0.5
            col_scale = torch.from_numpy(np.where(owner == r, 1.0, np.where(kept, 2.0, 0.0)))  # (N,)
            a_r = a * col_scale[None, :]
            rows = torch.from_numpy(p.orig_ids)
            y = a_r[rows] @ x
            torch.testing.assert_close(torch.from_numpy(aggregate_run[r][f"sampled_y{epoch}"]), y.float())
            g += a_r[rows].t() @ c[rows]
        assert 0 < sum(kept_sets) < sum(p.n_halo for p in parts)
        for r, p in enumerate(parts):
            rows = torch.from_numpy(p.orig_ids)
            torch.testing.assert_close(torch.from_numpy(aggregate_run[r][f"sampled_g{epoch}"]), g[rows].float())


@pytest.mark.slow
def test_parallelize_refuses_different_weights(aggregate_run):
    for r in range(K):
        msg = str(aggregate_run[r]["mismatch_error"])
        assert "ranks start from different weights" in msg and "same model seed" in msg


def test_parallelize_checks_the_layout_before_communicating():
    import torch.distributed as dist

    if dist.is_initialized():  # pragma: no cover - never in this test process
        pytest.skip("a process group is already initialised")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        part = parts_of(small_dataset(), 2)[0]
        model = GCN(GCNConfig(in_dim=6, out_dim=3))
        with pytest.raises(ConfigError, match=r"rank 0 was given parts \[0\]; with V = 2 logical workers on K = 1 "
                           r"ranks \(2 each\) it hosts parts \[0, 1\]"):
            parallelize_gcn(model, part, dist.group.WORLD)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_exchange_is_in_flight_while_the_inner_spmm_runs(tmp_path):
    """On a real gloo group: forward launches, computes A_inner @ x, then waits; backward launches the reverse
    exchange, runs A_inner's backward, then waits. The control schedule (the benchmark's baseline) must not, so
    the order really depends on the schedule."""
    import json

    proc = run_torchrun(SCRIPTS / "overlap_order.py", 2, [tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in range(2):
        rec = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert rec["overlap"] == ["launch:fwd", "inner:fwd", "wait:fwd", "-- backward --",
                                  "launch:bwd", "inner:bwd", "wait:bwd"], rec["overlap"]
        assert rec["wait_first"] == ["launch:fwd", "wait:fwd", "inner:fwd", "-- backward --",
                                     "inner:bwd", "launch:bwd", "wait:bwd"], rec["wait_first"]
        assert rec["overlap_y"] == rec["wait_first_y"] and rec["overlap_grad"] == rec["wait_first_grad"]
