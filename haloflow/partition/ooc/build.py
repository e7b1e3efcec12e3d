"""Passes 4b and 4c: every part's halo and send lists from its bucket, then each `GraphPart`, one at a time.

::

    4b halo sweep, part p = 0..K-1:  read part-p/edges.npy front to back; seen[u] = True for each remote u
                                     halo_p = flatnonzero(seen)     sorted new ids, hence grouped by owner
                                     part-p/halo.npy = halo_p; the slice owned by q is what q sends to p:
                                     appended to part-q/send.npy (p ascending, so send.npy is q's send_ids + lo_q)
    4c build, part k:                indptr = cumsum(in_new[lo:hi]); the entries of edges.npy in row ranges:
                                     column = src - lo (inner) or n_inner + rank in halo_k; sorted in each row
                                     by the key row * num_local + column, exactly as `HaloBuilder.build` sorts

One part's arrays at a time: the local CSR is written to part-k/indices.npy in row ranges, and the part handed to
`save_partitioned` holds memory maps of it and of its node data; their pages are released before the next part.
The halo counts and cut edges make the same `PartitionStats` as ``HaloIndex`` does in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np

from haloflow.host.malloc import trim
from haloflow.partition.ooc.budget import MemoryPlan, raise_open_files
from haloflow.partition.ooc.route import PartBuckets
from haloflow.partition.stats import PartitionStats
from haloflow.partition.types import GraphPart, PartitionBook
from haloflow.utils.mapped import MappedNpy, NpyWriter
from haloflow.utils.progress import progress_bar

__all__ = ["HaloSweep", "sweep_halos", "check_part_memory", "build_parts_streamed"]

# A part's own arrays per inner or halo node: indptr / halo ids 8, local degrees 16, the local gids 8, and the send
# lists (about as long as the halo) read, widened to int64 and shifted: 24 while they are made. Measured: with 40 here
# a random graph (2M nodes, 67M edges, K = 16, a halo of 1.8M per part) peaked at 413 MiB under a 384 MiB budget.
_PART_BYTES_PER_NODE = 56

log = logging.getLogger(__name__)


class HaloSweep:
    """What pass 4b found: halo sizes, cut entries, and ``sends[q, p]`` = rows q sends to p."""

    def __init__(self, halo: np.ndarray, cut_edges: int, sends: np.ndarray):
        self.halo, self.cut_edges, self.sends = halo, cut_edges, sends

    def stats(self, buckets: PartBuckets, num_edges: int) -> PartitionStats:
        n = int(buckets.bounds[-1])
        return PartitionStats(num_nodes=n, num_edges=num_edges, cut_edges=self.cut_edges,
                              inner=np.diff(buckets.bounds).astype(np.int64), halo=self.halo.astype(np.int64),
                              in_edges=buckets.in_edges.astype(np.int64), train=buckets.train)


def sweep_halos(buckets: PartBuckets, plan: MemoryPlan, *, progress: bool) -> HaloSweep:
    """Pass 4b (module docstring). Memory: a byte per node, plus one part's halo (<= 8 bytes per node)."""
    bounds, k = buckets.bounds, buckets.num_parts
    n = int(bounds[-1])
    seen = np.zeros(n, dtype=bool)  # (N,)
    halo_sizes = np.zeros(k, dtype=np.int64)
    sends = np.zeros((k, k), dtype=np.int64)
    cut = 0
    raise_open_files(k)
    send_out = [NpyWriter(buckets.send(q), buckets.id_dtype, (None,)) for q in range(k)]
    try:
        with progress_bar(total=k, desc="halo", unit="part", enabled=progress) as bar:
            for p in range(k):
                lo, hi = int(bounds[p]), int(bounds[p + 1])
                with MappedNpy(buckets.edges(p)) as edges:
                    step = plan.build_entries
                    for a in range(0, len(edges), step):
                        src = edges.rows(a, min(a + step, len(edges)))
                        remote = src[(src < lo) | (src >= hi)]
                        cut += remote.shape[0]
                        seen[remote] = True
                        del src, remote
                halo = np.flatnonzero(seen)  # (H_p,) int64, sorted
                seen[halo] = False
                np.save(buckets.halo(p), halo)
                halo_sizes[p] = halo.shape[0]
                owners = np.searchsorted(halo, bounds)  # (K+1,) where each owner's group starts
                for q in range(k):
                    if q != p and owners[q + 1] > owners[q]:
                        send_out[q].write(halo[owners[q]:owners[q + 1]])
                        sends[q, p] = owners[q + 1] - owners[q]
                del halo
                bar.update(1)
        for w in send_out:
            w.close()
    except BaseException:
        for w in send_out:
            w.abort()
        raise
    return HaloSweep(halo_sizes, cut, sends)


