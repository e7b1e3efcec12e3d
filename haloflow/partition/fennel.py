"""Fennel, a streaming partitioner (Tsourakakis, Gkantsidis, Radunovic, Vojnovic, WSDM'14).

https://doi.org/10.1145/2556195.2556213. Each vertex, read once per pass, goes to the part that maximises

    score(v, i) = |N(v) & P_i| - alpha * gamma * |P_i| ** (gamma - 1),    gamma = 1.5,
    alpha = sqrt(K) * m / n ** 1.5,                                        m = nnz / 2

among the parts below the hard cap ``max(imbalance * n / K, ceil(n / K))`` vertices. N(v) is row v of the CSR
it is given: the in-neighbours of our in-edge CSR, or all neighbours when the caller passes a symmetric
adjacency (``metis.symmetric_adjacency``). With in-neighbours only, each edge is seen once (by its destination)
instead of twice, which is why m counts nnz / 2 in both cases: the neighbour term and the size penalty keep the
paper's ratio.

Several weights (``weights`` (N, W), ``caps`` (W,): nodes, in-edges, training nodes; ``balance.balance_weights``).
The paper's cost alpha * sum_i |P_i| ** gamma becomes one such cost per weight, each weight rescaled to sum to n
(so each is on the vertex count's scale), and a vertex pays every weight it carries::

    score(v, i) = |N(v) & P_i| - sum_w alpha_w * gamma * L_w(i) ** (gamma - 1) * w'(v),
    L_w(i) = s_w * load_w(i),   w'(v) = s_w * weight_w(v),   s_w = n / total_w,   alpha_w = 2 alpha

among the parts where v fits under every cap. A hub pays for its edges in proportion to its degree, so the
hubs spread over the parts as they come and the parts fill evenly on every weight, instead of the edge-heavy core
landing in one part for the rebalancer to take apart (the vertex count alone leaves Slashdot K = 4 at 3.4 x the
mean part's edges). For one weight this is the vertex-weighted Fennel score (a vertex of weight c pays c times
the marginal cost), as weighted streaming partitioners use it; here there is one such term per balanced weight,
and the hard caps are what keeps each weight within its bound.

Where v fits nowhere (every part full on some weight that v carries, or one vertex heavier than the room left), it
goes where it adds least to the excess over the caps (``balance.py``'s measure, each weight over its cap), the
score breaking ties. In a restreaming pass that moves v out of a part over its cap on one weight into one over on
another only if that lowers the excess, so the restreaming passes drain what the first pass left over; the
rebalancer afterwards (``api.partition_graph``) stays the guarantee.

Why alpha_w = 2 alpha: at alpha (the costs simply summed) the parts reach the caps during the first pass and the
late vertices go where they fit rather than where their neighbours are (cut fraction Enron K = 4: 0.307 against
0.261; Slashdot K = 4: 0.535 against 0.472); at 0.5 alpha some runs end over a cap for the rebalancer to mend. 3
and 4 alpha cut within 5% of 2 alpha either way (Enron and Slashdot, K = 4 and 16), no run ending over a cap.

Measured (``haloflow bench partition``, cut fraction, vertex count alone -> nodes and in-edges; before = the count's
parts repaired by the rebalancer; every two-weight run <= 1.05 x mean on both)::

    graph         K   count   before   weighted          graph        K   count   before   weighted
    Enron         4   0.178   0.554    0.261             NE roads     4   0.0009  0.0009   0.0009
    Enron        16   0.387   0.577    0.445             NE roads    16   0.0036  0.0060   0.0035
    Slashdot      4   0.225   0.654    0.472             R-MAT 2^20   4   0.073   0.730    0.648
    Slashdot     16   0.597   0.767    0.677             R-MAT 2^20  16   0.382   0.890    0.835

Balancing edges costs cut whatever the method where the count's parts hold the edge-heavy core in one part: METIS
goes 0.18 -> 0.31 (Enron K = 4) and 0.21 -> 0.71 (R-MAT 2^20 K = 4) when it balances both. On graphs of
communities whose count's parts are already nearly even on edges, the weighted penalty moves hubs only to even
the loads and the count's parts with a few repairing moves cut less; ``api.partition_graph``'s auto keeps the
better of the two.

Streaming over a CSR that may be memory-mapped (the arrays are only ever indexed, never copied)::

    order = BFS order (default) or 0..N-1              (N int64)
    pass 1..P:  for each chunk of chunk_size vertices of the order:
                    place each v of the chunk: read row v, count neighbours per part, score the K parts

Memory of its own: order + parts (2 N int64) + sizes, conn, touched (K each), loads (K W). Time per pass:
O(nnz + N * K * W).
Later passes are restreaming (Nishimura & Ugander, KDD'13): v leaves its part, then is placed again seeing every
neighbour's latest part. It improves the cut at the same cost per pass.

Why BFS order: streamed in id order, a vertex whose ids are unrelated to the geometry (road networks) sees few
placed neighbours and the cut approaches random. Measured (K = 2, 4, 8; cut relative to METIS on the same
symmetric graph; 4 passes): Enron 0.83 / 0.98 / 1.21, Slashdot 0.41 / 0.56 / 0.84, NE road network 58 / 36 / 22
(id order: 60 to 150 times worse than that). A road network's METIS cut is a few hundred edges along a narrow geographic
bottleneck, which a one-vertex-at-a-time method does not find.

Two starts (``start="auto"``, the default, runs both and keeps the smaller cut)::

    stream   pass 1 places every vertex by the Fennel score from empty parts (then restreaming)
    bisect   recursive BFS bisection: BFS over the current piece from a pseudo-peripheral vertex, the first
             round(|piece| * k1 / k) vertices of that order form one side (with several weights: the shortest
             prefix holding k1 / k of the piece's rescaled weights, their mean); recurse to K pieces (O(nnz log K)
             time, O(N) memory); then the restreaming passes

On a mesh-like graph, stream grows all K parts at once along the BFS front, so parts end as long strips; the
bisection's pieces are compact regions. Measured cut relative to METIS, NE road network K = 4 / 16: stream
35 / 17, bisect 8.8 / 8.9 (0.00088 / 0.0036 against 0.0001 / 0.0004). On the social graphs stream wins
(Slashdot K = 4: 0.225 against 0.271), so auto keeps it there. Auto costs two runs' time.
With several weights, a start that ends over a cap loses to one that does not (the rebalancing moves would cost
cut that the comparison does not see).
"""

