"""Synthetic graphs: a planted-partition (stochastic block) node-classification data set, and R-MAT.

Both are deterministic functions of their seed. R-MAT is generated in chunks from a counter-based hash, so edge i
is the same whatever the chunk size, chunks can be regenerated instead of stored, and building a CSR of 2^28 edges
needs only the CSR itself (a two-pass counting sort), never the edge list in memory.

R-MAT (Chakrabarti et al. 2004; Graph500 parameters a=0.57, b=0.19, c=0.19, d=0.05)::

    each edge picks one quadrant per level of the 2^s x 2^s adjacency matrix:
        +-----+-----+
        |  a  |  b  |     a: (src bit 0, dst bit 0)   b: (0, 1)
        +-----+-----+     c: (1, 0)                   d: (1, 1)
        |  c  |  d  |
        +-----+-----+     s levels -> one (src, dst) pair; then ids are permuted (Graph500 scrambling)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numba
import numpy as np

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.errors import ConfigError

__all__ = ["SBMConfig", "sbm_dataset", "RMATConfig", "rmat_chunks", "rmat_graph", "csr_from_chunks"]


# --------------------------------------------------------------------------------------------- block model
@dataclass(frozen=True, kw_only=True)
class SBMConfig:
    """A planted-partition graph whose labels are the blocks and whose features are noisy class centroids.

    The defaults make a graph on which a 2-layer GCN clearly beats an MLP: features alone are weak (noise 6x the
    centroid spread), while 80% of each node's edges stay inside its block.
    """

    num_nodes: int = 10_000
    num_classes: int = 8
    avg_degree: float = 10.0  # mean undirected degree (before symmetrising duplicates are removed)
    homophily: float = 0.8  # probability that an edge stays inside the source's block
    feature_dim: int = 32
    feature_noise: float = 6.0  # std of per-node noise relative to the centroids' unit spread
    train_fraction: float = 0.1
    val_fraction: float = 0.1  # the rest is the test set
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_nodes < self.num_classes or self.num_classes < 1:
            raise ConfigError(f"need num_nodes >= num_classes >= 1, got {self.num_nodes} and {self.num_classes}")
        if not 0.0 <= self.homophily <= 1.0:
            raise ConfigError(f"homophily must be in [0, 1], got {self.homophily}")
        if self.avg_degree <= 0:
            raise ConfigError(f"avg_degree must be > 0, got {self.avg_degree}")
        if self.train_fraction + self.val_fraction >= 1.0 or min(self.train_fraction, self.val_fraction) < 0:
            raise ConfigError(
                f"train_fraction + val_fraction must be < 1 (both >= 0), got {self.train_fraction} + {self.val_fraction}"
            )


def sbm_dataset(config: SBMConfig | None = None, **overrides) -> GraphDataset:
    """Generate the built-in default data set (see `SBMConfig`). Undirected, no self-loops, no duplicates."""
    cfg = config or SBMConfig(**overrides)
    if config is not None and overrides:
        raise ConfigError("pass either an SBMConfig or keyword overrides, not both")
    rng = np.random.default_rng(cfg.seed)
    n, k = cfg.num_nodes, cfg.num_classes
    labels = rng.integers(0, k, size=n)  # (N,)
    order = np.argsort(labels, kind="stable")  # nodes grouped by block
    block_start = np.searchsorted(labels[order], np.arange(k + 1))  # (K+1,)
    m = int(round(n * cfg.avg_degree / 2))
    src = rng.integers(0, n, size=m)
    inside = rng.random(m) < cfg.homophily
    dst_block = np.where(inside, labels[src], rng.integers(0, k, size=m))  # (m,)
    sizes = block_start[dst_block + 1] - block_start[dst_block]
    dst = order[block_start[dst_block] + (rng.random(m) * sizes).astype(np.int64)]
    graph = CSRGraph.from_edges(src, dst, n, symmetrize=True, drop_self_loops=True)

    centroids = rng.standard_normal((k, cfg.feature_dim))  # (K, F)
    features = centroids[labels] + cfg.feature_noise * rng.standard_normal((n, cfg.feature_dim))
    perm = rng.permutation(n)
    n_train, n_val = int(cfg.train_fraction * n), int(cfg.val_fraction * n)
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    masks[0][perm[:n_train]] = True
    masks[1][perm[n_train : n_train + n_val]] = True
    masks[2][perm[n_train + n_val :]] = True
    return GraphDataset(
        graph=graph, features=features.astype(np.float32), labels=labels.astype(np.int64),
        train_mask=masks[0], val_mask=masks[1], test_mask=masks[2], num_classes=k, name=f"sbm-{n}",
    )


# --------------------------------------------------------------------------------------------- R-MAT
@dataclass(frozen=True, kw_only=True)
class RMATConfig:
    """R-MAT with Graph500 parameters. ``num_edges`` defaults to ``edge_factor * 2**scale``."""

    scale: int  # 2**scale nodes
    edge_factor: int = 16
    num_edges: int | None = None
    a: float = 0.57
    b: float = 0.19
    c: float = 0.19
    seed: int = 0
    permute: bool = True  # scramble ids so that high-degree nodes are not all at small ids (Graph500)
    chunk_size: int = 1 << 22  # edges per generated chunk: bounds the generator's memory (2 x 8 bytes x chunk)

    def __post_init__(self) -> None:
        if not 1 <= self.scale <= 40:
            raise ConfigError(f"scale must be in [1, 40], got {self.scale}")
        if min(self.a, self.b, self.c) < 0 or self.a + self.b + self.c >= 1:
            raise ConfigError(f"need a, b, c >= 0 and a + b + c < 1, got {self.a}, {self.b}, {self.c}")
        if self.chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {self.chunk_size}")

    @property
    def num_nodes(self) -> int:
        return 1 << self.scale

    @property
    def total_edges(self) -> int:
        return self.num_edges if self.num_edges is not None else self.edge_factor << self.scale


@numba.njit(cache=True, inline="always")
def _splitmix64(x):
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(parallel=True, cache=True)
def _rmat_kernel(start, count, scale, a, b, c, seed, src, dst):
    # One hash per (edge, level): edge i is a pure function of (seed, i), whatever the chunking.
    ab = a + b
    abc = a + b + c
    inv = 1.0 / 18446744073709551616.0  # 2**-64
    for j in numba.prange(count):
        e = np.uint64(start + j)
        s = np.int64(0)
        d = np.int64(0)
        for lvl in range(scale):
            h = _splitmix64(np.uint64(seed) * np.uint64(0x100000001B3) ^ (e * np.uint64(64) + np.uint64(lvl)))
            r = np.float64(h) * inv
            s <<= 1
            d <<= 1
            if r < a:
                pass
            elif r < ab:
                d |= 1
            elif r < abc:
                s |= 1
            else:
                s |= 1
                d |= 1
        src[j] = s
        dst[j] = d


def rmat_chunks(config: RMATConfig) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(src, dst)`` int64 chunks of at most ``config.chunk_size`` edges. Memory: O(nodes + chunk)."""
    perm = np.random.default_rng(config.seed).permutation(config.num_nodes) if config.permute else None
    total = config.total_edges
    for start in range(0, total, config.chunk_size):
        count = min(config.chunk_size, total - start)
        src = np.empty(count, dtype=np.int64)
        dst = np.empty(count, dtype=np.int64)
        _rmat_kernel(start, count, config.scale, config.a, config.b, config.c, config.seed, src, dst)
        if perm is not None:
            src, dst = perm[src], perm[dst]
        yield src, dst


