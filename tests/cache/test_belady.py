import numpy as np
import pytest

from haloflow.cache import belady_hits, make_policy, simulate
from tests.cache.test_policy import HIST, TRACE


def test_exact_hits_on_the_hand_built_trace():
    # Preloaded {0, 1}: 2 bypassed twice (its next use is always later than 0's and 1's) -> 7 of 9.
    assert belady_hits(TRACE, 2) == 7
    # Cold: the first two lookups miss.
    assert belady_hits(TRACE, 2, preload=False) == 5
    assert belady_hits(TRACE, 3, preload=False) == 6  # only the 3 compulsory misses
    assert belady_hits(TRACE, 1, preload=False) == 3  # keeps 1, hit in batches 2, 3, 5


def test_repeats_inside_a_batch_count_once():
    assert belady_hits([np.array([4, 4, 4]), np.array([4])], 1, preload=False) == 1


@pytest.mark.parametrize("seed", range(12))
def test_no_policy_beats_belady(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    batches = int(rng.integers(1, 40))
    a = rng.uniform(1.05, 2.0)
    trace = [(rng.zipf(a, int(rng.integers(1, 20))) - 1) % n for _ in range(batches)]
    hist = np.bincount(np.concatenate(trace), minlength=n)
    for slots in sorted({1, int(rng.integers(1, n + 1)), n}):
        best = belady_hits(trace, slots, num_rows=n)
        cold = belady_hits(trace, slots, num_rows=n, preload=False)
        assert cold <= best
        for name in ("lru", "lfu"):
            assert simulate(trace, slots, make_policy(name), num_rows=n).hits <= cold
        for admit_all in (True, False):
            policy = make_policy("frequency", histogram=hist, admit_all=admit_all)
            assert simulate(trace, slots, policy, num_rows=n).hits <= best  # warm start: against preloaded MIN