from __future__ import annotations

import logging
import math

import numba
import numpy as np

from haloflow.errors import ConfigError
from haloflow.partition.bisect import _bfs, _bisect
from haloflow.partition.multilevel import multilevel_partition
from haloflow.utils.progress import progress_bar

__all__ = ["fennel_partition", "FennelStream", "cut_entries", "mesh_like", "AUTO_START_RULE", "FENNEL_GAMMA",
           "FENNEL_PASSES",
           "FENNEL_STARTS", "FENNEL_ORDERS"]

log = logging.getLogger(__name__)

FENNEL_GAMMA = 1.5
FENNEL_PASSES = 4  # one streaming pass + 3 restreaming passes; see the module docstring
FENNEL_STARTS = ("auto", "stream", "bisect", "multilevel")
FENNEL_ORDERS = ("bfs", "natural")
# alpha of each weight's penalty when several are balanced, relative to the paper's alpha (measured in the module
# docstring: at 1 the parts reach the caps in the first pass and late vertices go where they fit)
WEIGHTED_ALPHA = 2.0


def fennel_partition(
    indptr: np.ndarray,
    indices: np.ndarray,
    num_parts: int,
    *,
    imbalance: float = 1.05,
    seed: int = 0,
    chunk_size: int = 1 << 20,
    passes: int = FENNEL_PASSES,
    order: str = "bfs",
    start: str = "auto",
    weights: np.ndarray | None = None,
    caps: np.ndarray | None = None,
    symmetric: tuple[np.ndarray, np.ndarray] | None = None,
    progress: bool = False,
) -> np.ndarray:
    """int64 (N,) part of each vertex, at most ``max(imbalance * N / K, ceil(N / K))`` vertices per part.

    Args:
        indptr: int64 (N+1,) row offsets; may be an ``np.memmap``.
        indices: int64 (nnz,) neighbours, row by row; may be an ``np.memmap`` (pages are read as rows are visited,
            never copied).
        num_parts: K >= 1.
        imbalance: the hard cap on part size, relative to N / K.
        seed: rotates which part wins a tie, so different seeds give different (equally good) partitions.
        chunk_size: vertices per streamed chunk (the unit of work between progress updates).
        passes: 1 = plain Fennel; more = restreaming passes.
        order: ``"bfs"`` streams vertices in breadth-first order from a pseudo-peripheral vertex (two BFS
            sweeps over the rows, O(N) memory); ``"natural"`` streams ids 0..N-1, reading the CSR sequentially.
        start: ``"stream"`` (plain Fennel first pass), ``"bisect"`` (recursive BFS bisection, then ``passes - 1``
            restreaming passes), ``"multilevel"`` (``multilevel.py``: coarsened by label propagation, started on the
            coarsest graph, refined level by level, the weights' combination balanced; ``passes`` does not apply)
            or ``"auto"`` (`AUTO_START_RULE`: stream and bisect, then multilevel when the bisection cut less
            than the stream; the smallest edge cut wins, the earlier on a tie).
        weights, caps: int64 (N, W) and (W,): balance every column at once, each part at most ``caps`` on each
            (the module docstring's weighted score); None balances the vertex count alone, capped as above.
        symmetric: the symmetric adjacency without self-loops (``metis.symmetric_adjacency``) that the multilevel
            start needs; default ``(indptr, indices)``, which must then be one.
    """
    if order not in FENNEL_ORDERS:
        raise ConfigError(f"fennel order must be 'bfs' or 'natural', got {order!r}")
    if passes < 1:
        raise ConfigError(f"fennel passes must be >= 1, got {passes}")
    if start not in FENNEL_STARTS:
        raise ConfigError(f"fennel start must be one of {', '.join(FENNEL_STARTS)}, got {start!r}")
    n = int(indptr.shape[0]) - 1
    k = int(num_parts)
    if k == 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    indptr = np.asarray(indptr)  # an np.memmap stays a view of the file: nothing is read here
    indices = np.asarray(indices)
    nnz = int(indptr[-1])
    if order == "bfs":
        # The second sweep starts where the first ended (a pseudo-peripheral vertex), so parts grow as bands
        # across the graph instead of as rings around vertex 0.
        ids = _bfs(indptr, indices, 0, np.empty(n, dtype=np.int64), None, None, 0, None)  # (N,)
        ids = _bfs(indptr, indices, ids[-1], ids, None, None, 0, None)
    else:
        ids = None
    starts = [start]
    if start == "auto":  # multilevel joins when the bisection beat the stream (see AUTO_START_RULE)
        starts = ["stream", "bisect"]
    chunks = range(0, n, chunk_size)
    best, best_key = None, None
    cuts: dict[str, int] = {}
    with progress_bar(total=(3 if start == "auto" else 1) * passes * len(chunks), desc="fennel", unit="chunk",
                      enabled=progress) as bar:
        for how in starts:
            stream = FennelStream(n, nnz, k, imbalance=imbalance, seed=seed, weights=weights, caps=caps)
            first = 0
            if how == "bisect":
                _bisect(indptr, indices, k, stream.parts, _bisection_weight(weights))
                stream.recount()
                bar.update(len(chunks))
                first = 1
            elif how == "multilevel":  # its own refinement replaces the restreaming passes
                sym = (indptr, indices) if symmetric is None else symmetric
                stream.parts[:] = multilevel_partition(*sym, k, imbalance=imbalance, seed=seed,
                                                       vweight=_multilevel_weight(weights))
                stream.recount()
                bar.update(passes * len(chunks))
                first = passes
            for p in range(first, passes):
                for lo in chunks:
                    hi = min(lo + chunk_size, n)
                    if ids is None:  # natural order: rows lo..hi-1 as one block, as the out-of-core stream reads
                        stream.place_rows(indptr[lo:hi + 1], indices[indptr[lo]:indptr[hi]], lo, restream=p > 0)
                    else:
                        stream.place_order(indptr, indices, ids[lo:hi], restream=p > 0)
                    bar.update(1)
            parts = stream.parts
            # with several weights, a start that ends over a cap leaves work to the rebalancer, whose moves cost
            # cut: it loses
            key = (stream.over_caps() if weights is not None else 0,
                   _cut_entries(indptr, indices, parts) if len(starts) > 1 else 0)
            log.debug("fennel: K=%d, start %s, %d passes, order %s, (loads over a cap, cut entries) %s, "
                      "part sizes %s", k, how, passes, order, key, stream.sizes.tolist())
            cuts[how] = key[1]
            if best is None or key < best_key:
                best, best_key = parts, key
            if start == "auto" and how == "bisect" and cuts["bisect"] < cuts["stream"]:
                starts.append("multilevel")
            del parts, stream  # at most two (N,) assignments alive at once
    return best


