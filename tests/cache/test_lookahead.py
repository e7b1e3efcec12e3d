"""LookaheadPolicy on the hand-built trace of test_policy (S = 2 slots, W = 2 batches announced ahead)::

    batch   0      1    2      3      4    5
    ids     [0 1]  [2]  [0 1]  [1 2]  [0]  [1]      histogram: 0 -> 3, 1 -> 4, 2 -> 2

    admit only sooner, no histogram: {0,1} filled cold; 2's next use (3) is later than 0's and 1's (2): bypassed;
        at 3, 2 is not used within 4..5: bypassed again                     hits 0 0 2 1 1 1 = 5, overflow 2
    the same with the histogram (warm start {0,1}): Belady's count          hits 2 0 2 1 1 1 = 7
    admit all, no histogram: 1: 2 evicts 0 (tie, smaller id); 2: 0 evicts 2 (1 is a hit); 3: 2 evicts 0;
        4: 0 evicts 2 (not used within 5..6; 1 is used at 5)                hits 0 0 1 1 0 1 = 3, evicted 4
"""

import numpy as np
import pytest
import torch

from haloflow.cache import (SGD, BackingStore, CachedEmbeddingBag, CachedStore, LookaheadPolicy, belady_hits,
                            make_policy, simulate)
from haloflow.errors import ConfigError
from tests.cache.test_policy import HIST, TRACE


@pytest.mark.parametrize("histogram, admit_all, hits, evicted, overflow", [
    (None, False, 5, 0, 2),
    (HIST, False, 7, 0, 2),
    (None, True, 3, 4, 0),
])
def test_exact_counts_on_a_hand_built_trace(histogram, admit_all, hits, evicted, overflow):
    stats = simulate(TRACE, 2, LookaheadPolicy(2, histogram=histogram, admit_all=admit_all), num_rows=6)
    assert (stats.lookups, stats.hits, stats.evicted, stats.overflow) == (9, hits, evicted, overflow)


def test_between_the_best_online_policy_and_belady_and_closer_with_a_longer_window(rng):
    n, slots = 500, 50
    trace = [(rng.zipf(1.2, 10) - 1) % n for _ in range(150)]
    hist = np.bincount(np.concatenate(trace), minlength=n)
    best = belady_hits(trace, slots, num_rows=n)
    freq = simulate(trace, slots, make_policy("frequency", histogram=hist, admit_all=False), num_rows=n).hits
    ahead = [simulate(trace, slots, LookaheadPolicy(w, histogram=hist), num_rows=n).hits for w in (1, 4, 32)]
    assert freq < ahead[0] <= ahead[1] <= ahead[2] <= best
    assert ahead[2] > 0.97 * best


def test_the_store_counts_what_the_simulation_predicts(rng):
    # The store's driver announces W batches ahead, as simulate does: the same decisions, the same counters.
    n, slots, w = 50, 7, 3
    trace = [torch.from_numpy((rng.zipf(1.4, 20) - 1) % n) for _ in range(30)]
    predicted = simulate([t.numpy() for t in trace], slots, LookaheadPolicy(w), num_rows=n)
    bag = CachedEmbeddingBag(CachedStore(BackingStore.in_memory(n, 3, SGD()), num_slots=slots,
                                         policy=LookaheadPolicy(w)))
    for t in trace[:w]:
        bag.upcoming(t)
    for i, t in enumerate(trace):
        if i + w < len(trace):
            bag.upcoming(trace[i + w])
        bag.store.gather(t)
    st = bag.store.stats
    assert (st.hits, st.evicted, st.overflow) == (predicted.hits, predicted.evicted, predicted.overflow)


def test_without_announcements_it_is_lfu():
    # Nothing announced: every row is beyond the window, so the online counts decide, as LFU's do.
    lfu = simulate(TRACE, 2, make_policy("lfu"), num_rows=6)
    policy = LookaheadPolicy(2, admit_all=True)
    policy.window = 0  # the simulation then announces nothing
    assert simulate(TRACE, 2, policy, num_rows=6) == lfu


def test_errors_name_the_argument():
    with pytest.raises(ConfigError, match=r"window must be in 1..65536 batches, got 0"):
        LookaheadPolicy(0)
    with pytest.raises(ConfigError, match="6 counts for a table of 7 rows"):
        simulate(TRACE, 2, LookaheadPolicy(2, histogram=HIST), num_rows=7)
