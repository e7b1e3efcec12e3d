"""HaloExchange: halo rows and their gradients against the full graph, on 3 real gloo processes."""

from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.engine.gcn.halo import HaloExchange, HaloSelection
from haloflow.errors import ConfigError
from tests.conftest import run_torchrun
from tests.engine.scripts.common import parts_of, small_dataset

SCRIPTS = Path(__file__).parents[1] / "scripts"
K = 3


def _select(part, keep=0.5, seed=3, epoch=7):
    return HaloSelection.sample(rank=part.part_id, send_gids=part.inner_gids[part.send_ids],
                                send_offsets=part.send_offsets, halo_gids=part.halo_gids,
                                halo_offsets=part.halo_offsets, keep=keep, seed=seed, epoch=epoch)


def test_selection_owner_and_receiver_agree():
    parts = parts_of(small_dataset(num_nodes=300, num_edges=1500), 4)
    sels = [_select(p) for p in parts]
    kept = total = 0
    for r, (pr, sr) in enumerate(zip(parts, sels)):
        send_rows = sr.send_rows.numpy()
        for q, (pq, sq) in enumerate(zip(parts, sels)):
            # what r sends to q, by global id, equals what q keeps of its halo group from r
            sent = pr.inner_gids[pr.send_ids[send_rows[(send_rows >= pr.send_offsets[q])
                                                       & (send_rows < pr.send_offsets[q + 1])]]]
            recv_rows = sq.recv_rows.numpy()
            got = pq.halo_gids[recv_rows[(recv_rows >= pq.halo_offsets[r]) & (recv_rows < pq.halo_offsets[r + 1])]]
            np.testing.assert_array_equal(sent, got)
            assert sr.send_counts[q] == sq.recv_counts[r] == sent.size
        kept += sr.recv_rows.numel()
        total += pr.n_halo
    assert 0.4 < kept / total < 0.6  # about half of ~1000 halo copies
    all_kept = _select(parts[1], keep=1.0)
    assert all_kept.recv_rows.numel() == parts[1].n_halo and all_kept.scale == 1.0
    other_epoch = _select(parts[1], epoch=8)
    assert not torch.equal(other_epoch.recv_rows, sels[1].recv_rows)


def test_selection_rejects_bad_fraction():
    part = parts_of(small_dataset(), 2)[0]
    with pytest.raises(ConfigError, match=r"keep fraction must be in \(0, 1\], got 1.5"):
        _select(part, keep=1.5)


def test_exchange_rejects_bad_inputs():
    with pytest.raises(ConfigError, match="send counts sum to 3 but there are 2 send ids"):
        HaloExchange(torch.tensor([0, 1]), [0, 3], [0, 1], n_inner=4)
    with pytest.raises(ConfigError, match=r"send ids must lie in \[0, 4\), got \[0, 9\]"):
        HaloExchange(torch.tensor([0, 9]), [0, 2], [0, 1], n_inner=4)
    ex = HaloExchange(torch.tensor([0, 1]), [0, 2], [0, 1], n_inner=4)
    with pytest.raises(ConfigError, match=r"expected x of shape \(4, F\), got \(3, 2\)"):
        ex.start(torch.zeros(3, 2))


def test_a_finished_exchange_is_freed_by_reference_counting():
    """No cycle through the autograd graph (handle -> halo -> backward node -> op): once the step's tensors are
    dropped, the exchange (and, on a real group, the process group it holds) goes with them, not at exit."""
    import gc
    import weakref

    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        ex = HaloExchange(torch.tensor([0, 1]), [0, 2], [0, 1], n_inner=4)
        x = torch.ones(4, 3, requires_grad=True)
        handle = ex.start(x)
        halo = handle.wait()
        assert handle.wait() is halo  # cached on the handle
        (x.sum() + halo.sum()).backward()
        ref = weakref.ref(ex)
        del ex, handle, halo
        assert ref() is None
    finally:
        if gc_was_enabled:
            gc.enable()


@pytest.mark.slow
def test_exchange_matches_full_graph(tmp_path):
    proc = run_torchrun(SCRIPTS / "halo_exchange.py", K, [tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dataset = small_dataset()
    parts = parts_of(dataset, K)
    rng = np.random.default_rng(1)
    x_all, c_all = rng.standard_normal((dataset.num_nodes, 5)), rng.standard_normal((dataset.num_nodes, 5))
    x32 = torch.tensor(x_all, dtype=torch.float32)
    res = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(K)]

    # exact: every halo row is its owner's row; an owner's gradient sums the receivers' coefficients
    grad = torch.zeros(dataset.num_nodes, 5, dtype=torch.float64)
    for r, p in enumerate(parts):
        torch.testing.assert_close(torch.from_numpy(res[r]["exact_halo"]), x32[p.halo_gids])
        grad[p.halo_gids] += torch.from_numpy(c_all[p.halo_gids]) * (r + 1)
        # float32 rows sent: the send list forward, the halo's gradients backward
        assert int(res[r]["exact_bytes"]) == (p.send_ids.size + p.n_halo) * 5 * 4
    for r, p in enumerate(parts):
        torch.testing.assert_close(torch.from_numpy(res[r]["exact_grad"]), grad[p.inner_gids].float())

    # sampled: kept rows are scaled by 1/0.5, dropped rows are zero; owners get back only kept rows' gradients
    grad = torch.zeros(dataset.num_nodes, 5, dtype=torch.float64)
    kept_total = 0
    for r, p in enumerate(parts):
        halo = torch.from_numpy(res[r]["sampled_halo"])
        kept = halo.abs().sum(1) > 0
        kept_total += int(kept.sum())
        torch.testing.assert_close(halo[kept], 2.0 * x32[p.halo_gids][kept])
        gids = p.halo_gids[kept.numpy()]
        grad[gids] += torch.from_numpy(c_all[gids]) * (r + 1) * 2.0
    assert 0 < kept_total < sum(p.n_halo for p in parts)
    for r, p in enumerate(parts):
        torch.testing.assert_close(torch.from_numpy(res[r]["sampled_grad"]), grad[p.inner_gids].float())
