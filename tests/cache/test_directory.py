import numpy as np

from haloflow.cache import LFUPolicy, LRUPolicy, SlotDirectory


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
