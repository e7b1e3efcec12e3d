"""Opening any graph input as a stream of edge chunks: `SnapEdges`, and `open_edge_source` / `open_streamed`, the
dispatchers the out-of-core pipeline and its CLI call (the `EdgeSource` interface is in ``edge_source.py``).

::

    open_streamed("GRAPH/")      -> (NpyEdges | ParquetEdges, NodeArrays)      an arrays folder: edges + node data
    open_streamed("g.txt.gz")    -> (SnapEdges, None)                          text, read in blocks
    open_edge_source("g.gr.xz")  -> PaceEdges                                  PACE / DIMACS, read in blocks
    open_edge_source("g.graph")  -> MetisEdges                                 (likewise .npy, .parquet)
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from haloflow.data.edge_source import EdgeSource, plausible_node_count
from haloflow.data.graph import max_plausible_nodes
from haloflow.errors import ConfigError, InputFormatError

__all__ = ["SnapEdges", "PaceEdges", "open_edge_source", "open_streamed", "STREAMED_FORMATS"]

log = logging.getLogger(__name__)

# Formats the out-of-core pipeline can read chunk by chunk (the "arrays" folder adds node data to npy / parquet).
STREAMED_FORMATS = ("snap", "pace", "npy", "parquet", "metis", "arrays")


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


class PaceEdges(EdgeSource):
    """A PACE / DIMACS ``.gr`` file read block by block (the format and the checks of ``readers.read_pace``): an
    undirected graph, each edge listed once (or as both arcs), ``n`` and ``m`` from its ``p`` header."""

    symmetric = True
    # A block of B bytes holds at most B / 4 edges ("1 2\n") and needs about 10 bytes of temporaries per byte.
    _BYTES_PER_EDGE_LINE = 4
    reader_bytes_per_edge = 10 * _BYTES_PER_EDGE_LINE

    def __init__(self, path: str | os.PathLike, *, progress: bool = True):
        from haloflow.data.readers import PaceBlocks

        self.path = Path(path)
        self.name = self.path.name.split(".")[0] or self.path.name
        self.progress = progress
        head = PaceBlocks(self.path, block_bytes=1 << 16, progress=False)
        for _ in head:  # the header comes with the first block of edges
            break
        if head.header is None:
            head.check_end(0)  # raises: no header
        self.header = head.header
        self._blocks = PaceBlocks(self.path, progress=progress)

    @property
    def num_nodes(self) -> int:
        return self.header.num_nodes

    @property
    def num_edges(self) -> int:
        return self.header.num_edges

    def chunks(self, max_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        self._blocks.block_bytes = max(max_edges * self._BYTES_PER_EDGE_LINE, 64)
        for u, v in self._blocks:
            yield u - 1, v - 1
            del u, v  # not kept alive while the next block is parsed

    def finish(self, num_edges: int, max_id: int) -> int:
        return self._blocks.check_end(num_edges).num_nodes


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
               "metis": ("progress",), "pace": ("progress",)}[format]
    unknown = sorted(k for k, v in options.items() if v is not None and k not in allowed)
    if unknown:
        raise ConfigError(f"format {format!r} takes no option {unknown[0]!r}: expected {' or '.join(allowed)}")
    options = {k: v for k, v in options.items() if v is not None}
    if format == "snap":
        return SnapEdges(path, **options)
    if format == "npy":
        from haloflow.data.binary_edges import NpyEdges

        return NpyEdges(path, **options)
    if format == "pace":
        return PaceEdges(path, **options)
    if format == "parquet":
        from haloflow.data.binary_edges import ParquetEdges

        return ParquetEdges(path, **options)
    from haloflow.data.metis_graph import MetisEdges

    return MetisEdges(path, **options)


def open_streamed(path: str | os.PathLike, format: str = "auto", **options):
    """``(EdgeSource, NodeArrays | None)`` for ``path``: an ``arrays`` folder's node data comes with its edges;
    every other format has none. Options as `open_edge_source`.

    The pipeline reads its input once per pass (the node count, then the buckets), so a pipe or FIFO (``-``,
    ``/dev/stdin``), which can be read once, is refused up front."""
    from haloflow.data.readers import detect_format

    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ConfigError(f"{path} is a pipe or device, and --memory-budget reads its input once per pass: expected a "
                          "file or folder (save the stream to a file first, or drop --memory-budget)")
    if (detect_format(Path(path)) if format == "auto" else format) == "arrays":
        from haloflow.data.graph_folder import GraphFolder

        unknown = sorted(k for k, v in options.items() if v is not None and k not in ("num_nodes", "progress"))
        if unknown:
            raise ConfigError(f"format 'arrays' takes no option {unknown[0]!r}: expected num_nodes")
        folder = GraphFolder(path, num_nodes=options.get("num_nodes"))
        return folder.edges, folder.nodes
    return open_edge_source(path, format, **options), None
