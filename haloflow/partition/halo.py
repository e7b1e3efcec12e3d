"""Halo construction: cut the relabelled graph into `GraphPart`s, one part at a time.

Edges belong to their destination's part. A *halo* node of part k is a remote in-neighbour of one of k's inner
nodes; part k receives its features from the owner. Example, K = 2, bounds = [0, 3, 5] (new ids)::

    edges (src -> dst): 0->1  3->1  4->2  1->3  2->4  3->4
                        part 0 owns 0 1 2       part 1 owns 3 4

    part 0: inner 0 1 2 | halo 3 4          part 1: inner 3 4 | halo 1 2
            halo_offsets = [0, 0, 2]                halo_offsets = [0, 2, 2]
            row 1: cols [0, 3]  (0, halo 3)         row 3 (local 0): cols [2]     (halo 1)
            row 2: cols [4]     (halo 4)            row 4 (local 1): cols [0, 3]  (3, halo 2)
            send to 1: local [1, 2]  = part 1's halo group for owner 0 (gids 1 2)
            (part 0's halo group for owner 1 is gids 3 4 = part 1's send list to 0: local [0, 1])

Both the halos of every part and the send lists come from one global pass, `HaloIndex`: the sorted unique keys
``dst_part * N + src_gid`` of the cut edges. The keys of part p, minus ``p * N``, are p's halo gids, already grouped
by owner (owners hold ascending id ranges) and sorted; the send list of k to p is the slice of p's halo that falls
in k's range. So no part needs another part's edges, and parts can be built (and written) one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.errors import ConfigError
from haloflow.partition.types import GraphPart, PartitionBook
from haloflow.utils.arrays import sorted_unique

if TYPE_CHECKING:
    from haloflow.partition.relabel import Relabelling

__all__ = ["HaloIndex", "HaloBuilder", "build_part", "build_parts"]

# Edges handled per step of the global pass: bounds its temporaries to about 6 x 8 bytes x this (~200 MB).
_CHUNK_EDGES = 1 << 22
# Largest K x N for which the global pass marks keys in a byte map instead of sorting them (256 MiB).
_DENSE_LIMIT = 1 << 28


def _check_relabelling(graph: CSRGraph, relabelling: "Relabelling") -> None:
    n = graph.num_nodes
    if relabelling.book.num_nodes != n or relabelling.new_to_orig.shape != (n,) or relabelling.orig_to_new.shape != (n,):
        raise ConfigError(
            f"relabelling covers {relabelling.book.num_nodes} nodes (new_to_orig {relabelling.new_to_orig.shape}, "
            f"orig_to_new {relabelling.orig_to_new.shape}) but the graph has {n} nodes"
        )


@dataclass(frozen=True, eq=False)
class HaloIndex:
    """Halo gids of every part plus the edge-cut counts, from one chunked pass over the edges.

    Layout::

        keys  int64 (H,)  sorted unique  dst_part * N + src_gid   over the cut edges (owner(src) != owner(dst))
        part_offsets (K+1,)   part p's halo = keys[part_offsets[p]:part_offsets[p+1]] - p * N
        H = total halo nodes = sum over parts = the communication volume of one exchange

    Shapes:
        in_edges: int64 (K,) edges whose destination part p owns; cut_edges: edges across parts.

    Cost: O(E) gathers, then either a byte map of K x N (small K x N) or a sort of the cut edges' keys;
    memory O(N + H + chunk), plus K x N bytes for the byte map.
    """

    book: PartitionBook
    keys: np.ndarray
    part_offsets: np.ndarray
    in_edges: np.ndarray
    cut_edges: int

    @classmethod
    def build(
        cls,
        graph: CSRGraph,
        relabelling: "Relabelling",
        *,
        chunk_edges: int = _CHUNK_EDGES,
        dense_limit: int = _DENSE_LIMIT,
    ) -> "HaloIndex":
        """One pass over the edges in row chunks.

        Args:
            chunk_edges: edges per step (bounds the temporaries).
            dense_limit: when K x N is at most this, the keys are collected in a byte map of K x N entries
                (one scattered write per cut edge, one scan at the end: no sort); otherwise each chunk's keys are
                sorted and the chunks merged by a final sort.
        """
        _check_relabelling(graph, relabelling)
        book, n, k = relabelling.book, graph.num_nodes, relabelling.book.num_parts
        orig_to_new = relabelling.orig_to_new
        node_part = book.owner(orig_to_new).astype(np.int32)  # (N,) part of each original id
        in_deg = graph.in_degree()  # (N,)
        in_edges = np.bincount(node_part, weights=in_deg, minlength=k).astype(np.int64)  # (K,)
        dense = k * n <= dense_limit
        seen = np.zeros(k * n if dense else 0, dtype=bool)  # (K*N,) seen[dst_part * N + src_gid]
        # Row ranges holding about chunk_edges edges each (one huge row may make a bigger chunk).
        cuts = np.searchsorted(graph.indptr, np.arange(0, graph.num_edges, max(chunk_edges, 1)), side="right") - 1
        cuts = sorted_unique(np.concatenate([cuts, [n]]))
        found, cut_edges = [], 0
        for r0, r1 in zip(cuts[:-1], cuts[1:]):
            e0, e1 = int(graph.indptr[r0]), int(graph.indptr[r1])
            src = graph.indices[e0:e1]  # (e,) original ids
            dst_part = np.repeat(node_part[r0:r1], in_deg[r0:r1])  # (e,)
            cross = node_part[src] != dst_part  # (e,)
            cut_edges += int(np.count_nonzero(cross))
            keys = dst_part[cross].astype(np.int64) * n + orig_to_new[src[cross]]  # (cut in chunk,)
            if dense:
                seen[keys] = True
            else:
                found.append(sorted_unique(keys))
        if dense:
            keys = np.flatnonzero(seen).astype(np.int64)  # (H,) ascending by construction
        else:
            keys = sorted_unique(np.concatenate(found)) if found else np.zeros(0, np.int64)  # (H,)
        part_offsets = np.searchsorted(keys, np.arange(k + 1, dtype=np.int64) * n)  # (K+1,)
        return cls(book=book, keys=keys, part_offsets=part_offsets, in_edges=in_edges, cut_edges=cut_edges)

    @property
    def num_parts(self) -> int:
        return self.book.num_parts

    def halo(self, p: int) -> np.ndarray:
        """New gids of part p's halo nodes, sorted (hence grouped by owner): int64 (n_halo_p,)."""
        lo, hi = self.part_offsets[p], self.part_offsets[p + 1]
        return self.keys[lo:hi] - p * self.book.num_nodes

    def halo_sizes(self) -> np.ndarray:
        """int64 (K,) halo nodes per part."""
        return np.diff(self.part_offsets)

    def sent_gids(self, k: int, p: int) -> np.ndarray:
        """Gids of part k's inner nodes that part p holds as halo, sorted: the slice of p's halo in k's range."""
        halo = self.halo(p)
        lo, hi = self.book.part_range(k)
        return halo[np.searchsorted(halo, lo) : np.searchsorted(halo, hi)]


