import numpy as np
import pytest

from haloflow.utils.arrays import sorted_unique


@pytest.mark.parametrize("n", [0, 1, 2, 1000])
def test_matches_numpy_unique(n):
    values = np.random.default_rng(n).integers(-5, 50, n)
    got = sorted_unique(values)
    assert got.dtype == values.dtype and np.array_equal(got, np.unique(values))


def test_hand_made():
    assert sorted_unique(np.array([3, 1, 3, 3, 2, 1])).tolist() == [1, 2, 3]
