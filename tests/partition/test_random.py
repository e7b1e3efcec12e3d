import numpy as np
import pytest

from haloflow.partition.random import random_partition


@pytest.mark.parametrize("n,k", [(10, 3), (101, 4), (7, 7), (5, 1)])
def test_pieces_differ_by_at_most_one(n, k):
    parts = random_partition(n, k, seed=3)
    sizes = np.bincount(parts, minlength=k)
    assert parts.dtype == np.int64 and parts.shape == (n,)
    assert sizes.sum() == n and sizes.max() - sizes.min() <= 1
    assert set(sizes.tolist()) <= {n // k, -(-n // k)}


def test_deterministic_by_seed():
    a, b, c = (random_partition(1000, 8, seed=s) for s in (5, 5, 6))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_one_part_and_one_node_per_part():
    assert np.array_equal(random_partition(6, 1, seed=0), np.zeros(6, dtype=np.int64))
    assert np.array_equal(np.sort(random_partition(6, 6, seed=0)), np.arange(6))
