"""Passes 1 and 2: count the rows, then build the CSR on disk by an external bucket sort of the edges.

::

    pass 1 (count)   stream the input once: entries per row (both directions when symmetrising), node count
                     -> rows cut into buckets [r_0, r_1), [r_1, r_2), ... each holding <= bucket_entries entries
    pass 2 (scatter) stream the input again: key = dst * N + src of every entry appended to its row range's file
           (sort)    per bucket, in row order: read its keys, sort them in memory, drop repeats (when symmetrising),
                     append the sources to indices.npy and the row lengths to indptr.npy; add the out-degrees

    DiskCSR   indptr.npy  int64 (N+1,)        row v = the in-neighbours of v, sorted (CSRGraph's layout)
              indices.npy int32 | int64 (nnz,)  (int32 below 2^31 nodes: half the bytes each streaming pass reads)

The CSR equals ``CSRGraph.from_edges(src, dst, N, symmetrize=...)`` of the same edges array for array: the same
keys, sorted and de-duplicated the same way (repeats merged only when symmetrising; self-loops kept), because a
bucket holds whole rows and the buckets are written in row order. Reading it back (`blocks`) is sequential and
releases the pages behind it, so a pass's resident memory is one block.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from haloflow.data.edge_source import EdgeSource
from haloflow.errors import ConfigError
from haloflow.partition.ooc.budget import MemoryPlan, OutOfCoreConfig, plan_memory, raise_open_files
from haloflow.partition.ooc.kernels import compact_bucket, count_into, cut_ranges, group_by
from haloflow.partition.ooc.scratch import ScratchSpace
from haloflow.utils.mapped import MappedNpy, NpyWriter
from haloflow.utils.progress import progress_bar

__all__ = ["DiskCSR", "RowCounts", "count_rows", "build_disk_csr"]

log = logging.getLogger(__name__)

_MAX_KEY_NODES = 3_037_000_499  # dst * N + src must fit in int64: N <= sqrt(2^63)


@dataclass
class DiskCSR:
    """A CSR on disk (module docstring) and how to stream it."""

    indptr_path: Path
    indices_path: Path
    num_nodes: int
    num_edges: int
    symmetric: bool
    num_buckets: int = 0  # how many bucket files pass 2 sorted

    def blocks(self, max_entries: int, max_rows: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(first_row, indptr_block, indices_block)`` in row order: rows ``first_row .. first_row + r - 1`` with
        global offsets ``indptr_block`` (r+1,) and their entries; at most ``max_entries`` entries per block unless
        one row has more (then that row alone), and at most ``max_rows`` rows."""
        with MappedNpy(self.indptr_path) as indptr, MappedNpy(self.indices_path) as indices:
            n = self.num_nodes
            lo = 0
            while lo < n:
                window = indptr.rows(lo, min(lo + max_rows, n) + 1)  # (w+1,)
                start = int(window[0])
                hi_rel = int(np.searchsorted(window, start + max_entries, side="right")) - 1
                hi_rel = max(hi_rel, 1)  # one row more than a block still goes, alone
                block = window[: hi_rel + 1].copy()
                del window
                yield lo, block, indices.rows(start, int(block[-1]))
                del block  # the consumer's block is not kept alive while the next one is read
                lo += hi_rel

    def in_degree_blocks(self, max_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, in-degrees)`` int64 of consecutive row ranges."""
        with MappedNpy(self.indptr_path) as indptr:
            for lo in range(0, self.num_nodes, max_rows):
                yield lo, np.diff(indptr.rows(lo, min(lo + max_rows, self.num_nodes) + 1))

    def in_degree(self) -> np.ndarray:
        """int64 (N,) all in-degrees (8 bytes per node: only where the plan counted them)."""
        out = np.empty(self.num_nodes, dtype=np.int64)
        for lo, deg in self.in_degree_blocks(1 << 22):
            out[lo:lo + deg.shape[0]] = deg
        return out


@dataclass
class RowCounts:
    """Pass 1's result: entries per row before de-duplication (an upper bound on each row's length)."""

    counts: np.ndarray  # int64 (N,)
    num_edges: int  # input edges read
    num_nodes: int
    plan: MemoryPlan


def _directions(src: np.ndarray, dst: np.ndarray, symmetrize: bool) -> tuple[np.ndarray, np.ndarray]:
    if symmetrize:
        return np.concatenate([src, dst]), np.concatenate([dst, src])
    return src, dst


def count_rows(source: EdgeSource, config: OutOfCoreConfig, method: str, balance: tuple[str, ...], *,
               symmetrize: bool, progress: bool) -> RowCounts:
    """Pass 1. With a known node count the budget is checked before the first edge is read; otherwise as the ids
    grow (the count array grows with them), so a budget too small fails as soon as an id shows it."""
    known = source.num_nodes
    plan = plan_memory(config, known if known is not None else 0, method, balance, unknown_count=known is None)
    counts = np.zeros(known if known is not None else 1024, dtype=np.int64)
    max_id, total = -1, 0
    chunk = plan.chunk_edges_for(source.reader_bytes_per_edge)
    with progress_bar(total=source.num_edges, desc="count", unit="edge", enabled=progress) as bar:
        for src, dst in source.chunks(chunk):
            total += src.shape[0]
            bar.update(src.shape[0])
            if src.size == 0:
                continue
            top = max(int(src.max()), int(dst.max()))
            if top >= counts.shape[0]:  # only for an unknown node count: grow by 1.25x, checking the budget
                size = max(top + 1, counts.shape[0] + counts.shape[0] // 4)
                plan_memory(config, size, method, balance, unknown_count=True, at_least=True)
                grown = np.zeros(size, dtype=np.int64)
                grown[: counts.shape[0]] = counts
                counts = grown
            max_id = max(max_id, top)
            count_into(dst, counts)
            if symmetrize:  # the reverse entry src <- dst lands in row src
                count_into(src, counts)
    n = source.finish(total, max_id)
    if n > _MAX_KEY_NODES:
        raise ConfigError(f"{source.path}: {n:,} nodes is over the {_MAX_KEY_NODES:,} the bucket sort's keys "
                          f"(dst x N + src in 64 bits) can hold")
    if counts.shape[0] != n:
        trimmed = np.zeros(n, dtype=np.int64)
        m = min(n, counts.shape[0])
        trimmed[:m] = counts[:m]
        counts = trimmed
    plan = plan_memory(config, n, method, balance)  # the final plan, for the node count now known
    log.info("pass 1: %s edges, %s nodes; %s", f"{total:,}", f"{n:,}", plan.describe())
    return RowCounts(counts=counts, num_edges=total, num_nodes=n, plan=plan)


def _scatter_chunk(src, dst, symmetrize, n, bounds, files) -> None:
    """Append one input chunk's keys ``dst * N + src`` to the files of their row ranges (temporaries gone on
    return)."""
    s2, d2 = _directions(src, dst, symmetrize)
    keys = d2 * n + s2  # (e,) int64
    which = np.searchsorted(bounds, d2, side="right") - 1  # (e,) bucket of each entry
    del s2, d2
    order, offsets = group_by(which, bounds.shape[0] - 1)
    del which
    keys = keys[order]
    del order
    for i in np.flatnonzero(np.diff(offsets)):
        files[i].write(keys[offsets[i]:offsets[i + 1]].data)


def build_disk_csr(source: EdgeSource, rows: RowCounts, scratch: ScratchSpace, *, symmetrize: bool,
                   progress: bool) -> tuple[DiskCSR, np.ndarray]:
    """Pass 2: the on-disk CSR and the out-degrees int64 (N,) (module docstring). ``rows.counts`` is dropped."""
    plan, n = rows.plan, rows.num_nodes
    bounds = cut_ranges(rows.counts, plan.bucket_entries, plan.bucket_rows)  # (B+1,)
    b = bounds.shape[0] - 1
    bucket_sizes = np.add.reduceat(rows.counts, bounds[:-1]) if n else np.zeros(0, np.int64)
    rows.counts = None  # the plan's node bytes count the out-degrees next, not the counts
    log.info("pass 2: %d buckets of at most %s entries", b, f"{int(bucket_sizes.max(initial=0)):,}")
    raise_open_files(b)
    paths = [scratch.path(f"bucket-{i}.bin") for i in range(b)]
    files = [open(p, "wb") for p in paths]
    try:
        chunk = plan.chunk_edges_for(source.reader_bytes_per_edge)
        with progress_bar(total=rows.num_edges, desc="scatter", unit="edge", enabled=progress) as bar:
            for src, dst in source.chunks(chunk):
                bar.update(src.shape[0])
                _scatter_chunk(src, dst, symmetrize, n, bounds, files)
                del src, dst  # before the next chunk is read
    finally:
        for f in files:
            f.close()
    scratch.note()

    idx_dtype = np.int32 if n < 2**31 else np.int64
    out_degree = np.zeros(n, dtype=np.int64)
    indptr_path, indices_path = scratch.path("csr", "indptr.npy"), scratch.path("csr", "indices.npy")
    nnz = 0
    with NpyWriter(indptr_path, np.int64, (n + 1,)) as indptr, NpyWriter(indices_path, idx_dtype, (None,)) as indices, \
            progress_bar(total=b, desc="bucket sort", unit="bucket", enabled=progress) as bar:
        indptr.write(np.zeros(1, dtype=np.int64))
        for i in range(b):
            r0, r1 = int(bounds[i]), int(bounds[i + 1])
            keys = np.fromfile(paths[i], dtype=np.int64)  # (entries,)
            paths[i].unlink()
            keys.sort()
            row_counts = np.zeros(r1 - r0, dtype=np.int64)
            w = compact_bucket(keys, max(n, 1), r0, row_counts, out_degree, symmetrize)
            indices.write(keys[:w].astype(idx_dtype))
            del keys
            indptr.write(nnz + np.cumsum(row_counts))
            nnz += w
            bar.update(1)
    scratch.note()
    log.info("pass 2: CSR of %s entries written (%s)", f"{nnz:,}", indices_path)
    return DiskCSR(indptr_path, indices_path, n, nnz, symmetrize, num_buckets=b), out_degree
