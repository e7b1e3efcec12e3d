"""``BatchedTables`` (every table end to end, one lookup and one update) and ``CachedTables`` (the same with a
device cache directory): equal, bit for bit, to the per-table stores, whatever the cache's size, policy or
prefetch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from haloflow.cache import CachedEmbeddingBag, MemoryStore, make_optimizer
from haloflow.cache.batched import BatchedTables, padded_unique, pooled_sum
from haloflow.cache.batched_cache import CachedTables
from haloflow.errors import ConfigError

SIZES, D, B = (7, 50, 300, 1, 120), 8, 32
T = len(SIZES)
TABLES = torch.arange(T).repeat_interleave(B)  # the table of every bag, table-major


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(lengths (T, B), ids (nnz,), target (B, T, D)): skewed ids (a few rows hot, a long tail), 0-4 a bag."""
    g = torch.Generator().manual_seed(0)
    out = []
    for step in range(steps):
        lens = torch.randint(0, 5, (T, B), generator=g)
        rng = np.random.default_rng(step)
        ids = torch.cat([torch.as_tensor(rng.zipf(1.3, int(n_)) % n) for n, n_ in zip(SIZES, lens.sum(1))]).long()
        out.append((lens, ids, torch.randn(B, T, D, generator=g)))
    return out


def _weights() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(n, D, generator=g) for n in SIZES]


def _histogram(batches) -> np.ndarray:
    hist, off = np.zeros(sum(SIZES), dtype=np.int64), np.cumsum([0, *SIZES])
    for lens, ids, _ in batches:
        for t, chunk in enumerate(ids.split(lens.sum(1).tolist())):
            np.add.at(hist, chunk.numpy() + off[t], 1)
    return hist


def test_padded_unique_pads_to_the_input_length():
    x = torch.tensor([5, 2, 5, 9, 2, 0])
    uniq, inverse = padded_unique(x, 100)
    assert uniq.tolist() == [0, 2, 5, 9, 100, 100] and torch.equal(uniq[inverse], x)


