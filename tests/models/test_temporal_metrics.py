import numpy as np
import pytest

from haloflow.data.temporal import TemporalEvents
from haloflow.data.temporal_sampler import NegativeSampler
from haloflow.errors import HaloflowError
from haloflow.models.temporal_metrics import EdgeBank, average_precision, mean_reciprocal_rank, roc_auc


def _brute_ap(pos, neg):
    """Mean over positives of the precision among everything scored >= that positive (ties count as above)."""
    scores = np.concatenate([pos, neg])
    return np.mean([(pos >= s).sum() / (scores >= s).sum() for s in pos])


def _brute_auc(pos, neg):
    return np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg])


def test_docstring_example():
    pos, neg = np.array([0.9, 0.4]), np.array([0.4, 0.1])
    assert average_precision(pos, neg) == pytest.approx((1 + 2 / 3) / 2)
    assert roc_auc(pos, neg) == pytest.approx(0.875)


@pytest.mark.parametrize("seed", range(5))
def test_ap_and_auc_equal_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    pos = rng.integers(0, 6, int(rng.integers(1, 40))) / 5.0  # few distinct values: many ties
    neg = rng.integers(0, 5, int(rng.integers(1, 40))) / 5.0
    assert average_precision(pos, neg) == pytest.approx(_brute_ap(pos, neg), abs=1e-12)
    assert roc_auc(pos, neg) == pytest.approx(_brute_auc(pos, neg), abs=1e-12)
    pos, neg = rng.normal(1, 1, 300), rng.normal(0, 1, 200)  # no ties
    assert average_precision(pos, neg) == pytest.approx(_brute_ap(pos, neg), abs=1e-12)
    assert roc_auc(pos, neg) == pytest.approx(_brute_auc(pos, neg), abs=1e-12)


def test_extreme_rankings():
    assert average_precision([3, 4], [1, 2]) == 1.0 and roc_auc([3, 4], [1, 2]) == 1.0
    assert roc_auc([1, 2], [3, 4]) == 0.0
    assert average_precision([1, 1], [1, 1, 1]) == pytest.approx(2 / 5)  # one threshold: precision = P / (P + N)
    assert roc_auc([1, 1], [1, 1, 1]) == 0.5


def test_mrr_counts_ties_half_way():
    pos = np.array([0.5, 0.2])
    neg = np.array([[0.1, 0.9, 0.5], [0.0, 0.1, 0.1]])
    # row 0: one negative above, one tied -> rank 1 + (1 + 2) / 2 = 2.5; row 1: rank 1
    assert mean_reciprocal_rank(pos, neg) == pytest.approx((1 / 2.5 + 1) / 2)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: average_precision([], [1.0]), "at least one positive and one negative"),
        (lambda: roc_auc([np.nan], [1.0]), "NaN"),
        (lambda: mean_reciprocal_rank(np.ones(2), np.ones((3, 4))), r"pos \(n,\) and neg \(n, Q\)"),
    ],
)
def test_metric_errors(call, match):
    with pytest.raises(HaloflowError, match=match):  # NaN scores: RunFailed (a failed run), the rest ConfigError
        call()


# --------------------------------------------------------------------------------------------- EdgeBank
STREAM = TemporalEvents(src=[0, 1, 0, 0], dst=[5, 5, 5, 6], t=[1, 2, 2, 3], num_nodes=7)


def test_edgebank_remembers_pairs_seen_strictly_earlier():
    bank = EdgeBank(STREAM)
    src = np.array([0, 0, 1, 0, 0, 5, 2])
    dst = np.array([5, 5, 5, 6, 6, 0, 3])
    t = np.array([1, 1.5, 2, 3, 4, 10, 10])
    # (0,5) first at t=1: not before t=1, seen by 1.5; (1,5) only at t=2; (0,6) at 3; (5,0): directed, never
    np.testing.assert_array_equal(bank.scores(src, dst, t), [0, 1, 0, 0, 1, 0, 0])
    assert bank.scores(src, dst, t).dtype == np.float32
    assert EdgeBank(STREAM.head(0)).scores(src, dst, t).sum() == 0


def test_edgebank_evaluate_matches_the_metrics_on_its_scores():
    rng = np.random.default_rng(0)
    e = 300
    src = rng.integers(0, 10, e)
    dst = np.where(rng.random(e) < 0.9, 10 + src, rng.integers(10, 20, e))  # each user mostly one page
    ev = TemporalEvents(src=src, dst=dst, t=np.arange(e), num_nodes=20)
    sampler = NegativeSampler.from_destinations(ev, seed=4)
    ids = np.arange(200, 300)
    res = EdgeBank(ev).evaluate(ev, ids, sampler, num_negatives=5)
    bank = EdgeBank(ev)
    pos = bank.scores(ev.src[ids], ev.dst[ids], ev.t[ids])
    neg = bank.scores(ev.src[ids], sampler.sample(ids), ev.t[ids])
    fixed = sampler.sample_fixed(ids, ev.dst[ids], 5)
    neg_q = np.stack([bank.scores(ev.src[ids], fixed[:, j], ev.t[ids]) for j in range(5)], axis=1)
    assert res.ap == pytest.approx(_brute_ap(pos, neg))
    assert res.auc == pytest.approx(_brute_auc(pos, neg))
    assert res.mrr == pytest.approx(mean_reciprocal_rank(pos, neg_q))
    assert res.auc > 0.7  # repeated pairs score 1, random other pages mostly 0


def test_edgebank_on_wikipedia_test_part(shared_data):
    from haloflow.data.temporal import chronological_split, read_jodie_csv

    ev = read_jodie_csv(shared_data / "temporal" / "jodie_wikipedia_edges.csv")
    split = chronological_split(ev)
    res = EdgeBank(ev).evaluate(ev, split.ids("test"), NegativeSampler.from_destinations(ev, seed=1))
    # Measured AP 0.937, AUC 0.941, MRR 0.793 (100 negatives): Wikipedia users mostly re-edit pages they edited.
    assert res.ap == pytest.approx(0.937, abs=0.005) and res.auc == pytest.approx(0.941, abs=0.005)
    assert res.mrr == pytest.approx(0.793, abs=0.005) and res.num_events == 23_621
