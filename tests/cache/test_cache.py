"""CachedStore: exact training at every cache size, prefetch without stale rows, round trips, errors."""

import numpy as np
import pytest
import torch

from haloflow.cache import (SGD, Adagrad, BackingStore, CacheConfig, CachedEmbeddingBag, CachedStore, MemoryStore,
                            RowStore, RowWiseAdagrad, make_policy)
from haloflow.errors import ConfigError
from tests.cache.conftest import zipf_batches

N, D, STEPS = 24, 3, 50
OPTIMIZERS = {"sgd": SGD(lr=0.1), "adagrad": Adagrad(lr=0.1), "rowwise": RowWiseAdagrad(lr=0.1)}
POLICY_CASES = [("lru", True), ("lfu", True), ("frequency", True), ("frequency", False), ("lookahead", True),
                ("lookahead", False)]
WINDOW = 4  # batches announced ahead to a lookahead policy


def _w0():
    return torch.empty(N, D).uniform_(-1, 1, generator=torch.Generator().manual_seed(0))


def _batches():
    return zipf_batches(np.random.default_rng(5), N, STEPS + 1, nnz=16, bags=4, a=1.2)


def train(store, batches, prefetch=False, finish=True):
    """STEPS steps of a random linear loss on sum-pooled bags, the next batch prefetched during each step, WINDOW
    batches announced ahead (used by a lookahead policy only); then (``finish``) a copy of the store's state_dict."""
    bag = CachedEmbeddingBag(store)
    g = torch.Generator().manual_seed(1)
    for ids, _ in batches[:WINDOW]:
        bag.upcoming(ids)
    for i in range(STEPS):
        if i + WINDOW < STEPS:
            bag.upcoming(batches[i + WINDOW][0])
        ids, offsets = batches[i]
        out = bag(ids, offsets)  # (B, D)
        if prefetch:
            bag.prefetch(batches[i + 1][0])
        (out * torch.randn(out.shape, generator=g)).sum().backward()
        bag.step()
    if not finish:
        return None
    return {k: v.clone() for k, v in store.state_dict().items()}


_REFERENCE = {}


def reference(opt_name):
    if opt_name not in _REFERENCE:
        _REFERENCE[opt_name] = train(MemoryStore(_w0(), OPTIMIZERS[opt_name]), _batches())
    return _REFERENCE[opt_name]


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("policy, admit_all", POLICY_CASES)
@pytest.mark.parametrize("prefetch, overlap", [(False, None), (True, None), (True, True)])
def test_identical_to_the_uncached_table_at_every_size(opt_name, policy, admit_all, prefetch, overlap):
    batches = _batches()
    hist = np.bincount(torch.cat([b[0] for b in batches]).numpy(), minlength=N)
    ref = reference(opt_name)
    evicted = 0
    for slots in (1, 2, 5, 12, N):
        backing = BackingStore.in_memory(N, D, OPTIMIZERS[opt_name], weight=_w0())
        store = CachedStore(backing, num_slots=slots, overlap=overlap,
                            policy=make_policy(policy, histogram=hist, admit_all=admit_all, window=WINDOW))
        got = train(store, batches, prefetch)
        for k in ref:
            assert torch.equal(got[k], ref[k]), (slots, k)
        if slots == 1:
            assert store.stats.overflow > 0
        evicted += store.stats.evicted
        store.close()
    assert evicted > 0 or not admit_all  # the small caches really did evict and write back


@pytest.mark.parametrize("prefetch, overlap", [(False, None), (True, False), (True, True), (True, None)])
def test_memory_mapped_backing_is_exact_too(tmp_path, prefetch, overlap):
    backing = BackingStore.create(tmp_path / "t", N, D, Adagrad(lr=0.1), weight=_w0())
    store = CachedStore(backing, num_slots=4, policy=make_policy("lfu"), overlap=overlap)
    got = train(store, _batches(), prefetch)
    for k, v in reference("adagrad").items():
        assert torch.equal(got[k], v)
    store.close()


def test_prefetch_never_evicts_or_stales_the_current_batch():
    # 2 slots; batch i = rows {0, 1} fills them; batch i+1 = {2, 3} would evict both. The prefetch runs between
    # gather(i) and apply_gradients(i), FBGEMM's stale-row window.
    w0 = torch.zeros(6, 2)
    store = CachedStore(BackingStore.in_memory(6, 2, SGD(lr=1.0), weight=w0), num_slots=2, overlap=True)
    rows = store.gather(torch.tensor([0, 1]))
    store.prefetch(torch.tensor([2, 3]))
    assert store.directory.lookup(np.array([0, 1])).tolist() == [0, 1]  # pinned: still in their slots
    store.apply_gradients(torch.tensor([0, 1]), torch.ones(2, 2))
    assert store.gather(torch.tensor([2, 3, 0])).tolist() == [[0, 0], [0, 0], [-1, -1]]
    store.apply_gradients(torch.tensor([0, 2, 3]), torch.ones(3, 2))
    assert store.state_dict()["weight"].tolist() == [[-2, -2], [-1, -1], [-1, -1], [-1, -1], [0, 0], [0, 0]]
    assert rows.tolist() == [[0, 0], [0, 0]]  # gather returned a copy