AUTO_START_RULE = (
    "auto runs the stream and bisect starts, then the multilevel start only when the bisection cut fewer edges than "
    "the stream (a graph with geometry, where multilevel wins; on social graphs the stream won every measurement and "
    "multilevel took 20-40x its time); the smallest cut is kept"
)
# Why measured, not judged by degrees (``mesh_like``, the rule before 2026-12-06): a random geometric graph of 32k
# nodes (mean degree above 6) was judged not mesh-like, streamed, and cut 2.93x METIS; its bisection beats its stream.

MESH_MEAN_DEGREE = 6  # a mesh-like graph: mean degree at most this (a 3D grid's), ...
MESH_DEGREE_RATIO = 16  # ... and largest degree at most this x the mean


def mesh_like(indptr: np.ndarray) -> bool:
    """Degree statistics of a mesh (no longer what ``auto`` decides by; see AUTO_START_RULE): mean degree <=
    MESH_MEAN_DEGREE and the largest degree <=
    MESH_DEGREE_RATIO x the mean (road networks: 2.5 and 9; an 80 x 80 grid: 3.95 and 4). On skewed graphs (Enron:
    10 and 1,383; Slashdot; R-MAT) the stream won every measurement and multilevel took 20-40x its time (R-MAT 2^20
    K = 16: 23 s against 0.7 s, cut 0.78 against 0.38); denser random graphs keep the two cheaper starts."""
    n = indptr.shape[0] - 1
    if n == 0:
        return False
    degrees = np.diff(np.asarray(indptr))  # (N,) read once, also from a memory map
    mean = float(degrees.mean())
    return mean <= MESH_MEAN_DEGREE and int(degrees.max()) <= MESH_DEGREE_RATIO * max(mean, 1.0)


