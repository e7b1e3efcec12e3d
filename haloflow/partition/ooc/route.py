"""Pass 4a: relabel, then route every CSR row, entry and node-data row to its part's bucket files.

::

    parts (N,) --number_by_part--> orig_to_new (N,)       part p's nodes get bounds[p], bounds[p]+1, ... in original
                                                           order: exactly ``relabel``'s stable argsort
    one sequential pass over the on-disk CSR (rows in original order):
        row v of part p  ->  part-p/rows.npy   += v               (so rows.npy = new_to_orig[bounds[p]:bounds[p+1]])
        its entries      ->  part-p/edges.npy  += orig_to_new[u]  (new ids of the in-neighbours, row after row)
        in_new[orig_to_new[v]] = in-degree of v
    one pass over each node array (rows in original order)  ->  part-p/<name>.npy

Because a part's rows arrive in increasing original id, and new ids keep that order inside a part, each bucket
file lists the part's rows in local order without any sort: building the part later reads it front to back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from haloflow.data.graph_folder import NODE_FILES, NodeArrays
from haloflow.partition.ooc.budget import MemoryPlan, raise_open_files
from haloflow.partition.ooc.disk_csr import DiskCSR
from haloflow.partition.ooc.kernels import group_by, number_by_part, scatter_into
from haloflow.partition.ooc.scratch import ScratchSpace
from haloflow.utils.mapped import MappedNpy, NpyWriter
from haloflow.utils.progress import progress_bar

__all__ = ["PartBuckets", "relabel_streamed", "degrees_by_new_id", "route_rows", "route_node_data"]

log = logging.getLogger(__name__)


@dataclass
class PartBuckets:
    """The per-part temporary files of pass 4 (paths inside the scratch folder) and what routing counted."""

    bounds: np.ndarray  # int64 (K+1,) the partition book
    id_dtype: np.dtype  # of edges.npy (new ids)
    folders: list[Path]
    node_data: tuple[str, ...] = ()
    train: np.ndarray | None = None  # int64 (K,) training nodes per part, when there is a train mask
    in_edges: np.ndarray | None = None  # int64 (K,) entries per part (each part's in-edges)

    @property
    def num_parts(self) -> int:
        return len(self.folders)

    def edges(self, k: int) -> Path:
        return self.folders[k] / "edges.npy"

    def rows(self, k: int) -> Path:
        return self.folders[k] / "rows.npy"

    def node(self, k: int, name: str) -> Path:
        return self.folders[k] / f"{name}.npy"

    def halo(self, k: int) -> Path:
        return self.folders[k] / "halo.npy"

    def send(self, k: int) -> Path:
        return self.folders[k] / "send.npy"


def relabel_streamed(parts: np.ndarray, num_parts: int) -> tuple[np.ndarray, np.ndarray]:
    """``(bounds int64 (K+1,), orig_to_new (N,))``: the partition book and new ids of ``relabel`` (module
    docstring), ids int32 below 2^31 nodes."""
    n = parts.shape[0]
    bounds = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=num_parts), out=bounds[1:])
    orig_to_new = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
    number_by_part(parts, bounds, orig_to_new)
    return bounds, orig_to_new


def degrees_by_new_id(degree: np.ndarray, orig_to_new: np.ndarray) -> np.ndarray:
    """int64 (N,) ``out[orig_to_new[v]] = degree[v]``."""
    out = np.empty(degree.shape[0], dtype=np.int64)
    scatter_into(out, orig_to_new, degree)
    return out


def route_rows(csr: DiskCSR, parts: np.ndarray, orig_to_new: np.ndarray, bounds: np.ndarray, plan: MemoryPlan,
               scratch: ScratchSpace, *, progress: bool) -> tuple[PartBuckets, np.ndarray]:
    """The CSR pass of the module docstring; returns the buckets and ``in_new`` int64 (N,), the in-degrees by new
    id."""
    k = bounds.shape[0] - 1
    buckets = PartBuckets(bounds=bounds, id_dtype=orig_to_new.dtype,
                          folders=[scratch.folder(f"part-{p}") for p in range(k)])
    in_new = np.empty(csr.num_nodes, dtype=np.int64)
    in_edges = np.zeros(k, dtype=np.int64)
    raise_open_files(2 * k)
    rows_out = [NpyWriter(buckets.rows(p), np.int64, (int(bounds[p + 1] - bounds[p]),)) for p in range(k)]
    edges_out = [NpyWriter(buckets.edges(p), orig_to_new.dtype, (None,)) for p in range(k)]
    try:
        with progress_bar(total=csr.num_nodes, desc="route", unit="node", enabled=progress) as bar:
            for first, indptr, indices in csr.blocks(plan.route_entries, plan.route_rows):
                in_edges += _route_block(first, indptr, indices, parts, orig_to_new, in_new, rows_out, edges_out, k)
                bar.update(indptr.shape[0] - 1)
                del indptr, indices  # before the next block is read
        for w in rows_out + edges_out:
            w.close()
    except BaseException:
        for w in rows_out + edges_out:
            w.abort()
        raise
    buckets.in_edges = in_edges
    scratch.note()
    return buckets, in_new


def _route_block(first, indptr, indices, parts, orig_to_new, in_new, rows_out, edges_out, k) -> np.ndarray:
    """One CSR block of `route_rows` (a function, so that its temporaries are gone before the next block);
    returns its entries per part."""
    r = indptr.shape[0] - 1
    deg = np.diff(indptr)  # (r,)
    row_part = parts[first:first + r]  # (r,)
    scatter_into(in_new, orig_to_new[first:first + r], deg)
    order, offsets = group_by(row_part, k)  # rows of each part, in original order
    ids = order + first  # (r,) original ids grouped by part
    del order
    for p in np.flatnonzero(np.diff(offsets)):
        rows_out[p].write(ids[offsets[p]:offsets[p + 1]])
    del ids
    entry_part = np.repeat(row_part, deg)  # (e,)
    src_new = orig_to_new[indices]  # (e,)
    order, offsets = group_by(entry_part, k)  # stable: rows stay in order, entries in row order
    del entry_part
    grouped = src_new[order]
    del order, src_new
    for p in np.flatnonzero(np.diff(offsets)):
        edges_out[p].write(grouped[offsets[p]:offsets[p + 1]])
    return np.diff(offsets)


def _route_chunk(lo, chunk, parts, outs, k, counts, is_train) -> None:
    """One chunk of a node array for `route_node_data` (its temporaries gone on return)."""
    order, offsets = group_by(parts[lo:lo + chunk.shape[0]], k)
    grouped = chunk[order]
    del order
    for p in np.flatnonzero(np.diff(offsets)):
        piece = grouped[offsets[p]:offsets[p + 1]]
        outs[p].write(piece)
        if is_train:
            counts[p] += int(np.count_nonzero(piece))


def route_node_data(nodes: NodeArrays, parts: np.ndarray, buckets: PartBuckets, plan: MemoryPlan, *,
                    progress: bool) -> None:
    """Each node array, read in row ranges, appended to its parts' files (rows in local order)."""
    k = buckets.num_parts
    sizes = np.diff(buckets.bounds)
    buckets.node_data = nodes.names
    for name in nodes.names:
        shape = nodes.row_shape(name)
        outs = [NpyWriter(buckets.node(p, name), NODE_FILES[name], (int(sizes[p]),) + shape) for p in range(k)]
        counts = np.zeros(k, dtype=np.int64)
        try:
            with progress_bar(total=nodes.num_nodes, desc=name, unit="node", enabled=progress) as bar:
                for lo, chunk in nodes.iter_rows(name, plan.node_rows(nodes.row_bytes(name))):
                    _route_chunk(lo, chunk, parts, outs, k, counts, name == "train_mask")
                    bar.update(chunk.shape[0])
                    del chunk  # before the next chunk is read
            for w in outs:
                w.close()
        except BaseException:
            for w in outs:
                w.abort()
            raise
        if name == "train_mask":
            buckets.train = counts


def write_new_to_orig(buckets: PartBuckets, path: Path, num_nodes: int, max_rows: int) -> Path:
    """new_to_orig (N,) int64: the parts' rows files one after the other."""
    with NpyWriter(path, np.int64, (num_nodes,)) as out:
        for p in range(buckets.num_parts):
            with MappedNpy(buckets.rows(p)) as rows:
                for lo in range(0, len(rows), max_rows):
                    out.write(rows.rows(lo, min(lo + max_rows, len(rows))))
    return path
