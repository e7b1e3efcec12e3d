"""BucketedGradSync: gradients summed over 3 real gloo processes, bit-identical to a rank-ordered sum."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from haloflow.engine.grad_sync import BucketedGradSync, GradSyncConfig, chunk_sizes, sync_bytes
from haloflow.errors import ConfigError
from tests.conftest import run_torchrun

SCRIPTS = Path(__file__).parent / "scripts"
K = 3


def test_single_process_leaves_gradients_alone():
    p = nn.Parameter(torch.ones(3))
    sync = BucketedGradSync([p], None)
    (p * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    sync.wait()
    torch.testing.assert_close(p.grad, torch.tensor([1.0, 2.0, 3.0]))


def test_chunks_cover_the_bucket_and_differ_by_at_most_one():
    assert chunk_sizes(10, 3) == [4, 3, 3] and chunk_sizes(2, 4) == [1, 1, 0, 0] and chunk_sizes(6, 1) == [6]
    # rank r sends the K-1 chunks it does not own, then its summed chunk to K-1 peers
    assert [sync_bytes([10], 3, r, 1) for r in range(3)] == [6 + 8, 7 + 6, 7 + 6]
    assert sync_bytes([10, 7], 1, 0) == 0


def test_config_rejects_empty_buckets():
    with pytest.raises(ConfigError, match="bucket_bytes must be > 0, got 0"):
        GradSyncConfig(bucket_bytes=0)


@pytest.mark.slow
def test_sum_is_rank_ordered_and_identical_everywhere(tmp_path):
    proc = run_torchrun(SCRIPTS / "grad_sync.py", K, [tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sys.path.insert(0, str(SCRIPTS))
    from grad_sync import SHAPES, coef

    res = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(K)]
    assert int(res[0]["num_buckets"]) >= 3  # 128-byte buckets split the 5 parameters
    for step in range(2):
        for i in range(len(SHAPES)):
            ranks = range(K) if i < len(SHAPES) - 1 else [0]  # the last parameter is used on rank 0 only
            expected = torch.zeros(SHAPES[i])
            for r in ranks:  # the documented order: 0, 1, ..., K-1
                expected = expected + coef(r, step, i)
            for r in range(K):
                got = torch.from_numpy(res[r][f"step{step}_p{i}"])
                assert torch.equal(got, expected), (step, i, r)
    n = sum(int(np.prod(s)) for s in SHAPES)
    sizes = [int(b) for b in res[0]["bucket_sizes"]]
    assert sum(sizes) == n
    sent = [int(r["grad_bytes"]) for r in res]
    # reduce-scatter + all-gather: 2 n (K-1) floats over all ranks per step, 2 n (K-1) / K per rank (chunks of
    # a bucket differ by at most one element), against the all-gather's n (K-1) per rank
    assert sum(sent) == 2 * 2 * n * (K - 1) * 4  # two steps
    for r in range(K):
        assert sent[r] == 2 * sync_bytes(sizes, K, r)
        assert abs(sent[r] - 2 * 2 * n * (K - 1) / K * 4) <= 2 * len(sizes) * (K - 2) * 4
        assert sent[r] < 2 * n * (K - 1) * 4


def test_hooks_do_not_keep_the_sync_alive():
    """No reference cycle through the hooks: dropping the sync frees it (and its process group reference) at once,
    not at interpreter shutdown, where gloo aborts the process."""
    import gc
    import weakref

    import torch.distributed as dist

    if dist.is_initialized():  # pragma: no cover - never in this test process
        pytest.skip("a process group is already initialised")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # only reference counting may free it
    try:
        p = nn.Parameter(torch.ones(3))
        sync = BucketedGradSync([p], dist.group.WORLD)
        (p * 2.0).sum().backward()
        sync.wait()
        torch.testing.assert_close(p.grad, torch.full((3,), 2.0))
        ref = weakref.ref(sync)
        del sync
        assert ref() is None
        p.grad = None
        (p * 3.0).sum().backward()  # the orphaned hook does nothing
        torch.testing.assert_close(p.grad, torch.full((3,), 3.0))
    finally:
        if gc_was_enabled:
            gc.enable()
        dist.destroy_process_group()
