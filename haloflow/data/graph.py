"""`CSRGraph`, the one internal graph format, and `GraphDataset` (a graph with node data).

Layout (row v lists the in-neighbours of v; messages flow column -> row, so aggregation is ``out = A @ x``)::

    edges (src -> dst):  0->1  2->1  1->2  0->2  3->2
                          dst 0: (none)
    indptr  = [0, 0, 2, 5, 5]        row v occupies indices[indptr[v]:indptr[v+1]]
    indices = [0, 2, 0, 1, 3]        sorted inside each row
               '-r1-'  '--r2--'

``indptr`` is int64 (N+1,); ``indices`` is int64 (nnz,) and sorted within each row, so two graphs with the same
edge set compare equal array for array.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from haloflow.errors import ConfigError

__all__ = ["CSRGraph", "GraphDataset", "ISOLATED_NODE_SLACK", "max_plausible_nodes", "check_node_count",
           "check_disjoint_splits"]

# E edges touch at most 2E nodes; readers accept this many more ids without edges (isolated nodes) before they
# call a node count implausible. Large enough for any hand-made example, small enough that a stray id (a typo,
# raw external ids, a corrupt header) fails at once instead of allocating gigabytes for isolated nodes.
ISOLATED_NODE_SLACK = 1024


def max_plausible_nodes(num_edges: int) -> int:
    """The most nodes a reader builds for ``num_edges`` edges unless told the count: ``2 E + 1024``."""
    return 2 * int(num_edges) + ISOLATED_NODE_SLACK


# int64 arrays of N entries a graph read with a given node count holds at once at its peak: indptr, the
# degree counts and the row order sorted into it (edges come on top).
_BYTES_PER_NODE = 3 * 8


def check_node_count(num_nodes: int, source, flag: str = "num_nodes (--num-nodes)") -> None:
    """Raise ``ConfigError`` when the per-node arrays of a ``num_nodes``-node graph cannot fit in the memory this
    machine has free: a node count given by hand is taken on trust, and ``10**12`` would otherwise fail deep
    inside numpy with a MemoryError (or, under overcommit, page in for minutes)."""
    from haloflow.utils.memory import available_bytes, format_bytes

    have = available_bytes()
    need = _BYTES_PER_NODE * (int(num_nodes) + 1)
    if have is not None and need > have:
        raise ConfigError(f"{source}: {flag} = {num_nodes:,} needs at least {format_bytes(need)} for the per-node "
                          f"arrays, but this machine has {format_bytes(have)} free: expected the real node count")


@dataclass(frozen=True, eq=False)
class CSRGraph:
    """A directed graph in compressed sparse row form over its in-edges.

    Args:
        indptr: int64 (N+1,) row offsets.
        indices: int64 (nnz,) source node of each in-edge, sorted inside a row.
        num_nodes: N.
        simple_symmetric: True when the constructor knows the graph is undirected (every edge stored both ways)
            with no self-loops or repeats, as ``from_edges(symmetrize=True, drop_self_loops=True)`` makes it; lets
            METIS take the arrays as they are without checking them again. False means "not known".
        symmetric: True when the constructor knows every edge is stored both ways (``from_edges(symmetrize=True)``;
            self-loops and repeats allowed), so that an undirected edge count can be reported. False: not known.
    """

    indptr: np.ndarray
    indices: np.ndarray
    num_nodes: int
    simple_symmetric: bool = False
    symmetric: bool = False

    def __post_init__(self) -> None:
        if self.indptr.shape != (self.num_nodes + 1,):
            raise ConfigError(f"indptr must have num_nodes + 1 = {self.num_nodes + 1} entries, got {self.indptr.shape}")
        if int(self.indptr[-1]) != self.indices.shape[0]:
            raise ConfigError(f"indptr[-1] = {int(self.indptr[-1])} but indices has {self.indices.shape[0]} entries")

    # ----------------------------------------------------------------------------------------- construction
    @classmethod
    def from_edges(
        cls,
        src: np.ndarray,
        dst: np.ndarray,
        num_nodes: int | None = None,
        *,
        symmetrize: bool = False,
        drop_self_loops: bool = False,
        dedup: bool = False,
        add_self_loops: bool = False,
    ) -> "CSRGraph":
        """Build from edge arrays ``src[i] -> dst[i]``.

        Args:
            src, dst: integer arrays of equal length; ids in ``[0, num_nodes)``.
            num_nodes: defaults to ``max id + 1`` (0 for no edges).
            symmetrize: also add every reverse edge ``dst -> src``.
            drop_self_loops: remove ``v -> v`` edges (applied before ``add_self_loops``).
            dedup: keep one copy of each repeated edge (implied by ``symmetrize`` and ``add_self_loops``).
            add_self_loops: give every node exactly one ``v -> v`` edge.

        Cost: one stable sort of nnz int64 keys (O(nnz log nnz)), about 3 x nnz x 8 bytes of temporaries.
        """
        src = np.asarray(src).astype(np.int64, copy=False).ravel()
        dst = np.asarray(dst).astype(np.int64, copy=False).ravel()
        if src.shape != dst.shape:
            raise ConfigError(f"src and dst must have the same length, got {src.shape[0]} and {dst.shape[0]}")
        if num_nodes is None:
            num_nodes = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
        num_nodes = int(num_nodes)
        if num_nodes < 0:
            raise ConfigError(f"num_nodes must be >= 0, got {num_nodes}")
        if src.size:
            lo = min(int(src.min()), int(dst.min()))
            hi = max(int(src.max()), int(dst.max()))
            if lo < 0 or hi >= num_nodes:
                bad = lo if lo < 0 else hi
                raise ConfigError(f"node id {bad} is out of range: expected ids in [0, {num_nodes})")
        if symmetrize:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
            dedup = True
        if drop_self_loops or add_self_loops:
            keep = src != dst
            src, dst = src[keep], dst[keep]
        if add_self_loops:
            loops = np.arange(num_nodes, dtype=np.int64)
            src, dst = np.concatenate([src, loops]), np.concatenate([dst, loops])
            dedup = True
        # Sort by (dst, src): rows by destination, neighbours ascending inside a row.
        key = dst * max(num_nodes, 1) + src
        key = np.sort(key)
        if dedup:
            # Not np.unique: numpy >= 2.3 answers it with a hash table, ~15x slower than this on 8 M int64 keys.
            first = np.ones(key.shape[0], dtype=bool)
            np.not_equal(key[1:], key[:-1], out=first[1:])
            key = key[first]
        n = max(num_nodes, 1)
        rows, cols = np.divmod(key, n)
        counts = np.bincount(rows, minlength=num_nodes)
        indptr = np.zeros(num_nodes + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        return cls(indptr=indptr, indices=cols.astype(np.int64, copy=False), num_nodes=num_nodes,
                   simple_symmetric=symmetrize and drop_self_loops, symmetric=symmetrize)

    @classmethod
    def from_scipy(cls, a) -> "CSRGraph":
        """From a square scipy sparse matrix whose row v holds v's in-neighbours (``A[dst, src]``)."""
        a = a.tocsr()
        a.sort_indices()
        return cls(indptr=a.indptr.astype(np.int64), indices=a.indices.astype(np.int64), num_nodes=a.shape[0])

    # ----------------------------------------------------------------------------------------- views
    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def num_self_loops(self) -> int:
        """Entries ``v -> v`` (one pass over the entries)."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))  # (nnz,)
        return int(np.count_nonzero(self.indices == dst))

    def describe_edges(self) -> str:
        """The edge count as a person reads it: ``5,278 undirected edges (10,556 directed entries)`` for a graph
        known to be symmetric (a self-loop is one edge and one entry), else ``948,464 directed edges``."""
        if not self.symmetric:
            return f"{self.num_edges:,} directed edges"
        loops = 0 if self.simple_symmetric else self.num_self_loops()
        return f"{(self.num_edges + loops) // 2:,} undirected edges ({self.num_edges:,} directed entries)"

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` int64 arrays in CSR order (by destination, then source)."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))
        return self.indices.copy(), dst

    def in_degree(self) -> np.ndarray:
        return np.diff(self.indptr)

    def out_degree(self) -> np.ndarray:
        return np.bincount(self.indices, minlength=self.num_nodes).astype(np.int64)

    def transpose(self) -> "CSRGraph":
        """The reversed graph (row v lists v's out-neighbours)."""
        src, dst = self.edges()
        return CSRGraph.from_edges(dst, src, self.num_nodes)

    def to_scipy(self):
        import scipy.sparse as sp

        data = np.ones(self.num_edges, dtype=np.float32)
        return sp.csr_matrix((data, self.indices, self.indptr), shape=(self.num_nodes, self.num_nodes))

    def equals(self, other: "CSRGraph") -> bool:
        return (
            self.num_nodes == other.num_nodes
            and np.array_equal(self.indptr, other.indptr)
            and np.array_equal(self.indices, other.indices)
        )

    def __repr__(self) -> str:
        return f"CSRGraph(num_nodes={self.num_nodes:,}, num_edges={self.num_edges:,})"


@dataclass(eq=False)
class GraphDataset:
    """A graph plus per-node data, all indexed by node id.

    Shapes:
        features: float32 (N, F) or None;  labels: int64 (N,) or None (-1 = unlabelled);
        train_mask / val_mask / test_mask: bool (N,) or None.
    """

    graph: CSRGraph
    features: np.ndarray | None = None
    labels: np.ndarray | None = None
    train_mask: np.ndarray | None = None
    val_mask: np.ndarray | None = None
    test_mask: np.ndarray | None = None
    num_classes: int = 0
    name: str = "graph"
    extra: dict = field(default_factory=dict)  # reader-specific arrays (e.g. OGB node_year), indexed by node

    def __post_init__(self) -> None:
        n = self.graph.num_nodes
        for attr in ("features", "labels", "train_mask", "val_mask", "test_mask"):
            arr = getattr(self, attr)
            if arr is not None and arr.shape[0] != n:
                raise ConfigError(f"{attr} has {arr.shape[0]} rows but the graph has {n} nodes")
        if self.labels is not None and self.num_classes == 0 and self.labels.size:
            self.num_classes = int(self.labels.max()) + 1

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    def __repr__(self) -> str:
        f = None if self.features is None else self.features.shape[1]
        return (
            f"GraphDataset({self.name!r}, nodes={self.graph.num_nodes:,}, edges={self.graph.num_edges:,}, "
            f"features={f}, classes={self.num_classes})"
        )


def check_disjoint_splits(masks: dict[str, np.ndarray | None], files: dict[str, object]) -> None:
    """Refuse train / val / test masks that share a node: a model evaluated on nodes it trained on reports an
    accuracy that means nothing. ``files``: where each mask came from (a path), for the message; the error names
    the later file and the first shared node."""
    from haloflow.errors import InputFormatError

    names = [n for n in ("train_mask", "val_mask", "test_mask") if masks.get(n) is not None]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = np.flatnonzero(np.asarray(masks[a]) & np.asarray(masks[b]))
            if both.size:
                raise InputFormatError(files[b], f"{both.size:,} node(s) of the {b.split('_')[0]} split are in the "
                                       f"{a.split('_')[0]} split too (node {int(both[0])} first, also in "
                                       f"{files[a]}): expected disjoint train, val and test splits")
