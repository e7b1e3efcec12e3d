"""Brute-force checks of a set of GraphParts against the whole graph (shared by the partition tests)."""

from __future__ import annotations

import numpy as np

from haloflow.partition.relabel import Relabelling, relabel
from haloflow.partition.types import Assignment

NODE_FIELDS = ("features", "labels", "train_mask", "val_mask", "test_mask")


def relabelling_from_parts(parts: np.ndarray, num_parts: int) -> Relabelling:
    """The real relabelling of a hand-made assignment (nodes sorted by part, original order inside a part)."""
    return relabel(Assignment(parts=np.asarray(parts, dtype=np.int64), num_parts=num_parts, method="hand-made"))


def check_parts(graph, parts, new_to_orig, dataset=None) -> None:
    """Assert that ``parts`` cut ``graph`` (original ids) exactly as the GraphPart layout promises."""
    src_all, dst_all = graph.edges()
    n = graph.num_nodes
    k_parts = len(parts)
    book = parts[0].book
    assert book.num_nodes == n and book.num_parts == k_parts
    assert np.array_equal(np.sort(new_to_orig), np.arange(n))
    orig_to_new = np.empty(n, np.int64)
    orig_to_new[new_to_orig] = np.arange(n)
    in_nbrs = [set() for _ in range(n)]
    for s, d in zip(src_all.tolist(), dst_all.tolist()):
        in_nbrs[d].add(s)
    in_deg, out_deg = graph.in_degree(), graph.out_degree()
    got_edges = []
    for k, part in enumerate(parts):
        assert part.part_id == k and np.array_equal(part.book.bounds, book.bounds)
        lo, hi = book.part_range(k)
        assert part.n_inner == hi - lo and np.array_equal(part.orig_ids, new_to_orig[lo:hi])
        # Halo = exactly the remote in-neighbours, by new gid, sorted (so grouped by owner ascending).
        expected_halo = sorted(
            {int(orig_to_new[s]) for v in part.orig_ids.tolist() for s in in_nbrs[v]} - set(range(lo, hi))
        )
        assert part.halo_gids.tolist() == expected_halo and part.n_halo == len(expected_halo)
        owners = book.owner(part.halo_gids)
        for p in range(k_parts):
            group = owners[part.halo_offsets[p] : part.halo_offsets[p + 1]]
            assert np.all(group == p) and np.count_nonzero(owners == p) == group.size
        assert part.halo_offsets[k] == part.halo_offsets[k + 1]
        # Local CSR: rows sorted, columns in range; map back to original (src, dst) pairs.
        assert part.indptr.shape == (part.n_inner + 1,) and part.indptr[0] == 0
        for i in range(part.n_inner):
            row = part.indices[part.indptr[i] : part.indptr[i + 1]]
            assert np.all(np.diff(row) >= 0)
        assert part.indices.size == 0 or (part.indices.min() >= 0 and part.indices.max() < part.num_local)
        local_gids = np.concatenate([np.arange(lo, hi), part.halo_gids])
        dst_local = np.repeat(np.arange(part.n_inner), np.diff(part.indptr))
        got_edges.append(
            np.stack([new_to_orig[local_gids[part.indices]], new_to_orig[local_gids[dst_local]]], axis=1)
        )
        # Global degrees of inner and halo nodes.
        assert np.array_equal(part.in_degree, in_deg[new_to_orig[local_gids]])
        assert np.array_equal(part.out_degree, out_deg[new_to_orig[local_gids]])
        if dataset is not None:
            for name in NODE_FIELDS:
                ref = getattr(dataset, name)
                got = getattr(part, name)
                assert (ref is None) == (got is None), name
                if ref is not None:
                    assert np.array_equal(np.asarray(got), ref[part.orig_ids]), name
    # Every edge is stored exactly once, in its destination's part.
    got = np.concatenate(got_edges)
    want = np.stack([src_all, dst_all], axis=1)
    assert np.array_equal(got[np.lexsort(got.T[::-1])], want[np.lexsort(want.T[::-1])])
    # Send lists line up with the peers' halo groups.
    for k, part in enumerate(parts):
        lo = book.part_range(k)[0]
        for p, peer in enumerate(parts):
            sent = part.send_ids[part.send_offsets[p] : part.send_offsets[p + 1]] + lo
            held = peer.halo_gids[peer.halo_offsets[k] : peer.halo_offsets[k + 1]]
            assert np.array_equal(sent, held), (k, p)


def small_dataset(seed: int = 0, num_nodes: int = 200, num_edges: int = 1000):
    """A directed random graph with self-loops, features, labels and masks (a GraphDataset)."""
    from haloflow.data.graph import CSRGraph, GraphDataset

    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    loops = rng.choice(num_nodes, 10, replace=False)
    graph = CSRGraph.from_edges(np.concatenate([src, loops]), np.concatenate([dst, loops]), num_nodes, dedup=True)
    split = rng.integers(0, 3, num_nodes)
    return GraphDataset(
        graph=graph,
        features=rng.standard_normal((num_nodes, 6)).astype(np.float32),
        labels=rng.integers(0, 4, num_nodes).astype(np.int64),
        train_mask=split == 0,
        val_mask=split == 1,
        test_mask=split == 2,
        num_classes=4,
        name="small",
    )