def _multilevel_weight(weights: np.ndarray | None) -> np.ndarray | None:
    """int64 (N,) the one vertex weight the multilevel start balances: the bisection's combined weight in
    sixteenths (None: the vertex count)."""
    combined = _bisection_weight(weights)
    return None if combined is None else np.rint(combined * 16).astype(np.int64)


def _bisection_weight(weights: np.ndarray | None) -> np.ndarray | None:
    """float64 (N,) what the bisection splits evenly: the mean of the weights, each rescaled to mean 1 (None:
    the vertex count)."""
    if weights is None:
        return None
    totals = weights.sum(axis=0)  # (W,)
    scale = np.where(totals > 0, weights.shape[0] / np.maximum(totals, 1), 0.0) / weights.shape[1]  # (W,)
    return weights @ scale  # (N,)


def cut_entries(indptr: np.ndarray, indices: np.ndarray, parts: np.ndarray) -> int:
    """CSR entries whose two ends lie in different parts (each cut edge of a symmetric CSR counts twice)."""
    return int(_cut_entries(indptr, indices, parts))


@numba.njit(cache=True)
def _cut_entries(indptr, indices, parts):
    """CSR entries whose two ends lie in different parts (each cut edge of a symmetric CSR counts twice)."""
    n = indptr.shape[0] - 1
    c = 0
    for v in range(n):
        pv = parts[v]
        for e in range(indptr[v], indptr[v + 1]):
            if parts[indices[e]] != pv:
                c += 1
    return c


