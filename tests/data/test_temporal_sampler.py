import numpy as np
import pytest

from haloflow.data.temporal import TemporalEvents
from haloflow.data.temporal_sampler import NegativeSampler, TemporalCSR
from haloflow.errors import ConfigError

# The module docstring's stream: 0: (0,1,t=5)  1: (1,2,t=7)  2: (0,2,t=7)  3: (2,1,t=9)
DOC = TemporalEvents(src=[0, 1, 0, 2], dst=[1, 2, 2, 1], t=[5, 7, 7, 9], num_nodes=3)

# Five events, a self-loop and a tie at t=4:  0: (0,1,1)  1: (1,2,4)  2: (0,2,4)  3: (3,3,6)  4: (1,0,8)
FIVE = TemporalEvents(src=[0, 1, 0, 3, 1], dst=[1, 2, 2, 3, 0], t=[1, 4, 4, 6, 8], num_nodes=5)


def test_csr_layout_of_the_docstring_example():
    csr = TemporalCSR.from_events(DOC)
    np.testing.assert_array_equal(csr.indptr, [0, 2, 5, 8])
    np.testing.assert_array_equal(csr.nbr, [1, 2, 0, 2, 2, 1, 0, 1])
    np.testing.assert_array_equal(csr.eid, [0, 2, 0, 1, 3, 1, 2, 3])
    np.testing.assert_array_equal(csr.t, [5, 7, 5, 7, 9, 7, 7, 9])


def test_recent_neighbours_exact_on_five_events():
    csr = TemporalCSR.from_events(FIVE)
    nodes = np.array([1, 1, 1, 0, 2, 3, 3, 4])
    times = np.array([9, 8, 4.5, 4, 4, 6, 7, 9])
    out = csr.sample_recent(nodes, times, k=3)
    pad = -1
    np.testing.assert_array_equal(out.ids, [
        [0, 2, 0],       # node 1 before 9: events 4 (->0), 1 (->2), 0 (->0), newest first
        [2, 0, pad],     # before 8: event 4 at t=8 is the query's own time, never returned
        [2, 0, pad],     # before 4.5: event 1 (t=4), event 0 (t=1)
        [1, pad, pad],   # node 0 before 4: event 2 at t=4 excluded
        [pad, pad, pad],  # node 2 before 4: both its events are at t=4
        [pad, pad, pad],  # node 3 before 6: its self-loop is at t=6
        [3, 3, pad],     # before 7: the self-loop, once from each side
        [pad, pad, pad],  # node 4 never appears
    ])
    np.testing.assert_array_equal(out.eids[0], [4, 1, 0])
    np.testing.assert_array_equal(out.eids[6], [3, 3, -1])
    np.testing.assert_array_equal(out.times[0], [8, 4, 1])
    np.testing.assert_array_equal(out.mask, out.ids != pad)
    assert (out.times[~out.mask] == 0).all()


def test_same_time_neighbours_come_newest_event_first():
    csr = TemporalCSR.from_events(FIVE)
    out = csr.sample_recent(np.array([2]), np.array([5.0]), k=2)
    np.testing.assert_array_equal(out.eids, [[2, 1]])  # both at t=4: event 2 came later in the stream
    np.testing.assert_array_equal(out.ids, [[0, 1]])


def test_csr_of_kept_events_keeps_global_event_ids():
    keep = np.array([True, False, True, True, False])
    csr = TemporalCSR.from_events(FIVE, keep=keep)
    assert set(csr.eid.tolist()) == {0, 2, 3}
    out = csr.sample_recent(np.array([2]), np.array([10.0]), k=5)
    np.testing.assert_array_equal(out.eids[0], [2, -1, -1, -1, -1])
    np.testing.assert_array_equal(csr.degree(), [2, 1, 1, 2, 0])


def _brute_recent(src, dst, t, node, time, k):
    """Newest-first events touching ``node`` strictly before ``time``, one entry per side (self-loops twice)."""
    hits = []
    for e in range(len(src)):
        if t[e] >= time:
            continue
        if src[e] == node:
            hits.append((t[e], e, 0, dst[e]))
        if dst[e] == node:
            hits.append((t[e], e, 1, src[e]))
    hits.sort(key=lambda h: (h[0], h[1], h[2]), reverse=True)
    return hits[:k]


