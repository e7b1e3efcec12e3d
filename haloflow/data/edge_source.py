"""`EdgeSource`: one interface for reading a graph's edges chunk by chunk, whatever the file format.

::

    source = open_edge_source("graph.npy")          # (data/streamed.py) or .parquet / a folder, .graph, SNAP text
    for src, dst in source.chunks(max_edges=1 << 22):    # int64 (e,), 0-based ids, e <= source.chunk_edges(...)
        ...                                              # every pass yields the same edges in the same order
    n = source.finish(num_edges, max_id)             # after the first whole pass: the checks that need the whole
                                                     # file (edge counts, the plausible-id bound) -> node count

    format     file                               read by                        stored as
    snap       text edge list (.txt, .gz, .xz)    textscan blocks (line numbers)  directed, as given
    npy        (E, 2) or (2, E) integer .npy      a memory map, pages released    directed, as given
    parquet    src, dst columns; file or folder   pyarrow, one row group at a time directed, as given
    metis      METIS / DIMACS10 .graph            textscan blocks                 undirected (symmetric = True)

A source whose format stores an undirected graph says so (``symmetric``): the pipeline then adds every reverse
edge and merges repeats whatever ``--symmetrize`` says, exactly as ``read_pace`` and ``read_metis`` do in memory.
``read_edges`` builds the in-memory ``CSRGraph`` from any source, so the in-memory readers and the out-of-core
pipeline read each format through the same code.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from haloflow.data.graph import CSRGraph, check_node_count, max_plausible_nodes
from haloflow.errors import InputFormatError

__all__ = ["EdgeSource", "read_edges", "check_ids", "plausible_node_count"]

log = logging.getLogger(__name__)

class EdgeSource(ABC):
    """A re-readable stream of edge chunks (see the module docstring).

    Attributes:
        path: the file or folder.
        name: the data set's name, as ``read_dataset`` gives it.
        symmetric: the format stores an undirected graph (reverse edges are added and repeats merged).
    """

    path: Path
    name: str
    symmetric: bool = False

    @property
    def num_nodes(self) -> int | None:
        """The node count when the input states it before any edge is read (a header, node files, num_nodes)."""
        return None

    @property
    def num_edges(self) -> int | None:
        """The edge count when the input states it without a pass (an array's shape, Parquet metadata)."""
        return None

    @abstractmethod
    def chunks(self, max_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(src, dst)`` int64 (e,) 0-based, at most `chunk_edges` ``(max_edges)`` per chunk, in file order."""

    def chunk_edges(self, max_edges: int) -> int:
        """The most edges one chunk of ``chunks(max_edges)`` holds (a Parquet row group may hold more)."""
        return max_edges

    # Bytes of the reader's own temporaries per edge of a chunk, on top of the two int64 arrays it yields.
    reader_bytes_per_edge: int = 16

    @abstractmethod
    def finish(self, num_edges: int, max_id: int) -> int:
        """Check what needs the whole input (after one pass of ``num_edges`` edges, largest id ``max_id``, -1 for
        none) and return the node count. Raises ``InputFormatError`` naming the file."""


def check_ids(path, src: np.ndarray, dst: np.ndarray, first: int, num_nodes: int | None, what: str = "edge") -> None:
    """Raise ``InputFormatError`` for a negative id, or one >= ``num_nodes`` when it is known, naming the edge."""
    if src.size == 0:
        return
    lo = min(int(src.min()), int(dst.min()))
    hi = max(int(src.max()), int(dst.max()))
    if lo >= 0 and (num_nodes is None or hi < num_nodes):
        return
    bad = (src < 0) | (dst < 0) if lo < 0 else (src >= num_nodes) | (dst >= num_nodes)
    i = int(np.argmax(bad))
    found = f"{what} {first + i:,} is ({int(src[i])}, {int(dst[i])})"
    if lo < 0:
        raise InputFormatError(path, f"{found}: expected node ids >= 0")
    raise InputFormatError(path, f"{found}: expected node ids in [0, {num_nodes:,}) (the graph's {num_nodes:,} nodes)")


def plausible_node_count(path, num_edges: int, max_id: int, num_nodes: int | None, hint: str = "") -> int:
    """``max_id + 1``, unless ``num_nodes`` is given; an id >= 2 E + 1024 without ``num_nodes`` is refused (see
    ``graph.max_plausible_nodes``: such a file is mostly isolated nodes, usually a stray or external id)."""
    if num_nodes is not None:
        if num_nodes > max_plausible_nodes(num_edges):
            check_node_count(num_nodes, path)
        return int(num_nodes)
    bound = max_plausible_nodes(num_edges)
    if max_id >= bound:
        raise InputFormatError(path, f"a node id is {max_id:,}, but without num_nodes ids must be < 2 x {num_edges:,} "
                                     f"edges + 1,024 = {bound:,}, since a larger id would make a graph of mostly "
                                     f"isolated nodes; pass num_nodes=N (--num-nodes N) if the graph really has that "
                                     f"many nodes, or renumber the ids to 0..n-1{hint}")
    return max_id + 1


def read_edges(source: EdgeSource, *, max_edges: int = 1 << 22) -> CSRGraph:
    """The whole graph of ``source`` in memory: directed as given, or symmetric (repeats merged) for a format
    that stores an undirected graph. Self-loops are kept."""
    srcs, dsts, max_id, count = [], [], -1, 0
    for src, dst in source.chunks(max_edges):
        srcs.append(src)
        dsts.append(dst)
        count += src.shape[0]
        if src.size:
            max_id = max(max_id, int(src.max()), int(dst.max()))
    n = source.finish(count, max_id)
    src = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
    dst = np.concatenate(dsts) if dsts else np.zeros(0, np.int64)
    del srcs, dsts
    graph = CSRGraph.from_edges(src, dst, n, symmetrize=source.symmetric)
    log.info("read %s: %s", source.path, graph)
    return graph
