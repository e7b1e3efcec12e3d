"""Link-prediction metrics for event streams, exact and without scikit-learn, and the EdgeBank baseline.

With one negative per event (TGN's protocol) the positives and negatives form one ranked list::

    scores   pos = [0.9, 0.4]   neg = [0.4, 0.1]
    ranked   0.9+  0.4+ 0.4-  0.1-          (+ positive, - negative; 0.4 is one threshold, tied)
    AP       mean over positives of precision at their threshold = (1/1 + 2/3) / 2 = 0.8333
             (scikit-learn's average_precision_score: thresholds at the distinct scores, no interpolation)
    AUC      P(pos > neg) + 1/2 P(pos = neg) over all pairs = (1 + 1 + 0.5 + 1) / 4 = 0.875

MRR against a fixed set of negatives per event (TGB's protocol): the rank of the true destination among its
negatives, ties counted half-way (mean of the optimistic and pessimistic rank), ``mean(1 / rank)``.

EdgeBank (Poursafaei et al. 2022, unlimited memory): an edge scores 1 if the same (src, dst) pair occurred
strictly earlier in the stream, else 0 -- a memorisation baseline that learned models should beat (FACTS.md:
on tgbl-wiki it beats TGN's MRR).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from haloflow.data.temporal import TemporalEvents
from haloflow.data.temporal_sampler import NegativeSampler
from haloflow.errors import ConfigError, RunFailed

__all__ = ["average_precision", "roc_auc", "mean_reciprocal_rank", "EdgeBank", "LinkMetrics"]


def _scores(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pos = np.asarray(pos, dtype=np.float64).ravel()
    neg = np.asarray(neg, dtype=np.float64).ravel()
    if pos.size == 0 or neg.size == 0:
        raise ConfigError(f"need at least one positive and one negative score, got {pos.size} and {neg.size}")
    if np.isnan(pos).any() or np.isnan(neg).any():
        raise RunFailed("the model's scores are NaN (its weights are no longer finite numbers: a smaller --lr); "
                        "no metric can be computed")
    return pos, neg


def average_precision(pos: np.ndarray, neg: np.ndarray) -> float:
    """Average precision of ``pos`` (label 1) against ``neg`` (label 0), tie-exact (as scikit-learn's).

    Shapes:
        pos (P,), neg (N,) -> float.  Cost: one sort of P + N scores.
    """
    pos, neg = _scores(pos, neg)
    scores = np.concatenate([pos, neg])  # (P+N,)
    label = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], label[order]
    ends = np.append(np.flatnonzero(s[1:] != s[:-1]), s.size - 1)  # last position of each tied group
    tp = np.cumsum(y)[ends]  # positives scored >= each distinct threshold
    precision = tp / (ends + 1)
    recall_step = np.diff(tp, prepend=0.0) / pos.size
    return float(np.sum(recall_step * precision))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given the mean of their positions (scipy's rankdata 'average')."""
    order = np.argsort(values, kind="stable")
    s = values[order]
    starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))  # first position of each tied group
    ends = np.append(starts[1:], s.size)  # one past the last
    group_rank = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(s.size)
    ranks[order] = np.repeat(group_rank, ends - starts)
    return ranks


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the ROC curve = P(pos > neg) + P(pos = neg) / 2 (Mann-Whitney, from average ranks).

    Shapes:
        pos (P,), neg (N,) -> float.  Cost: one sort of P + N scores.
    """
    pos, neg = _scores(pos, neg)
    ranks = _average_ranks(np.concatenate([pos, neg]))
    p, n = pos.size, neg.size
    return float((ranks[:p].sum() - p * (p + 1) / 2.0) / (p * n))


def mean_reciprocal_rank(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mean of ``1 / rank`` of each positive among its own negatives, ties counted half-way (TGB's rule:
    rank = 1 + (#neg > pos + #neg >= pos) / 2).

    Shapes:
        pos (n,), neg (n, Q) -> float.
    """
    pos = np.asarray(pos, dtype=np.float64)
    neg = np.asarray(neg, dtype=np.float64)
    if pos.ndim != 1 or neg.ndim != 2 or neg.shape[0] != pos.shape[0] or pos.size == 0:
        raise ConfigError(f"mean_reciprocal_rank needs pos (n,) and neg (n, Q) with n >= 1, got {pos.shape} "
                          f"and {neg.shape}")
    above = (neg > pos[:, None]).sum(axis=1)  # (n,)
    at_or_above = (neg >= pos[:, None]).sum(axis=1)  # (n,)
    return float(np.mean(1.0 / (1.0 + 0.5 * (above + at_or_above))))


@dataclass(frozen=True)
class LinkMetrics:
    """AP and AUC against one negative per event, MRR against ``num_negatives`` fixed negatives per event."""

    ap: float
    auc: float
    mrr: float
    num_events: int
    num_negatives: int


class EdgeBank:
    """EdgeBank with unlimited memory: ``score(u, v, t) = 1`` if an event ``u -> v`` happened before time t.

    Args:
        events: the stream; the bank holds, per distinct (src, dst) pair, the time it first occurred.
            Strictly earlier times only: an event never sees itself or events at the same time.
    """

    def __init__(self, events: TemporalEvents):
        self.num_nodes = events.num_nodes
        keys = events.src * np.int64(max(self.num_nodes, 1)) + events.dst  # (E,) pair id
        order = np.argsort(keys, kind="stable")  # stream order inside a pair: its first event comes first
        k = keys[order]
        first = np.concatenate([[True], k[1:] != k[:-1]]) if k.size else np.zeros(0, dtype=bool)
        self._keys = k[first]  # (pairs,) ascending
        self._first_t = events.t[order][first].astype(np.float64)  # (pairs,)

    def scores(self, src: np.ndarray, dst: np.ndarray, t: np.ndarray) -> np.ndarray:
        """float32 (n,): 1.0 where the pair ``src[i] -> dst[i]`` occurred strictly before ``t[i]``, else 0.0."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        t = np.broadcast_to(np.asarray(t, dtype=np.float64), src.shape)
        keys = src * np.int64(max(self.num_nodes, 1)) + dst
        pos = np.minimum(np.searchsorted(self._keys, keys), max(self._keys.size - 1, 0))
        if self._keys.size == 0:
            return np.zeros(src.shape, dtype=np.float32)
        seen = (self._keys[pos] == keys) & (self._first_t[pos] < t)
        return seen.astype(np.float32)

    def evaluate(self, events: TemporalEvents, event_ids: np.ndarray, negatives: NegativeSampler, *,
                 num_negatives: int = 100, stream: int = 0) -> LinkMetrics:
        """AP and AUC with one negative per event (``negatives.sample``), MRR with ``num_negatives`` distinct
        negatives per event (``negatives.sample_fixed``), the same negatives any model evaluated with the same
        sampler sees."""
        ids = np.asarray(event_ids, dtype=np.int64)
        src, dst, t = events.src[ids], events.dst[ids], events.t[ids]
        pos = self.scores(src, dst, t)  # (S,)
        neg = self.scores(src, negatives.sample(ids, stream=stream), t)  # (S,)
        fixed = negatives.sample_fixed(ids, dst, num_negatives, stream=stream)  # (S, Q)
        neg_q = self.scores(np.repeat(src, num_negatives), fixed.ravel(), np.repeat(t, num_negatives))
        mrr = mean_reciprocal_rank(pos, neg_q.reshape(-1, num_negatives)) if num_negatives else float("nan")
        return LinkMetrics(average_precision(pos, neg), roc_auc(pos, neg), mrr, int(ids.size), num_negatives)