def _local_csr(buckets: PartBuckets, k: int, halo: np.ndarray, in_new: np.ndarray, max_entries: int,
               local_of: np.ndarray) -> np.ndarray:
    """Part k's local indptr; its indices go to part-k/indices.npy (module docstring). ``local_of`` (N,) is
    scratch for the map new gid -> local id, refilled here for the part's inner and halo nodes (the only gids its
    entries hold), as `HaloBuilder` does."""
    lo, hi = int(buckets.bounds[k]), int(buckets.bounds[k + 1])
    n_inner = hi - lo
    num_local = n_inner + halo.shape[0]
    local_of[lo:hi] = np.arange(n_inner, dtype=local_of.dtype)
    local_of[halo] = np.arange(n_inner, num_local, dtype=local_of.dtype)
    indptr = np.zeros(n_inner + 1, dtype=np.int64)
    np.cumsum(in_new[lo:hi], out=indptr[1:])
    nnz = int(indptr[-1])
    with MappedNpy(buckets.edges(k)) as edges, NpyWriter(buckets.folders[k] / "indices.npy", np.int64,
                                                          (nnz,)) as out:
        r0 = 0
        while r0 < n_inner:
            # rows r0..r1-1 with about max_entries entries (one longer row goes alone)
            r1 = int(np.searchsorted(indptr, indptr[r0] + max_entries, side="right")) - 1
            r1 = min(max(r1, r0 + 1), n_inner)
            e0, e1 = int(indptr[r0]), int(indptr[r1])
            col = local_of[edges.rows(e0, e1)].astype(np.int64)  # (e,) local columns of the entries' new gids
            row = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(indptr[r0:r1 + 1]))  # (e,)
            key = row * num_local + col
            del col
            key.sort()
            out.write(key - row * num_local)
            del key, row
            r0 = r1
    return indptr


def check_part_memory(buckets: PartBuckets, sweep: HaloSweep, in_new: np.ndarray, out_new: np.ndarray,
                      plan: MemoryPlan) -> None:
    """Refuse (``ConfigError``) a budget the build cannot keep: the largest part's arrays beside the degrees by new
    id and the local id map (``MemoryPlan.check_write``). Called before anything is written."""
    n = int(buckets.bounds[-1])
    largest = int((np.diff(buckets.bounds) + sweep.halo).max())
    plan.check_write(in_new.nbytes + out_new.nbytes + 4 * n, largest, _PART_BYTES_PER_NODE)


def build_parts_streamed(buckets: PartBuckets, sweep: HaloSweep, in_new: np.ndarray, out_new: np.ndarray,
                         plan: MemoryPlan, *, num_classes: int, releases=()) -> Iterator[GraphPart]:
    """Every `GraphPart` in order, for ``save_partitioned`` (module docstring). ``releases``: memory maps whose
    pages are handed back before the first part is built (the new_to_orig map, once it is written)."""
    book = PartitionBook(bounds=buckets.bounds)
    k_parts = buckets.num_parts
    previous: list[MappedNpy] = []
    local_of = np.empty(int(buckets.bounds[-1]), dtype=np.int32)  # (N,) scratch of _local_csr
    for k in range(k_parts):
        for m in list(releases) + previous:
            m.release()
        trim()  # the last part's arrays go back to the OS, not only to the heap: the budget counts resident pages
        releases = ()
        if k > 0:  # part k-1 is in the folder: its temporary files can go
            for f in buckets.folders[k - 1].iterdir():
                f.unlink()
        lo, hi = book.part_range(k)
        halo = np.load(buckets.halo(k))  # (n_halo,) int64
        # held now: degrees by new id (16 B per node), the local map (4), and this part's node-sized arrays
        held = in_new.nbytes + out_new.nbytes + local_of.nbytes + _PART_BYTES_PER_NODE * (hi - lo + halo.shape[0])
        indptr = _local_csr(buckets, k, halo, in_new, plan.write_entries(held), local_of)
        send = np.load(buckets.send(k))  # (sum send,) new gids, grouped by destination part
        send_offsets = np.zeros(k_parts + 1, dtype=np.int64)
        np.cumsum(sweep.sends[k], out=send_offsets[1:])
        local_gids = np.concatenate([np.arange(lo, hi, dtype=np.int64), halo])  # (num_local,)
        maps = {"indices": MappedNpy(buckets.folders[k] / "indices.npy"), "orig_ids": MappedNpy(buckets.rows(k))}
        for name in buckets.node_data:
            maps[name] = MappedNpy(buckets.node(k, name))
        part = GraphPart(
            part_id=k,
            book=book,
            n_inner=hi - lo,
            n_halo=int(halo.shape[0]),
            indptr=indptr,
            indices=maps["indices"].array,
            halo_gids=halo,
            halo_offsets=np.searchsorted(halo, book.bounds).astype(np.int64),
            send_ids=(send.astype(np.int64) - lo),
            send_offsets=send_offsets,
            in_degree=in_new[local_gids],
            out_degree=out_new[local_gids],
            orig_ids=maps["orig_ids"].array,
            num_classes=num_classes,
        )
        for name in buckets.node_data:
            setattr(part, name, maps[name].array)
        del local_gids, halo, send, indptr
        previous = list(maps.values())
        yield part
        del part
    for m in previous:
        m.release()
