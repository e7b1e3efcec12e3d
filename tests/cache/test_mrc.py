import numpy as np
import pytest
import torch

from haloflow.cache import (BackingStore, CachedStore, LRUPolicy, SGD, make_policy, miss_ratio_curve, simulate,
                            smallest_cache_for)
from haloflow.errors import ConfigError
from tests.cache.test_policy import TRACE


def test_curve_on_the_hand_built_trace():
    curve = miss_ratio_curve(TRACE, [1, 2, 3], LRUPolicy, num_rows=6)
    assert [p.slots for p in curve] == [1, 2, 3]
    assert [round(p.hit_rate * 9) for p in curve] == [0, 2, 6]
    assert [round(p.belady * 9) for p in curve] == [4, 7, 9]  # 3 slots preloaded with every id the trace uses
    assert smallest_cache_for(curve, 0.5) == 3
    assert smallest_cache_for(curve, 0.9) is None


@pytest.mark.parametrize("name", ["lru", "lfu", "frequency"])
def test_simulated_hit_rate_is_the_stores_hit_rate(name, rng):
    # The promise to the planner: the curve predicts what the store counts on the same trace.
    n, slots = 50, 7
    trace = [(rng.zipf(1.4, 20) - 1) % n for _ in range(30)]
    hist = np.bincount(np.concatenate(trace), minlength=n)
    predicted = simulate(trace, slots, make_policy(name, histogram=hist), num_rows=n)
    store = CachedStore(BackingStore.in_memory(n, 3, SGD()), num_slots=slots,
                        policy=make_policy(name, histogram=hist))
    for batch in trace:
        store.gather(torch.from_numpy(batch))
    assert store.stats.hits == predicted.hits and store.stats.lookups == predicted.lookups
    assert store.stats.evicted == predicted.evicted and store.stats.overflow == predicted.overflow


def test_simulate_rejects_impossible_sizes():
    with pytest.raises(ConfigError, match=r"num_slots must be in 1..6"):
        simulate(TRACE, 7, LRUPolicy(), num_rows=6)
