"""`EdgeSource`: one interface for reading a graph's edges chunk by chunk, whatever the file format.

::

    source = open_edge_source("graph.npy")          # or .parquet / a folder of them, .graph, a SNAP edge list
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
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from haloflow.data.graph import CSRGraph, check_node_count, max_plausible_nodes
from haloflow.errors import ConfigError, InputFormatError

__all__ = ["EdgeSource", "SnapEdges", "read_edges", "open_edge_source", "open_streamed", "STREAMED_FORMATS",
           "check_ids"]

log = logging.getLogger(__name__)

# Formats the out-of-core pipeline can read chunk by chunk (the "arrays" folder adds node data to npy / parquet).
STREAMED_FORMATS = ("snap", "npy", "parquet", "metis", "arrays")


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


class SnapEdges(EdgeSource):
    """A SNAP edge list read block by block (the format and the checks of ``readers.read_snap``)."""

    # A block of B bytes holds at most B / 4 edges ("0 1\\n") and needs about 10 bytes of temporaries per byte.
    _BYTES_PER_EDGE_LINE = 4
    reader_bytes_per_edge = 10 * _BYTES_PER_EDGE_LINE

    def __init__(self, path: str | os.PathLike, *, num_nodes: int | None = None, one_based: bool = False,
                 progress: bool = True):
        if num_nodes is not None and num_nodes < 0:
            raise ConfigError(f"num_nodes must be >= 0, got {num_nodes}")
        self.path = Path(path)
        self.name = self.path.name.split(".")[0] or self.path.name
        self._num_nodes, self.one_based, self.progress = num_nodes, one_based, progress
        self._min_id: int | None = None

    @property
    def num_nodes(self) -> int | None:
        return self._num_nodes

    def _scan_options(self) -> dict:
        shift = int(self.one_based)
        kw = dict(comment="#%", columns="src dst", what="node id", lower=shift, header=True, max_fields=4)
        if self.one_based:
            kw["range_hint"] = "the file is read as 1-based (one_based=True, --one-based)"
        return kw

    def chunks(self, max_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        from haloflow.data.textscan import IntRowScan

        shift = int(self.one_based)
        upper = None if self._num_nodes is None else self._num_nodes + shift
        scan = IntRowScan(self.path, 2, upper=upper, block_bytes=max(max_edges * self._BYTES_PER_EDGE_LINE, 64),
                          progress=self.progress, **self._scan_options())
        low = None
        for values in scan:  # (e, 2)
            if values.size:
                m = int(values.min())
                low = m if low is None else min(low, m)
            src, dst = values[:, 0], values[:, 1]
            if shift:
                src, dst = src - shift, dst - shift
            yield np.ascontiguousarray(src), np.ascontiguousarray(dst)
            del values, src, dst  # not kept alive while the next block is parsed
        self._min_id = low
        self._scan = scan

    def finish(self, num_edges: int, max_id: int) -> int:
        from haloflow.data.readers import _raise_implausible_id

        if num_edges == 0 and not self._num_nodes:
            raise InputFormatError(self.path, "empty graph: no edge lines and no num_nodes (expected 'src dst' lines)")
        shift = int(self.one_based)
        bound = max_plausible_nodes(num_edges)
        if self._num_nodes is None and max_id >= bound:
            _raise_implausible_id(self.path, self._scan_options(), bound + shift, num_edges)
        n = plausible_node_count(self.path, num_edges, max_id, self._num_nodes)
        scan = getattr(self, "_scan", None)
        if scan is not None and scan.header is not None:
            log.info("%s: skipped the header line %d (%s)", self.path, scan.header_line, " ".join(scan.header))
        if scan is not None and scan.result(np.zeros((0, 2), np.int64)).ignored:
            ignored = scan.result(np.zeros((0, 2), np.int64)).ignored
            log.warning("%s: ignored %s of every edge line (%s): the graph keeps src -> dst only", self.path,
                        "a field" if len(ignored) == 1 else f"{len(ignored)} fields", ", ".join(ignored))
        if not self.one_based and self._min_id is not None and self._min_id > 0:
            low = self._min_id
            isolated = "node 0 is" if low == 1 else f"nodes 0..{low - 1} are"
            log.warning("%s: node id 0 never appears (the smallest id is %d): if the file numbers nodes from 1, pass "
                        "one_based=True (--one-based); read as 0-based, %s isolated", self.path, low, isolated)
        return n


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


def open_edge_source(path: str | os.PathLike, format: str = "auto", **options) -> EdgeSource:
    """The `EdgeSource` for ``path`` in ``format`` (``auto``: by suffix and content, as ``read_dataset``).

    Args:
        options: ``num_nodes`` (every format but metis), ``one_based`` (snap), ``progress`` (text formats).

    Raises:
        ConfigError: a format that cannot be read chunk by chunk (the message lists those that can).
    """
    from haloflow.data.readers import detect_format

    path = Path(path)
    if format == "auto":
        format = detect_format(path)
    if format == "arrays":
        from haloflow.data.graph_folder import GraphFolder

        return GraphFolder(path, num_nodes=options.get("num_nodes")).edges
    if format not in STREAMED_FORMATS:
        raise ConfigError(f"format {format!r} is read whole, not in chunks: expected one of "
                          f"{', '.join(STREAMED_FORMATS)} (convert the input, or partition it in memory)")
    allowed = {"snap": ("num_nodes", "one_based", "progress"), "npy": ("num_nodes",), "parquet": ("num_nodes",),
               "metis": ("progress",)}[format]
    unknown = sorted(k for k, v in options.items() if v is not None and k not in allowed)
    if unknown:
        raise ConfigError(f"format {format!r} takes no option {unknown[0]!r}: expected {' or '.join(allowed)}")
    options = {k: v for k, v in options.items() if v is not None}
    if format == "snap":
        return SnapEdges(path, **options)
    if format == "npy":
        from haloflow.data.binary_edges import NpyEdges

        return NpyEdges(path, **options)
    if format == "parquet":
        from haloflow.data.binary_edges import ParquetEdges

        return ParquetEdges(path, **options)
    from haloflow.data.metis_graph import MetisEdges

    return MetisEdges(path, **options)


def open_streamed(path: str | os.PathLike, format: str = "auto", **options):
    """``(EdgeSource, NodeArrays | None)`` for ``path``: an ``arrays`` folder's node data comes with its edges;
    every other format has none. Options as `open_edge_source`."""
    from haloflow.data.readers import detect_format

    if (detect_format(Path(path)) if format == "auto" else format) == "arrays":
        from haloflow.data.graph_folder import GraphFolder

        unknown = sorted(k for k, v in options.items() if v is not None and k not in ("num_nodes", "progress"))
        if unknown:
            raise ConfigError(f"format 'arrays' takes no option {unknown[0]!r}: expected num_nodes")
        folder = GraphFolder(path, num_nodes=options.get("num_nodes"))
        return folder.edges, folder.nodes
    return open_edge_source(path, format, **options), None