def test_prefetch_defers_rows_the_current_batch_updates_in_the_backing_store():
    # 1 slot: batch i = {0, 1} leaves row 1 in the backing store (overflow); batch i+1 = {1, 2}. Loading row 1
    # during the prefetch would read it before batch i's update: batch i+1 reads it from the backing store.
    store = CachedStore(BackingStore.in_memory(3, 1, SGD(lr=1.0), weight=torch.zeros(3, 1)), num_slots=1,
                        overlap=True)
    store.gather(torch.tensor([0, 1]))
    store.prefetch(torch.tensor([1, 2]))
    assert store.directory.lookup(np.array([1])).tolist() == [-1]
    store.apply_gradients(torch.tensor([0, 1]), torch.ones(2, 1))
    assert store.gather(torch.tensor([1, 2])).tolist() == [[-1.0], [0.0]]


def test_prefetch_is_skipped_where_it_cannot_overlap():
    # overlap=False: prefetch does nothing, and the next gather plans its batch as without one.
    store = CachedStore(BackingStore.in_memory(4, 1, SGD(lr=1.0), weight=torch.zeros(4, 1)), num_slots=2,
                        overlap=False)
    store.gather(torch.tensor([0]))
    store.prefetch(torch.tensor([1, 2]))
    assert store.directory.lookup(np.array([1, 2])).tolist() == [-1, -1] and store.stats.lookups == 1
    store.apply_gradients(torch.tensor([0]), torch.ones(1, 1))
    assert store.gather(torch.tensor([1, 2])).tolist() == [[0.0], [0.0]] and store.stats.lookups == 3


def test_a_prefetched_batch_is_not_planned_again():
    # 2 slots hold batch i = {0, 1}, pinned while the prefetch of {2} is planned: 2 is left out (no victim), not
    # deferred (batch i does not update it). gather then serves 2 from the backing store instead of planning the
    # whole batch again (an O(S) pass over the slots per batch made prefetch slower than none).
    store = CachedStore(BackingStore.in_memory(4, 1, SGD(lr=1.0), weight=torch.zeros(4, 1)), num_slots=2,
                        overlap=True)
    store.gather(torch.tensor([0, 1]))
    store.prefetch(torch.tensor([2]))
    store.apply_gradients(torch.tensor([0, 1]), torch.ones(2, 1))
    assert store.gather(torch.tensor([2])).tolist() == [[0.0]]
    assert store.directory.lookup(np.array([0, 1, 2])).tolist() == [0, 1, -1]
    assert (store.stats.overflow, store.stats.evicted) == (1, 0)


def test_overflow_batches_larger_than_the_cache():
    store = CachedStore(BackingStore.in_memory(10, 2, SGD(lr=1.0), weight=torch.zeros(10, 2)), num_slots=3)
    ids = torch.arange(10)
    assert store.gather(ids).shape == (10, 2)
    store.apply_gradients(ids, torch.ones(10, 2))
    assert store.stats.overflow == 7 and store.stats.admitted == 3
    assert (store.state_dict()["weight"] == -1).all()


def test_only_dirty_victims_are_written_back():
    store = CachedStore(BackingStore.in_memory(8, 2, SGD(), weight=torch.zeros(8, 2)), num_slots=2)
    store.gather(torch.tensor([0, 1]))
    store.apply_gradients(torch.tensor([0]), torch.ones(1, 2))  # row 0 dirty, row 1 clean
    store.gather(torch.tensor([2, 3]))  # evicts both
    assert (store.stats.evicted, store.stats.written_back) == (2, 1)
    assert store.stats.bytes_to_host == 8 and store.stats.bytes_to_device == 4 * 8


def test_flush_state_dict_load_round_trip(tmp_path):
    batches = _batches()
    store = CachedStore(BackingStore.create(tmp_path / "a", N, D, Adagrad(lr=0.1), weight=_w0()), num_slots=3)
    train(store, batches, finish=False)
    assert store.dirty.any()
    state = {k: v.clone() for k, v in store.state_dict().items()}
    assert not store.dirty.any()
    for k, v in reference("adagrad").items():
        assert torch.equal(state[k], v)  # complete, although some rows were only in slots
    other = CachedStore(BackingStore.in_memory(N, D, Adagrad(lr=0.1)), num_slots=5)
    other.load_state_dict(state)
    for k, v in state.items():
        assert torch.equal(other.state_dict()[k], v)
    assert torch.equal(other.gather(torch.arange(N)), state["weight"])
    store.close()
    reopened = CachedStore(BackingStore.open(tmp_path / "a"), num_slots=2)
    for k, v in state.items():
        assert torch.equal(reopened.state_dict()[k], v)
    reopened.close()


def test_config_and_errors_name_the_table():
    backing = BackingStore.in_memory(100, 4, Adagrad(), name="t7")  # 32 bytes per row with its state
    assert CacheConfig(ratio=0.01).slots_for(100) == 1 and CacheConfig(ratio=0.015).slots_for(100) == 2
    with pytest.raises(ConfigError, match=r"table 't7': 101 cache slots for 100 rows"):
        CachedStore(backing, num_slots=101)
    with pytest.raises(ConfigError, match=r"table 't7': 10 cache slots x 32 bytes .* = 320 bytes, over max_bytes "
                                          r"300; at most 9 slots fit"):
        CachedStore.from_config(backing, CacheConfig(num_slots=10, max_bytes=300))
    with pytest.raises(ConfigError, match="exactly one of num_slots and ratio"):
        CacheConfig(num_slots=3, ratio=0.1)
    with pytest.raises(ConfigError, match=r"ratio must be in \(0, 1\]"):
        CacheConfig(ratio=1.5)
    with pytest.raises(ConfigError, match="policy must be one of"):
        CacheConfig(ratio=0.1, policy="fifo")
    store = CachedStore(backing, num_slots=4)
    assert isinstance(store, RowStore)
    with pytest.raises(ConfigError, match=r"table 't7': id 100 outside its rows 0..99"):
        store.gather(torch.tensor([3, 100]))
