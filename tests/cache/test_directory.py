import numpy as np
import pytest

from haloflow.cache import CachePolicy, LFUPolicy, LRUPolicy, SlotDirectory, make_policy


def _full(ids, policy=None, rows=10):
    d = SlotDirectory(rows, len(ids), policy or LRUPolicy())
    d.plan(np.array(ids))
    return d


def test_misses_fill_free_slots_then_evict_the_coldest():
    d = SlotDirectory(10, 3, LRUPolicy())
    p = d.plan(np.array([4, 7]))
    assert p.load_ids.tolist() == [4, 7] and p.load_slots.tolist() == [0, 1] and p.evict_ids.size == 0
    d.plan(np.array([7]))  # 4 is now the least recent
    p = d.plan(np.array([1, 2]))  # one free slot, then evict 4
    assert sorted(p.load_ids.tolist()) == [1, 2]
    assert p.evict_ids.tolist() == [4] and p.evict_slots.tolist() == [0]
    assert d.slot_id.tolist() == [2, 7, 1]  # equal scores: the smaller id takes the first slot (the free one)
    assert d.lookup(np.array([4, 7])).tolist() == [-1, 1]


def test_more_distinct_ids_than_slots_overflow_instead_of_failing():
    d = SlotDirectory(10, 2, LFUPolicy())
    d.plan(np.array([5]))
    d.plan(np.array([5]))  # 5 is hot
    p = d.plan(np.array([1, 2, 3, 5]))
    assert p.slots[p.ids == 5] >= 0  # a hit keeps its slot
    assert (p.slots >= 0).sum() == 2 and p.overflow_ids.size == 2
    assert d.stats.overflow == 2 and d.stats.hits == 2


def test_pinned_slots_and_deferred_ids_are_never_touched():
    d = _full([0, 1])  # slots 0, 1 hold rows 0, 1
    p = d.plan(np.array([2, 3]), pinned=np.array([0, 1]), final=False)
    assert p.evict_ids.size == 0 and p.load_ids.size == 0  # nothing evictable
    assert d.lookup(np.array([0, 1])).tolist() == [0, 1]
    p = d.plan(np.array([2, 3]), pinned=np.array([0]), deferred=np.array([3]), record=False)
    assert p.load_ids.tolist() == [2] and p.evict_ids.tolist() == [1] and p.overflow_ids.tolist() == [3]
    # Without the pin the same batch would have evicted row 0: the pin is what protects it.
    d2 = _full([0, 1])
    assert 0 in d2.plan(np.array([2, 3])).evict_ids.tolist()


def test_counts_once_per_batch_when_replanned():
    d = SlotDirectory(10, 4, LRUPolicy())
    d.plan(np.array([1, 2]), final=False)
    d.plan(np.array([1, 2]), record=False)
    assert (d.stats.lookups, d.stats.hits, d.stats.misses, d.stats.admitted) == (2, 0, 2, 2)


class _Computed(CachePolicy):
    """The same policy with its scores computed (no score_table): the directory plans it with NumPy."""

    def __init__(self, inner):
        self.inner, self.name, self.admit_all = inner, inner.name, inner.admit_all

    def reset(self, num_rows):
        self.inner.reset(num_rows)

    def record(self, ids, clock):
        self.inner.record(ids, clock)

    def scores(self, ids):
        return self.inner.scores(ids)

    def warm_start(self, num_slots):
        return self.inner.warm_start(num_slots)


@pytest.mark.parametrize("name, admit_all", [("lru", True), ("lfu", True), ("frequency", True), ("frequency", False)])
def test_the_compiled_plan_decides_as_the_numpy_one(name, admit_all, rng):
    # Two directories, one planned by plan_kernel, one by NumPy, over a trace with ties, pins and deferred ids.
    n, slots = 60, 9
    trace = [np.unique((rng.zipf(1.3, 12) - 1) % n) for _ in range(80)]
    hist = np.bincount(np.concatenate(trace), minlength=n) // 2  # many equal counts: ties decide often
    fast = SlotDirectory(n, slots, make_policy(name, histogram=hist, admit_all=admit_all))
    slow = SlotDirectory(n, slots, _Computed(make_policy(name, histogram=hist, admit_all=admit_all)))
    assert fast.policy.score_table() is not None and slow.policy.score_table() is None
    for d in (fast, slow):
        d.warm()
    for i, ids in enumerate(trace):
        pinned = np.flatnonzero(fast.slot_id >= 0)[: i % 3]
        deferred = ids[::5] if i % 4 == 0 else np.empty(0, dtype=np.int64)
        a, b = (d.plan(ids, pinned=pinned, deferred=deferred, record=i % 7 != 3) for d in (fast, slow))
        for field in ("slots", "load_ids", "load_slots", "evict_ids", "evict_slots"):
            assert getattr(a, field).tolist() == getattr(b, field).tolist(), (i, field)
    assert fast.stats == slow.stats and (fast.stats.evicted > 0 or not admit_all)  # admit-only keeps its hot set


@pytest.mark.parametrize("num_slots, spread", [(40, 5), (700, 1000), (700, 2**60)])  # ties; wide; too wide to pack
def test_packed_keys_pick_the_coldest_victims(num_slots, spread, rng):
    from haloflow.cache.kernels import _coldest

    num_rows = 3 * num_slots
    slot_id = rng.permutation(num_rows)[:num_slots].astype(np.int64)
    slot_id[rng.random(num_slots) < 0.1] = -1  # free slots
    score = rng.integers(-1, spread, num_slots).astype(np.int64)
    blocked = rng.random(num_slots) < 0.1
    ok = np.flatnonzero((slot_id >= 0) & ~blocked)
    order = ok[np.lexsort((slot_id[ok], score[ok]))]  # by (score, id)
    for k in (1, 7, num_slots):
        ids, slots = _coldest(slot_id, score, blocked, k, num_rows)
        assert slots.tolist() == order[:k].tolist() and ids.tolist() == slot_id[order[:k]].tolist(), k
