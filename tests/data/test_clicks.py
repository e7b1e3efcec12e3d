import numpy as np
import pytest
import torch

from haloflow.data.clicks import CHUNK, ClickLogConfig, ClickLogGenerator
from haloflow.errors import ConfigError
from haloflow.models.dlrm import KAGGLE_TABLE_SIZES


def test_default_sizes_are_kaggle_and_scaling_keeps_one_row():
    assert ClickLogConfig().sizes == KAGGLE_TABLE_SIZES
    cfg = ClickLogConfig(scale=1e-3, max_rows=500)
    assert cfg.sizes == tuple(min(500, max(1, round(n * 1e-3))) for n in KAGGLE_TABLE_SIZES)


def test_deterministic_by_seed_and_independent_of_batch_size():
    cfg = ClickLogConfig(scale=1e-3, seed=11)
    a, b = ClickLogGenerator(cfg), ClickLogGenerator(cfg)
    start = CHUNK - 50  # the window crosses a chunk boundary
    whole = a.samples(start, 120)
    pieces = list(b.batches(batch_size=40, num_batches=3, start=start))
    assert torch.equal(torch.cat([p.dense for p in pieces]), whole.dense)
    assert torch.equal(torch.cat([p.labels for p in pieces]), whole.labels)
    glued = [row for p in pieces for row in zip(*p.sparse.to_lists())]
    assert glued == [row for row in zip(*whole.sparse.to_lists())]
    other = ClickLogGenerator(ClickLogConfig(scale=1e-3, seed=12)).samples(start, 120)
    assert not torch.equal(other.dense, whole.dense)


def test_ids_in_range_zipf_shaped_and_rate_near_target():
    gen = ClickLogGenerator(ClickLogConfig(scale=1e-3, seed=0, positive_rate=0.25))
    batch = gen.samples(0, 2 * CHUNK)
    for t, size in enumerate(gen.sizes):
        _, ids = batch.sparse.feature(t)
        assert 0 <= ids.min() and ids.max() < size
    _, ids = batch.sparse.feature(2)  # 10131 rows
    counts = np.bincount(ids.numpy(), minlength=gen.sizes[2])
    assert counts[0] > counts[9] > counts[999]  # hot ids first, a long tail
    assert 0.15 < batch.labels.mean().item() < 0.40
    assert batch.dense.min() >= 0 and (batch.dense == 0).float().mean() > 0.1  # missing values -> 0


def test_multi_hot_bags():
    gen = ClickLogGenerator(ClickLogConfig(table_sizes=(50, 60), num_dense=3, multi_hot=3.0, seed=1))
    batch = gen.samples(0, 1000)
    assert batch.sparse.lengths.shape == (2, 1000) and batch.dense.shape == (1000, 3)
    assert batch.sparse.lengths.min() >= 1
    assert 2.7 < batch.sparse.lengths.float().mean().item() < 3.3


def test_config_errors():
    with pytest.raises(ConfigError, match="scale must be a finite number > 0"):
        ClickLogConfig(scale=0)
    with pytest.raises(ConfigError, match="positive_rate in \\(0, 1\\)"):
        ClickLogConfig(positive_rate=1.0)
    with pytest.raises(ConfigError, match="rows must map splits"):
        ClickLogGenerator(ClickLogConfig(scale=1e-4)).write_parquet("unused", {"training": 5})