@pytest.mark.parametrize("seed", range(6))
def test_recent_neighbours_equal_brute_force_and_never_reach_the_query_time(seed):
    rng = np.random.default_rng(seed)
    n, e, k = int(rng.integers(2, 12)), int(rng.integers(0, 80)), int(rng.integers(0, 6))
    t = np.sort(rng.integers(0, 20, e))  # many ties
    if seed % 2:
        t = np.sort(rng.random(e) * 20)
    ev = TemporalEvents(src=rng.integers(0, n, e), dst=rng.integers(0, n, e), t=t, num_nodes=n)
    csr = TemporalCSR.from_events(ev)
    q = 50
    nodes = rng.integers(0, n, q)
    times = np.where(rng.random(q) < 0.5, rng.integers(0, 22, q), rng.random(q) * 22)
    out = csr.sample_recent(nodes, times, k)
    assert out.ids.shape == (q, k)
    assert (out.times[out.mask] < np.repeat(times, k).reshape(q, k)[out.mask]).all()
    for i in range(q):
        ref = _brute_recent(ev.src, ev.dst, ev.t, nodes[i], times[i], k)
        m = len(ref)
        assert out.mask[i].sum() == m
        np.testing.assert_array_equal(out.eids[i, :m], [h[1] for h in ref])
        np.testing.assert_array_equal(out.ids[i, :m], [h[3] for h in ref])
        np.testing.assert_array_equal(out.times[i, :m], [h[0] for h in ref])
        assert (ev.t[out.eids[i, :m]] < times[i]).all()


@pytest.mark.parametrize(
    "nodes, times, k, match",
    [
        ([5], [1.0], 2, r"node 5 is outside \[0, 5\)"),
        ([-1], [1.0], 2, r"node -1 is outside"),
        ([0], [1.0], -1, "k must be >= 0, got -1"),
        ([0, 1], [1.0], 1, r"nodes \(n,\) and times \(n,\), got \(2,\) and \(1,\)"),
    ],
)
def test_sample_recent_errors(nodes, times, k, match):
    with pytest.raises(ConfigError, match=match):
        TemporalCSR.from_events(FIVE).sample_recent(np.array(nodes), np.array(times), k)


def test_keep_mask_must_be_bool_per_event():
    with pytest.raises(ConfigError, match=r"keep must be a bool mask of shape \(5,\)"):
        TemporalCSR.from_events(FIVE, keep=np.array([0, 2]))


# --------------------------------------------------------------------------------------------- negatives
def test_negatives_are_a_function_of_the_event_id_only():
    sampler = NegativeSampler(candidates=np.arange(10, 50), seed=7)
    ids = np.arange(1000, 1400)
    whole = sampler.sample(ids, stream=2)
    assert np.isin(whole, sampler.candidates).all()
    halves = np.concatenate([sampler.sample(ids[200:], stream=2), sampler.sample(ids[:200], stream=2)])
    np.testing.assert_array_equal(np.concatenate([whole[200:], whole[:200]]), halves)  # any split, any order
    assert (sampler.sample(ids, stream=3) != whole).mean() > 0.9  # another epoch: fresh draws
    assert (NegativeSampler(candidates=np.arange(10, 50), seed=8).sample(ids, stream=2) != whole).mean() > 0.9
    counts = np.bincount(sampler.sample(np.arange(40_000)) - 10, minlength=40)
    assert counts.min() > 850 and counts.max() < 1150  # ~1,000 each: uniform


def test_fixed_negatives_are_distinct_exclude_the_truth_and_do_not_depend_on_the_batch():
    sampler = NegativeSampler(candidates=np.arange(0, 30, 3), seed=1)  # 10 candidates: 0, 3, ..., 27
    ids = np.arange(50)
    true_dst = np.where(ids % 2 == 0, (ids % 10) * 3, 1)  # odd events: a destination that is no candidate
    for num in (1, 3, 9):  # 9 = every other candidate (the bitmap path); 1, 3: the scan path
        fixed = sampler.sample_fixed(ids, true_dst, num)
        assert fixed.shape == (50, num)
        for i in range(50):
            assert len(set(fixed[i].tolist())) == num
            assert true_dst[i] not in fixed[i]
            assert np.isin(fixed[i], sampler.candidates).all()
        np.testing.assert_array_equal(sampler.sample_fixed(ids[::-1], true_dst[::-1], num), fixed[::-1])
    every = sampler.sample_fixed(ids[:1], true_dst[:1], 9)
    assert sorted(every[0].tolist()) == list(range(3, 30, 3))  # all candidates but the truth (0)


def test_negative_sampler_from_destinations_and_errors():
    s = NegativeSampler.from_destinations(FIVE, np.array([0, 1, 4]))
    np.testing.assert_array_equal(s.candidates, [0, 1, 2])
    with pytest.raises(ConfigError, match="ascending and distinct"):
        NegativeSampler(candidates=np.array([3, 1]))
    with pytest.raises(ConfigError, match="non-empty 1-D"):
        NegativeSampler(candidates=np.array([], dtype=np.int64))
    with pytest.raises(ConfigError, match=r"num must be in \[0, 2\]"):
        s.sample_fixed(np.array([0]), np.array([1]), 3)
    with pytest.raises(ConfigError, match="event ids must be >= 0"):
        s.sample(np.array([-1]))
