import numpy as np
import pytest

from haloflow.errors import ConfigError
from haloflow.partition.relabel import relabel
from haloflow.partition.types import Assignment


def test_docstring_example_exactly():
    r = relabel(Assignment(parts=np.array([1, 0, 1, 0, 2]), num_parts=3, method="random"))
    assert r.book.bounds.tolist() == [0, 2, 4, 5]
    assert r.new_to_orig.tolist() == [1, 3, 0, 2, 4]
    assert r.orig_to_new.tolist() == [2, 0, 3, 1, 4]


def test_contiguous_ranges_order_kept_and_inverse():
    rng = np.random.default_rng(0)
    parts = rng.integers(0, 5, size=500)
    parts[parts == 3] = 2  # part 3 empty: an empty range
    r = relabel(Assignment(parts=parts, num_parts=5, method="random"))
    assert r.new_to_orig.dtype == np.int64 and r.orig_to_new.dtype == np.int64
    assert np.array_equal(r.orig_to_new[r.new_to_orig], np.arange(500))
    assert np.array_equal(r.new_to_orig[r.orig_to_new], np.arange(500))
    owner = r.book.owner(r.orig_to_new)  # part of each original node, through the book
    assert np.array_equal(owner, parts)
    assert r.book.part_sizes()[3] == 0
    for k in range(5):
        lo, hi = r.book.part_range(k)
        ids = r.new_to_orig[lo:hi]
        assert np.all(parts[ids] == k) and np.all(np.diff(ids) > 0)  # original order inside a part


def test_rejects_out_of_range_part():
    with pytest.raises(ConfigError, match=r"holds part 4, expected parts in \[0, 4\)"):
        relabel(Assignment(parts=np.array([0, 4, 1]), num_parts=4, method="metis"))