def test_pooled_sum_adds_a_rows_occurrences_in_order():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 4, generator=g, requires_grad=True)
    inverse = torch.randint(0, 6, (40,), generator=g)
    lengths = torch.full((10,), 4)
    offsets = torch.arange(0, 41, 4)
    grad = torch.randn(10, 4, generator=g)
    pooled_sum(rows, inverse, offsets).backward(grad)
    expected = torch.zeros(6, 4)
    for j, r in enumerate(inverse.tolist()):  # one occurrence at a time, in order
        expected[r] += grad[j // 4]
    assert torch.equal(rows.grad, expected)
    assert lengths.sum() == inverse.numel()


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_one_lookup_for_all_tables_equals_a_bag_per_table(optimizer):
    opt = make_optimizer({"name": optimizer, "lr": 0.05})
    bags = [CachedEmbeddingBag(MemoryStore(w.clone(), opt), include_last_offset=True) for w in _weights()]
    batched = BatchedTables.from_weights(_weights(), opt)
    for lens, ids, tgt in _batches(12):
        offsets = [torch.cat([torch.zeros(1, dtype=torch.long), n.cumsum(0)]) for n in lens]
        per_table = torch.stack([b(i, o) for b, i, o in zip(bags, ids.split(lens.sum(1).tolist()), offsets)], 1)
        (per_table * tgt).sum().backward()
        for b in bags:
            b.step()
        one = batched.lookup(ids, lens.reshape(-1), TABLES, train=True).view(T, B, D).transpose(0, 1)
        (one * tgt).sum().backward()
        batched.step()
        assert torch.equal(per_table, one)
    for t, bag in enumerate(bags):
        for name, array in bag.store.state_dict().items():
            assert torch.equal(array, batched.table(t).state_dict()[name]), (t, name)


def _train(tables, batches, prefetch: str) -> list[torch.Tensor]:
    """Train through ``tables``; a lookahead directory is told the batches up to its window ahead of each plan."""
    outs, told = [], 0

    def announce(upto: int) -> None:
        nonlocal told
        while getattr(tables, "policy", None) == "lookahead" and told <= min(upto, len(batches) - 1):
            lens, ids, _ = batches[told]
            tables.announce(ids, lens.reshape(-1), TABLES)
            told += 1

    for i, (lens, ids, tgt) in enumerate(batches):
        announce(i + getattr(tables, "window", 0))
        if prefetch != "none" and i == 0:
            tables.prefetch(ids, lens.reshape(-1), TABLES)
        out = tables.lookup(ids, lens.reshape(-1), TABLES, train=True).view(T, B, D).transpose(0, 1)
        (out * tgt).sum().backward()
        if prefetch != "none" and i + 1 < len(batches):  # the next batch's moves before this one's update
            announce(i + 1 + tables.window)
            nl, ni, _ = batches[i + 1]
            tables.prefetch(ni, nl.reshape(-1), TABLES, background=prefetch == "background")
        tables.step()
        outs.append(out.detach())
    return outs


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("policy", ["lru", "lfu", "frequency", "lookahead", "lookahead-online"])
@pytest.mark.parametrize("prefetch", ["none", "inline", "background"])
def test_cached_tables_train_the_uncached_floats(optimizer, policy, prefetch):
    """3 slots (nearly every row overflows), 40 (evictions every batch) and all rows: the same bits. (lookahead:
    the next 4 batches announced, from the histogram; -online: counting uses instead, Belady's bypass)."""
    batches = _batches(20)
    opt = make_optimizer({"name": optimizer, "lr": 0.05})
    ref_tables = BatchedTables.from_weights(_weights(), opt)
    ref = _train(ref_tables, batches, "none")
    weights = _weights()
    for slots in (3, 40, sum(SIZES)):
        online = policy == "lookahead-online"
        cached = CachedTables(SIZES, D, opt, num_slots=slots, init=lambda t: weights[t], policy=policy.split("-")[0],
                              histogram=None if online else _histogram(batches), window=4, admit_all=not online)
        outs = _train(cached, batches, prefetch)
        assert all(torch.equal(a, b) for a, b in zip(ref, outs)), slots
        for name, array in ref_tables.state_dict().items():
            assert torch.equal(array, cached.state_dict()[name]), (slots, name)
        st = cached.stats()
        assert st.lookups > 0 and st.hits > 0
        if slots == 3:
            assert st.overflow > 0  # more distinct rows a batch than slots: served from the backing rows
        if slots == 40:
            assert st.evicted > 0 and st.written_back > 0
        if slots == sum(SIZES):
            assert st.overflow == 0 and st.evicted == 0


def test_a_lost_write_back_shows(monkeypatch):
    """Control: a cache that forgets dirty rows when it evicts them trains other floats."""
    batches = _batches(12)
    opt = make_optimizer({"name": "sgd", "lr": 0.05})
    ref = _train(BatchedTables.from_weights(_weights(), opt), batches, "none")
    weights = _weights()
    cached = CachedTables(SIZES, D, opt, num_slots=40, init=lambda t: weights[t])
    step = cached.step

    def forgetful() -> None:
        step()
        cached.dirty.fill_(False)  # updates in slots never reach the backing rows

    monkeypatch.setattr(cached, "step", forgetful)
    outs = _train(cached, batches, "none")
    assert not all(torch.equal(a, b) for a, b in zip(ref, outs))


def test_a_table_of_cached_tables_saves_and_loads_through_its_rows():
    batches = _batches(6)
    opt = make_optimizer({"name": "adagrad", "lr": 0.05})
    weights = _weights()
    cached = CachedTables(SIZES, D, opt, num_slots=40, init=lambda t: weights[t])
    _train(cached, batches, "none")
    saved = [{k: v.clone() for k, v in cached.table(t).state_dict().items()} for t in range(T)]
    fresh = CachedTables(SIZES, D, opt, num_slots=40)
    for t in range(T):
        fresh.table(t).load_state_dict(saved[t])
    more = _batches(8)[6:]
    assert all(torch.equal(a, b) for a, b in zip(_train(cached, more, "none"), _train(fresh, more, "none")))


def test_bad_cache_settings_are_named():
    opt = make_optimizer({"name": "sgd", "lr": 0.1})
    with pytest.raises(ConfigError, match="0 cache slots for tables of 478 rows"):
        CachedTables(SIZES, D, opt, num_slots=0)
    with pytest.raises(ConfigError, match="'frequency' ranks rows by their count in the data"):
        CachedTables(SIZES, D, opt, num_slots=4, policy="frequency")
    with pytest.raises(ConfigError, match="expected one of"):
        CachedTables(SIZES, D, opt, num_slots=4, policy="belady")


def test_lookups_without_an_update_between_steps_change_nothing():
    """An evaluation lookup (no update follows: it admits nothing) between a prefetch and the steps around it."""
    batches = _batches(10)
    opt = make_optimizer({"name": "adagrad", "lr": 0.05})
    ref = BatchedTables.from_weights(_weights(), opt)
    weights = _weights()
    cached = CachedTables(SIZES, D, opt, num_slots=40, init=lambda t: weights[t])
    for i, (lens, ids, tgt) in enumerate(batches[:-1]):
        outs = []
        for tables in (ref, cached):
            out = tables.lookup(ids, lens.reshape(-1), TABLES, train=True).view(T, B, D).transpose(0, 1)
            (out * tgt).sum().backward()
            if tables is cached:
                nl, ni, _ = batches[i + 1]
                cached.prefetch(ni, nl.reshape(-1), TABLES)
            el, ei, _ = batches[-1]  # an evaluation batch, looked up with the step still to come
            outs.append(tables.lookup(ei, el.reshape(-1), TABLES, train=False))
            tables.step()
        assert torch.equal(outs[0], outs[1]), i
    for name, array in ref.state_dict().items():
        assert torch.equal(array, cached.state_dict()[name])


def test_the_device_lookahead_directory_hits_within_3_percent_of_belady():
    """The trainer's policy on a Zipf trace at 1 % of the rows: lookahead (the next 16 batches announced, Belady's
    bypass) within 3 % of Belady's hit rate, as the host's LookaheadPolicy is; LRU, the control, far below."""
    from haloflow.bench.cache import zipf_ids
    from haloflow.cache import belady_hits, make_policy, simulate
    from haloflow.cache.batched_cache import simulate_tables

    n = 20_000
    col = zipf_ids(np.random.default_rng(0), n, 300 * 256, 1.05)
    trace = [col[i:i + 256] for i in range(0, col.size, 256)]
    slots, hist = n // 100, np.bincount(col, minlength=n)
    best = belady_hits(trace, slots, num_rows=n)
    device = simulate_tables(trace, slots, "lookahead", num_rows=n, histogram=hist, admit_all=False)
    online = simulate_tables(trace, slots, "lookahead", num_rows=n, admit_all=False)  # no histogram
    host = simulate(trace, slots, make_policy("lookahead", histogram=hist, admit_all=False), num_rows=n)
    lru = simulate_tables(trace, slots, "lru", num_rows=n)
    assert device.hits >= 0.97 * best and online.hits >= 0.97 * best, (device.hits, online.hits, best)
    assert abs(device.hits - host.hits) <= 0.005 * best  # the host policy it follows
    assert lru.hits < 0.8 * best


def test_an_empty_batch_and_int32_ids_and_half_tables_train_as_before():
    """Inputs the compiled bodies hand to the stock formulas or must take as the stock formulas do: a batch with
    no ids (every bag empty), int32 ids past 2^19 rows (a packing that shifted int32 values would overflow), and
    float16 rows (numba has no half type): each gives what the stock torch ops give."""
    sgd = make_optimizer({"name": "sgd", "lr": 0.5})
    for tables in (CachedTables([5, 6], 4, sgd, num_slots=3), BatchedTables([5, 6], 4, sgd)):
        empty = tables.lookup(torch.empty(0, dtype=torch.int64), torch.tensor([0, 0]), torch.tensor([0, 1]),
                              train=True)
        assert empty.shape == (2, 4) and not empty.any()
        empty.sum().backward()
        tables.step()
    sizes = [600_000, 10]
    g = torch.Generator().manual_seed(4)
    ids = torch.cat([torch.randint(0, sizes[0], (2_990,), generator=g), torch.randint(0, 10, (10,), generator=g)])
    lengths, which = torch.tensor([2_990, 10]), torch.tensor([0, 1])
    init = lambda t: torch.randn(sizes[t], 4, generator=torch.Generator().manual_seed(t))  # noqa: E731
    runs = []
    for dtype in (torch.int64, torch.int32):
        tables = BatchedTables(sizes, 4, sgd, init=init)
        out = tables.lookup(ids.to(dtype), lengths, which, train=True)
        (out * torch.arange(4.0)).sum().backward()
        tables.step()
        runs.append((out.detach(), tables.state_dict()["weight"].clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    half = BatchedTables([5, 6], 4, sgd, dtype=torch.float16, init=lambda t: torch.ones(5 + t, 4))
    out = half.lookup(torch.tensor([1, 1, 4]), torch.tensor([2, 1]), torch.tensor([0, 1]), train=True)
    out.sum().backward()
    half.step()
    assert out.dtype == torch.float16 and half.state_dict()["weight"][1, 0] == 0.0  # 1 - 0.5 * 2