@numba.njit(cache=True)
def _count_rows(dst, counts):
    for i in range(dst.shape[0]):
        counts[dst[i]] += 1


@numba.njit(cache=True)
def _fill_rows(src, dst, cursor, indices):
    for i in range(dst.shape[0]):
        r = dst[i]
        indices[cursor[r]] = src[i]
        cursor[r] += 1


@numba.njit(parallel=True, cache=True)
def _sort_rows(indptr, indices):
    for r in numba.prange(indptr.shape[0] - 1):
        indices[indptr[r] : indptr[r + 1]].sort()


@numba.njit(cache=True)
def _dedup_rows(indptr, indices, dedup, drop_loops):
    # In place: compacts each sorted row, dropping repeats and/or v -> v as asked; returns the new indptr.
    n = indptr.shape[0] - 1
    out = np.zeros(n + 1, dtype=np.int64)
    w = 0
    for r in range(n):
        prev = -1
        for p in range(indptr[r], indptr[r + 1]):
            v = indices[p]
            if (dedup and v == prev) or (drop_loops and v == r):
                continue
            indices[w] = v
            w += 1
            prev = v
        out[r + 1] = w
    return out


def csr_from_chunks(chunks_factory, num_nodes: int, *, dedup: bool = False, drop_self_loops: bool = False,
                    symmetrize: bool = False) -> CSRGraph:
    """Build a CSRGraph from a re-iterable edge source without holding the edge list in memory.

    ``chunks_factory()`` must return a fresh iterator of ``(src, dst)`` chunks each time (it is called twice:
    a counting pass, then a filling pass). Peak memory: the CSR (8 x (N + 1) + 8 x nnz bytes) plus one chunk.
    """

    def directed():
        for s, d in chunks_factory():
            yield s, d
            if symmetrize:
                yield d, s

    counts = np.zeros(num_nodes, dtype=np.int64)
    for _, d in directed():
        _count_rows(d, counts)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    del counts
    indices = np.empty(int(indptr[-1]), dtype=np.int64)
    cursor = indptr[:-1].copy()
    for s, d in directed():
        _fill_rows(s, d, cursor, indices)
    del cursor
    _sort_rows(indptr, indices)
    if dedup or symmetrize or drop_self_loops:
        indptr = _dedup_rows(indptr, indices, dedup or symmetrize, drop_self_loops)
        indices = indices[: int(indptr[-1])].copy()
    return CSRGraph(indptr=indptr, indices=indices, num_nodes=num_nodes,
                    simple_symmetric=symmetrize and drop_self_loops, symmetric=symmetrize)


def rmat_graph(config: RMATConfig, *, symmetrize: bool = False, dedup: bool = True,
               drop_self_loops: bool = True) -> CSRGraph:
    """An R-MAT graph as CSR (duplicates and self-loops removed by default, as partitioners expect)."""
    return csr_from_chunks(lambda: rmat_chunks(config), config.num_nodes, dedup=dedup,
                           drop_self_loops=drop_self_loops, symmetrize=symmetrize)
