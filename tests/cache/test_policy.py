"""Hand-built trace, S = 2 slots, counted by hand (a lookup = one distinct id of one batch)::

    batch   0      1    2      3      4    5
    ids     [0 1]  [2]  [0 1]  [1 2]  [0]  [1]      histogram: 0 -> 3, 1 -> 4, 2 -> 2

    lru                 cache after: {0,1} {1,2} {0,1} {1,2} {0,2} {0,1}    hits 0 0 1 1 0 0 = 2
    lfu                              {0,1} {1,2} {0,1} {1,2} {0,1} {0,1}    hits 0 0 1 1 0 1 = 3
    frequency (warm {0,1}, admit all)  {0,1} {1,2} {0,1} {1,2} {0,1} {0,1}  hits 2 0 1 1 0 1 = 5
    frequency, admit only hotter   stays {0,1}; 2 overflows twice            hits 2 0 2 1 1 1 = 7
"""

import numpy as np
import pytest

from haloflow.cache import FrequencyPolicy, LFUPolicy, LRUPolicy, make_policy, simulate
from haloflow.errors import ConfigError

TRACE = [np.array(b) for b in ([0, 1], [2], [0, 1], [1, 2], [0], [1])]
HIST = np.array([3, 4, 2, 0, 0, 0])


@pytest.mark.parametrize("policy, hits, evicted, overflow", [
    (LRUPolicy(), 2, 5, 0),
    (LFUPolicy(), 3, 4, 0),
    (FrequencyPolicy(HIST), 5, 4, 0),
    (FrequencyPolicy(HIST, admit_all=False), 7, 0, 2),
])
def test_exact_counts_on_a_hand_built_trace(policy, hits, evicted, overflow):
    stats = simulate(TRACE, 2, policy, num_rows=6)
    assert (stats.lookups, stats.hits, stats.misses) == (9, hits, 9 - hits)
    assert (stats.evicted, stats.overflow) == (evicted, overflow)


def test_frequency_warm_start_is_the_hottest_rows_smaller_id_first_on_ties():
    p = FrequencyPolicy(np.array([5, 0, 7, 5, 1]))
    assert p.warm_start(3).tolist() == [0, 2, 3]
    assert p.warm_start(10).tolist() == [0, 2, 3, 4]  # never preloads a row the data never uses


def test_lru_prefers_recent_and_lfu_frequent():
    lru, lfu = LRUPolicy(), LFUPolicy()
    for p in (lru, lfu):
        p.reset(4)
        p.record(np.array([0, 1]), 0)
        p.record(np.array([0]), 1)
        p.record(np.array([2]), 2)
    assert lru.scores(np.array([0, 1, 2, 3])).tolist() == [1, 0, 2, -1]
    assert lfu.scores(np.array([0, 1, 2, 3])).tolist() == [2, 1, 1, 0]


def test_policy_errors_name_what_is_wrong():
    with pytest.raises(ConfigError, match="needs histogram"):
        make_policy("frequency")
    with pytest.raises(ConfigError, match="one of"):
        make_policy("fifo")
    with pytest.raises(ConfigError, match="6 counts for a table of 7 rows"):
        simulate(TRACE, 2, FrequencyPolicy(HIST), num_rows=7)
