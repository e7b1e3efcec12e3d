"""The METIS / DIMACS10 ``.graph`` format (the METIS manual, section 4.1.1), in memory and streamed.

::

    % a comment                         <- '%' lines, anywhere
    4 5                                 <- header: n m [fmt [ncon]]   (m = undirected edges)
    2 3                                 <- line of vertex 1: its neighbours, 1-based
    1 3 4                               <- vertex 2
    1 2 4                               <- vertex 3
                                        <- vertex 4 ... a blank line is a vertex without neighbours
    2 3                                 (so blank lines count, unlike in every other format here)

    fmt = three digits "s w e" (leading zeros may be dropped): s = 1 each vertex line starts with its size,
    w = 1 then ncon vertex weights (ncon defaults to 1), e = 1 each neighbour is followed by an edge weight.
    Sizes and weights are read past; the graph keeps the adjacency only.

Every edge is listed twice (once in each endpoint's line), so the file holds 2m neighbour entries; a count that
differs is an error. The graph is symmetrised (a one-sided entry gets its reverse, repeats merge) exactly as
``read_pace`` does, so a partition of it is the same whichever of the two the user converted it to. Lines are
scanned by ``textscan`` blocks: vectorised, with the file's line numbers in every error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from haloflow.data.edge_source import EdgeSource, read_edges
from haloflow.data.graph import CSRGraph, max_plausible_nodes
from haloflow.data.textscan import BLOCK_BYTES, TokenBlock, first_problem, iter_token_blocks
from haloflow.errors import InputFormatError

__all__ = ["MetisHeader", "MetisEdges", "read_metis"]

log = logging.getLogger(__name__)

_PERCENT = ord("%")


@dataclass(frozen=True)
class MetisHeader:
    """``n m [fmt [ncon]]``: vertex and edge counts, and how many tokens to read past on each line."""

    num_nodes: int
    num_edges: int
    vertex_sizes: bool
    vertex_weights: int  # ncon, 0 when the file has no vertex weights
    edge_weights: bool
    line: int

    @property
    def skip(self) -> int:
        """Tokens before the first neighbour on a vertex line."""
        return int(self.vertex_sizes) + self.vertex_weights


def _parse_header(tb: TokenBlock, j: int) -> MetisHeader:
    lineno = int(tb.line[tb.line_start[j]])
    first, count = int(tb.line_start[j]), int(tb.line_count[j])
    expected = f"expected a header 'n m [fmt [ncon]]' of integers, found {tb.line_text(lineno)!r}"
    if not 2 <= count <= 4:
        raise tb.error(lineno, f"bad header: {expected}")
    values, problem = tb.parse_ints(np.arange(first, first + count), "count")
    if problem is not None:
        raise tb.error(lineno, f"bad header: {expected}")
    n, m = int(values[0]), int(values[1])
    fmt = tb.token_text(first + 2) if count >= 3 else "0"
    if len(fmt) > 3 or set(fmt) - {"0", "1"}:
        raise tb.error(lineno, f"bad header: fmt {fmt!r} must be up to three 0/1 digits (vertex sizes, vertex "
                               f"weights, edge weights), found {tb.line_text(lineno)!r}")
    fmt = fmt.rjust(3, "0")
    ncon = int(values[3]) if count == 4 else 1
    if count == 4 and fmt[1] != "1":
        raise tb.error(lineno, f"bad header: ncon = {ncon} given, but fmt {fmt!r} has no vertex weights "
                               f"(expected a middle digit 1)")
    if n > max_plausible_nodes(m):
        raise tb.error(lineno, f"bad header: n = {n:,} vertices for m = {m:,} edges, but m edges touch at most "
                               f"{2 * m:,} vertices; expected n <= 2m + 1,024 = {max_plausible_nodes(m):,} "
                               f"(is the header corrupt?)")
    return MetisHeader(n, m, fmt[0] == "1", ncon if fmt[1] == "1" else 0, fmt[2] == "1", lineno)


class MetisEdges(EdgeSource):
    """A ``.graph`` file streamed block by block: chunk i holds the neighbour entries of a run of vertex lines."""

    symmetric = True
    # A block of B bytes holds at most B / 2 entries ("1 ") and needs about 10 bytes of temporaries per byte.
    _BYTES_PER_ENTRY = 2
    reader_bytes_per_edge = 10 * _BYTES_PER_ENTRY + 16

    def __init__(self, path: str | os.PathLike, *, progress: bool = True):
        self.path = Path(path)
        self.name = self.path.name.split(".")[0] or self.path.name
        self.progress = progress
        self.header = self._read_header()
        self._vertices_seen: int | None = None

    @property
    def num_nodes(self) -> int:
        return self.header.num_nodes

    @property
    def num_edges(self) -> int:
        return 2 * self.header.num_edges

    def _read_header(self) -> MetisHeader:
        for tb in iter_token_blocks(self.path, block_bytes=1 << 16, progress=False):
            body = np.flatnonzero(tb.lead_byte() != _PERCENT)
            if body.size:
                return _parse_header(tb, int(body[0]))
        raise InputFormatError(self.path, "missing header: expected a line 'n m [fmt [ncon]]', found none")

    def chunks(self, max_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        block_bytes = max(max_edges * self._BYTES_PER_ENTRY, 64)
        vertex = 0  # 0-based id of the next vertex line
        header_seen = False
        for tb in iter_token_blocks(self.path, block_bytes=min(block_bytes, 1 << 40), progress=self.progress):
            src, dst, vertex, header_seen = self._block_edges(tb, vertex, header_seen)
            yield src, dst
            del tb, src, dst  # not kept alive while the next block is parsed
        self._vertices_seen = min(vertex, self.header.num_nodes)  # blank lines after the last vertex are not one

    def _block_edges(self, tb: TokenBlock, vertex: int, header_seen: bool):
        """Neighbour entries ``(src, dst)`` of the vertex lines in ``tb``, the next vertex id, header seen."""
        h = self.header
        ends_with_newline = tb.buf.shape[0] > 0 and tb.buf[-1] == 10
        num_lines = tb.newlines.shape[0] + (0 if ends_with_newline else 1)
        rel = tb.line - tb.first_line  # (T,) line of each token, within the block
        counts = np.bincount(rel, minlength=num_lines)[:num_lines]  # (Lb,) tokens per line
        first_token = np.full(num_lines, -1, dtype=np.int64)
        first_token[rel[tb.line_start]] = tb.line_start
        comment = np.zeros(num_lines, dtype=bool)
        comment[rel[tb.line_start]] = tb.lead_byte() == _PERCENT
        vertex_line = ~comment
        if not header_seen:  # the header is the first non-comment line with tokens; lines before it are not vertices
            candidates = np.flatnonzero(~comment & (counts > 0))
            if candidates.size == 0:
                return np.zeros(0, np.int64), np.zeros(0, np.int64), vertex, False
            vertex_line[: candidates[0] + 1] = False
            header_seen = True
        vid = vertex + np.cumsum(vertex_line) - 1  # (Lb,) 0-based vertex of each vertex line
        next_vertex = vertex + int(np.count_nonzero(vertex_line))
        problems = []
        beyond = vertex_line & (vid >= h.num_nodes)
        if np.any(beyond & (counts > 0)):
            j = int(np.argmax(beyond & (counts > 0)))
            problems.append((tb.first_line + j, f"more than n = {h.num_nodes:,} vertex lines (n from the header on "
                                                f"line {h.line}): expected one line per vertex, found "
                                                f"{tb.line_text(tb.first_line + j)!r}"))
        vertex_line &= ~beyond  # blank lines after the last vertex are read past
        entries = counts - h.skip
        short = vertex_line & (entries < 0)
        odd = vertex_line & h.edge_weights & (entries % 2 == 1)
        for mask, what in ((short, f"{h.skip} size/weight value{'s' if h.skip > 1 else ''} first"),
                           (odd, "each neighbour followed by its edge weight")):
            if mask.any():
                j = int(np.argmax(mask))
                lineno = tb.first_line + j
                problems.append((lineno, f"vertex {int(vid[j]) + 1}: expected {what} (fmt from the header on line "
                                         f"{h.line}), found {tb.line_text(lineno)!r}"))
                vertex_line &= ~mask
        token_line = vertex_line[rel]  # (T,) token on a vertex line
        pos = np.arange(rel.shape[0], dtype=np.int64) - first_token[rel] - h.skip  # (T,) place after the skipped
        is_nbr = token_line & (pos >= 0)
        if h.edge_weights:
            is_nbr &= pos % 2 == 0
        tokens = np.flatnonzero(is_nbr)
        values, parse_problem = tb.parse_ints(tokens, "neighbour id")
        problems.append(parse_problem)
        if parse_problem is None and values.size:
            out = (values < 1) | (values > h.num_nodes)
            if out.any():
                i = int(tokens[np.argmax(out)])
                lineno = int(tb.line[i])
                problems.append((lineno, f"neighbour id {tb.token_text(i)} is out of range: ids are 1-based, expected "
                                         f"1..{h.num_nodes:,} (n from the header), found {tb.line_text(lineno)!r}"))
        problem = first_problem(*problems)
        if problem is not None:
            raise tb.error(*problem)
        dst = vid[rel[tokens]].astype(np.int64)  # (e,) the vertex whose line lists the neighbour
        return values - 1, dst, next_vertex, header_seen

    def finish(self, num_edges: int, max_id: int) -> int:
        h = self.header
        seen = self._vertices_seen
        if seen is not None and seen != h.num_nodes:
            raise InputFormatError(self.path, f"the header says n = {h.num_nodes:,} vertices but the file has "
                                              f"{seen:,} vertex lines", line=h.line)
        if num_edges != 2 * h.num_edges:
            raise InputFormatError(self.path, f"the header says m = {h.num_edges:,} edges, so 2m = {2 * h.num_edges:,} "
                                              f"neighbour entries (each edge in both endpoints' lines), but the "
                                              f"file lists {num_edges:,}", line=h.line)
        if h.num_nodes == 0:
            raise InputFormatError(self.path, "empty graph: the header says n = 0 vertices", line=h.line)
        if h.skip or h.edge_weights:
            log.info("%s: vertex sizes/weights and edge weights are read past; the graph keeps the adjacency only",
                     self.path)
        return h.num_nodes


def read_metis(path: str | os.PathLike, *, block_bytes: int = BLOCK_BYTES) -> CSRGraph:
    """Read a METIS / DIMACS10 ``.graph`` file as a symmetric graph (0-based ids; module docstring).

    Raises:
        InputFormatError: a missing or bad header, a malformed line, a neighbour id outside 1..n, more or fewer
            vertex lines than n, or a neighbour count other than 2m.
    """
    return read_edges(MetisEdges(path, progress=True), max_edges=block_bytes // MetisEdges._BYTES_PER_ENTRY)