class FennelStream:
    """Fennel's state over a stream of vertices: the assignment, the part loads, the hard caps and alpha.

    The in-memory partitioner and the out-of-core one (``partition/ooc/stream.py``) both place vertices through
    this object and the per-vertex kernels below, so for the same graph, weights, seed and order they make the
    same choice at every vertex. Memory: ``parts`` (N,) plus O(K W); the weights are the caller's.

    Two scores (module docstring): the vertex count alone (``weights`` None, the paper's Fennel), or every
    balanced weight at once (``weights`` (N, W), ``caps`` (W,)), each with its own penalty and hard cap.

    Args:
        num_nodes, nnz: N and the CSR's entries (they fix the cap and alpha, see the module docstring).
        parts_dtype: int64 (the default, what ``Assignment`` holds) or int32 (half the memory out of core).
        weights: int64 (N, W) the balanced weights (``balance.balance_weights``), or None for the vertex count.
        caps: int64 (W,) the largest load each part may take on each weight; required with ``weights``.
    """

    def __init__(self, num_nodes: int, nnz: int, num_parts: int, *, imbalance: float = 1.05, seed: int = 0,
                 parts_dtype=np.int64, weights: np.ndarray | None = None, caps: np.ndarray | None = None):
        n, k = int(num_nodes), int(num_parts)
        self.cap = max(math.floor(imbalance * n / k + 1e-9), -(-n // k))
        self.alpha = math.sqrt(k) * max(nnz / 2, 1.0) / n**1.5
        self.seed = int(seed)
        self.parts = np.full(n, -1, dtype=parts_dtype)  # (N,) -1 = not placed yet
        self.sizes = np.zeros(k, dtype=np.int64)  # (K,) vertices per part
        self._conn = np.zeros(k, dtype=np.int64)  # scratch: neighbours per part of the vertex being placed
        self._touched = np.empty(k, dtype=np.int64)
        self.weights = None
        if weights is not None:
            if caps is None or weights.ndim != 2 or weights.shape[0] != n or caps.shape != (weights.shape[1],):
                raise ConfigError(f"FennelStream: weights must be (N={n}, W) with caps (W,), got "
                                  f"{getattr(weights, 'shape', None)} and {getattr(caps, 'shape', None)}")
            self.weights = np.ascontiguousarray(weights, dtype=np.int64)  # (N, W)
            self.caps = np.ascontiguousarray(caps, dtype=np.int64)  # (W,)
            totals = self.weights.sum(axis=0)  # (W,)
            # each weight rescaled to sum to N, so that its penalty is on the vertex count's scale
            self.scale = np.where(totals > 0, n / np.maximum(totals, 1), 0.0)  # (W,) float64
            self.alpha_w = WEIGHTED_ALPHA * self.alpha
            self.loads = np.zeros((k, self.weights.shape[1]), dtype=np.int64)  # (K, W)

    def recount(self) -> None:
        """Part loads from ``parts`` (after it was filled from outside, e.g. by the bisection)."""
        k = self.sizes.shape[0]
        placed = self.parts >= 0
        self.sizes[:] = np.bincount(self.parts[placed], minlength=k)[:k]
        if self.weights is not None:
            for j in range(self.weights.shape[1]):
                self.loads[:, j] = np.bincount(self.parts[placed], weights=self.weights[placed, j], minlength=k)[:k]

    def over_caps(self) -> int:
        """How many (part, weight) loads are over their cap."""
        if self.weights is None:
            return int((self.sizes > self.cap).sum())
        return int((self.loads > self.caps[None, :]).sum())

    def place_rows(self, indptr_block: np.ndarray, indices_block: np.ndarray, first: int, *, restream: bool) -> None:
        """Place the vertices ``first .. first + len(indptr_block) - 2`` in order.

        Args:
            indptr_block: int64 (r+1,) the CSR's offsets of those rows (global offsets: ``indptr[first:first+r+1]``).
            indices_block: (indptr_block[-1] - indptr_block[0],) their neighbours, row after row.
            restream: each vertex leaves its part first (a later pass).
        """
        if self.weights is None:
            _place_rows(indptr_block, indices_block, first, self.parts, self.sizes, self.cap, self.alpha,
                        FENNEL_GAMMA, self.seed, restream, self._conn, self._touched)
        else:
            _place_rows_weighted(indptr_block, indices_block, first, self.parts, self.sizes, self.loads,
                                 self.weights, self.scale, self.caps, self.alpha_w, FENNEL_GAMMA, self.seed, restream,
                                 self._conn, self._touched)

    def place_order(self, indptr: np.ndarray, indices: np.ndarray, order: np.ndarray, *, restream: bool) -> None:
        """Place the vertices ``order`` (int64) in that order, reading their rows of the whole CSR."""
        if self.weights is None:
            _place_order(indptr, indices, order, self.parts, self.sizes, self.cap, self.alpha, FENNEL_GAMMA,
                         self.seed, restream, self._conn, self._touched)
        else:
            _place_order_weighted(indptr, indices, order, self.parts, self.sizes, self.loads, self.weights,
                                  self.scale, self.caps, self.alpha_w, FENNEL_GAMMA, self.seed, restream, self._conn,
                                  self._touched)


@numba.njit(cache=True)
def _penalties(sizes, alpha, gamma):
    # penalty[q] = alpha * gamma * sizes[q] ** (gamma - 1), refreshed only for the two parts a placement touches
    k = sizes.shape[0]
    penalty = np.empty(k, dtype=np.float64)
    for q in range(k):
        penalty[q] = alpha * gamma * sizes[q] ** (gamma - 1.0)
    return penalty


@numba.njit(cache=True, inline="always")
def _count_neighbours(v, nbrs, parts, conn, touched):
    """conn[q] += v's placed neighbours in part q; the parts met go to touched[:nt]; returns nt."""
    nt = 0
    for e in range(nbrs.shape[0]):
        u = nbrs[e]
        q = parts[u]
        if q < 0 or u == v:
            continue
        if conn[q] == 0:
            touched[nt] = q
            nt += 1
        conn[q] += 1
    return nt


@numba.njit(cache=True, inline="always")
def _place_vertex(v, nbrs, parts, sizes, penalty, cap, alpha, gamma, seed, restream, conn, touched):
    """The per-vertex step: score the K parts for v given its neighbours ``nbrs`` and put v in the best one."""
    k = sizes.shape[0]
    if restream:
        old = parts[v]
        sizes[old] -= 1
        penalty[old] = alpha * gamma * sizes[old] ** (gamma - 1.0)
    nt = _count_neighbours(v, nbrs, parts, conn, touched)
    # scan every part: the emptiest part can win even without neighbours; the scan starts at a seeded
    # offset so that ties go to different parts for different seeds
    best, best_score = -1, -np.inf
    offset = (v + seed) % k
    for j in range(k):
        q = offset + j
        if q >= k:
            q -= k
        if sizes[q] >= cap:
            continue
        score = conn[q] - penalty[q]
        if score > best_score:
            best, best_score = q, score
    for j in range(nt):
        conn[touched[j]] = 0
    parts[v] = best
    sizes[best] += 1
    penalty[best] = alpha * gamma * sizes[best] ** (gamma - 1.0)


@numba.njit(cache=True)
def _place_order(indptr, indices, order, parts, sizes, cap, alpha, gamma, seed, restream, conn, touched):
    penalty = _penalties(sizes, alpha, gamma)
    for i in range(order.shape[0]):
        v = order[i]
        _place_vertex(v, indices[indptr[v]:indptr[v + 1]], parts, sizes, penalty, cap, alpha, gamma, seed, restream,
                      conn, touched)


@numba.njit(cache=True)
def _place_rows(indptr_block, indices_block, first, parts, sizes, cap, alpha, gamma, seed, restream, conn, touched):
    penalty = _penalties(sizes, alpha, gamma)
    base = indptr_block[0]
    for i in range(indptr_block.shape[0] - 1):
        _place_vertex(first + i, indices_block[indptr_block[i] - base:indptr_block[i + 1] - base], parts, sizes,
                      penalty, cap, alpha, gamma, seed, restream, conn, touched)



# ------------------------------------------------------------------------ several weights (module docstring)
@numba.njit(cache=True)
def _penalties_weighted(loads, scale, alpha, gamma):
    # penalty[q, j] = alpha * gamma * (scale[j] * loads[q, j]) ** (gamma - 1) * scale[j]: the marginal cost of one
    # unit of weight j in part q; refreshed only for the two parts a placement touches
    k, w = loads.shape
    penalty = np.empty((k, w), dtype=np.float64)
    for q in range(k):
        _refresh(penalty, loads, q, scale, alpha, gamma)
    return penalty


@numba.njit(cache=True, inline="always")
def _refresh(penalty, loads, q, scale, alpha, gamma):
    for j in range(loads.shape[1]):
        penalty[q, j] = alpha * gamma * (scale[j] * loads[q, j]) ** (gamma - 1.0) * scale[j]


@numba.njit(cache=True, inline="always")
def _place_vertex_weighted(v, nbrs, parts, sizes, loads, wv, penalty, scale, caps, alpha, gamma, seed, restream,
                           conn, touched):
    """The per-vertex step with W weights: among the parts where v fits under every cap, the best score
    ``conn[q] - sum_j penalty[q, j] * wv[j]``; when v fits nowhere, the part whose excess over the caps it raises
    least, the score breaking ties. K W work per vertex besides its row (a second K W scan when it fits nowhere)."""
    k, w = loads.shape
    if restream:
        old = parts[v]
        sizes[old] -= 1
        for j in range(w):
            loads[old, j] -= wv[j]
        _refresh(penalty, loads, old, scale, alpha, gamma)
    nt = _count_neighbours(v, nbrs, parts, conn, touched)
    # the parts where v fits on every weight it carries, best score first; ties go to the first in a scan that
    # starts at a seeded offset
    best, best_score = -1, -np.inf
    offset = (v + seed) % k
    for i in range(k):
        q = offset + i
        if q >= k:
            q -= k
        fits = True
        score = np.float64(conn[q])
        for j in range(w):
            if wv[j] > 0 and loads[q, j] + wv[j] > caps[j]:
                fits = False
                break
            score -= penalty[q, j] * wv[j]
        if fits and score > best_score:
            best, best_score = q, score
    if best < 0:  # v fits nowhere: the part whose excess over the caps it raises least, then the best score
        best_over = np.inf
        for i in range(k):
            q = offset + i
            if q >= k:
                q -= k
            over = 0.0  # what v adds to q's excess (balance.py's measure)
            score = np.float64(conn[q])
            for j in range(w):
                over += (max(0, loads[q, j] + wv[j] - caps[j]) - max(0, loads[q, j] - caps[j])) / max(caps[j], 1)
                score -= penalty[q, j] * wv[j]
            if over < best_over or (over == best_over and score > best_score):
                best, best_score, best_over = q, score, over
    for i in range(nt):
        conn[touched[i]] = 0
    parts[v] = best
    sizes[best] += 1
    for j in range(w):
        loads[best, j] += wv[j]
    _refresh(penalty, loads, best, scale, alpha, gamma)


@numba.njit(cache=True)
def _place_order_weighted(indptr, indices, order, parts, sizes, loads, weights, scale, caps, alpha, gamma, seed,
                          restream, conn, touched):
    penalty = _penalties_weighted(loads, scale, alpha, gamma)
    for i in range(order.shape[0]):
        v = order[i]
        _place_vertex_weighted(v, indices[indptr[v]:indptr[v + 1]], parts, sizes, loads, weights[v], penalty, scale,
                               caps, alpha, gamma, seed, restream, conn, touched)


@numba.njit(cache=True)
def _place_rows_weighted(indptr_block, indices_block, first, parts, sizes, loads, weights, scale, caps, alpha, gamma,
                         seed, restream, conn, touched):
    penalty = _penalties_weighted(loads, scale, alpha, gamma)
    base = indptr_block[0]
    for i in range(indptr_block.shape[0] - 1):
        v = first + i
        _place_vertex_weighted(v, indices_block[indptr_block[i] - base:indptr_block[i + 1] - base], parts, sizes,
                               loads, weights[v], penalty, scale, caps, alpha, gamma, seed, restream, conn, touched)