class HaloBuilder:
    """Builds the `GraphPart` of any part; the O(E) global work (`HaloIndex`, degrees) is done once here.

    Args:
        graph: the whole graph, in ORIGINAL ids.
        relabelling: the partition book and the new <-> original id maps.
        index: a `HaloIndex` already built for this graph and relabelling (built here when None).
    """

    def __init__(self, graph: CSRGraph, relabelling: "Relabelling", *, index: HaloIndex | None = None):
        _check_relabelling(graph, relabelling)
        self.graph = graph
        self.book = relabelling.book
        self.new_to_orig = relabelling.new_to_orig
        self.orig_to_new = relabelling.orig_to_new
        self.index = index if index is not None else HaloIndex.build(graph, relabelling)
        # Global degrees indexed by new id: normalisation needs the whole graph's degrees, also for halo nodes.
        self.in_degree = graph.in_degree()[self.new_to_orig]  # (N,)
        self.out_degree = graph.out_degree()[self.new_to_orig]  # (N,)
        # Scratch map new gid -> local id, refilled for each part's inner and halo nodes (the only gids read).
        self._local_of = np.zeros(graph.num_nodes, dtype=np.int64)  # (N,)

    def build(self, k: int, dataset: GraphDataset | None = None) -> GraphPart:
        """The part k: local CSR over [inner | halo], halo groups, send lists, degrees, inner node data.

        Cost: O(in-edges of k) gathers plus one sort of them; O(K) slices for the send lists.
        Not thread-safe: it reuses one scratch map.
        """
        book = self.book
        if not 0 <= k < book.num_parts:
            raise ConfigError(f"part index k={k} is out of range: expected 0 <= k < {book.num_parts}")
        if dataset is not None and dataset.num_nodes != self.graph.num_nodes:
            raise ConfigError(f"dataset has {dataset.num_nodes} nodes but the graph has {self.graph.num_nodes}")
        lo, hi = book.part_range(k)
        n_inner = hi - lo
        rows = self.new_to_orig[lo:hi]  # (n_inner,) original ids of the inner nodes, in local order
        halo_gids = self.index.halo(k)  # (n_halo,)
        n_halo = int(halo_gids.size)
        num_local = n_inner + n_halo

        # Gather the in-edges of the inner rows: row i's edges are indices[starts[i] : starts[i] + counts[i]].
        indptr_g = self.graph.indptr
        starts = indptr_g[rows]  # (n_inner,)
        counts = indptr_g[rows + 1] - starts  # (n_inner,)
        indptr = np.zeros(n_inner + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        nnz = int(indptr[-1])
        pos = np.arange(nnz, dtype=np.int64) + np.repeat(starts - indptr[:-1], counts)  # (nnz,)
        src = self.orig_to_new[self.graph.indices[pos]]  # (nnz,) new gids
        del pos
        local_of = self._local_of
        local_of[lo:hi] = np.arange(n_inner, dtype=np.int64)
        local_of[halo_gids] = np.arange(n_inner, num_local, dtype=np.int64)
        col = local_of[src]  # (nnz,) local column ids
        del src
        # Sort inside each row: rows are already grouped, so sorting row * num_local + col keeps them in place.
        row = np.repeat(np.arange(n_inner, dtype=np.int64), counts)  # (nnz,)
        key = row * num_local + col
        key.sort()
        indices = key - row * num_local  # (nnz,)
        del key, row, col

        # Send lists: for every peer p, the slice of p's halo that k owns, as local inner ids.
        sends = [
            np.zeros(0, np.int64) if p == k else self.index.sent_gids(k, p) - lo for p in range(book.num_parts)
        ]
        send_offsets = np.zeros(book.num_parts + 1, dtype=np.int64)
        np.cumsum([s.size for s in sends], out=send_offsets[1:])

        local_gids = np.concatenate([np.arange(lo, hi, dtype=np.int64), halo_gids])  # (num_local,)
        part = GraphPart(
            part_id=k,
            book=book,
            n_inner=n_inner,
            n_halo=n_halo,
            indptr=indptr,
            indices=indices,
            halo_gids=halo_gids,
            halo_offsets=np.searchsorted(halo_gids, book.bounds).astype(np.int64),  # (K+1,)
            send_ids=np.concatenate(sends).astype(np.int64),
            send_offsets=send_offsets,
            in_degree=self.in_degree[local_gids],
            out_degree=self.out_degree[local_gids],
            orig_ids=rows.astype(np.int64, copy=True),
        )
        if dataset is not None:
            _attach_node_data(part, dataset, rows)
        return part


def _attach_node_data(part: GraphPart, dataset: GraphDataset, rows: np.ndarray) -> None:
    """Copy the inner nodes' rows of every node array the dataset has (in local order)."""
    for name in ("features", "labels", "train_mask", "val_mask", "test_mask"):
        arr = getattr(dataset, name)
        if arr is not None:
            setattr(part, name, np.ascontiguousarray(arr[rows]))
    part.num_classes = int(dataset.num_classes)


def build_part(graph: CSRGraph, relabelling: "Relabelling", k: int, dataset: GraphDataset | None = None) -> GraphPart:
    """Part k of ``graph`` (ORIGINAL ids) under ``relabelling``; node data from ``dataset`` if given.

    This pays the O(E) global pass every call; to build several parts, use `HaloBuilder` or `build_parts`.
    """
    return HaloBuilder(graph, relabelling).build(k, dataset)


def build_parts(
    graph: CSRGraph, relabelling: "Relabelling", dataset: GraphDataset | None = None, *, index: HaloIndex | None = None
) -> Iterator[GraphPart]:
    """Every part in order, one at a time (only one part's arrays are alive at once)."""
    builder = HaloBuilder(graph, relabelling, index=index)
    for k in range(relabelling.book.num_parts):
        yield builder.build(k, dataset)
