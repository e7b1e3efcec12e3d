"""Matrix Market ``.mtx`` files (what SuiteSparse ships) read as a graph's adjacency, with ``scipy.io.mmread``.

::

    %%MatrixMarket matrix coordinate pattern symmetric    <- banner: matrix, format, field, symmetry
    % a comment                                           <- '%' lines, before the size line
    5 5 4                                                 <- size line: rows cols entries (rows = cols = n)
    2 1                                                   <- an entry: row col [value], 1-based; the value
    3 1 1.0                                                  (real, integer or complex) is ignored

Entry (i, j) is the edge i -> j (ids i - 1, j - 1), whatever its value: the stored entries, an explicit 0 among
them, are the graph. ``general``: directed, the entries as given. ``symmetric``, ``skew-symmetric``,
``hermitian``: the file holds one triangle and the graph is undirected, every off-diagonal entry stored both
ways (a diagonal entry, a self-loop, once). The dense ``array`` format and non-square matrices are refused.

The header is read here (first), so that a bad banner or size line is a one-line error naming the file and line,
and a size line claiming more nodes or entries than memory holds is refused before anything is allocated.
"""

from __future__ import annotations

import logging
import os
import re
from contextlib import nullcontext
from dataclasses import dataclass

from haloflow.data.graph import CSRGraph, check_node_count, max_plausible_nodes
from haloflow.data.textscan import PipeInput, codec_errors, open_decompressed, read_head
from haloflow.errors import InputFormatError

__all__ = ["MatrixMarketHeader", "read_matrix_market", "read_matrix_market_header", "BANNER"]

log = logging.getLogger(__name__)

BANNER = b"%%matrixmarket"  # the first token of every Matrix Market file, in any case
FIELDS = ("real", "integer", "complex", "pattern")
SYMMETRIES = ("general", "symmetric", "skew-symmetric", "hermitian")
_HEAD_BYTES = 64 << 10  # the banner, the comments and the size line must lie within this
_BYTES_PER_ENTRY = 24  # what mmread holds per entry at its peak: row and column (int64 at worst), a float64 value
_SCIPY_LINE = re.compile(r"^Line (\d+): (.*)$", re.S)  # how fast_matrix_market names the line of a problem


@dataclass(frozen=True)
class MatrixMarketHeader:
    """The banner and size line of a coordinate Matrix Market file (``line``: the size line's number)."""

    field: str
    symmetry: str
    num_nodes: int
    num_entries: int
    line: int

    @property
    def symmetric(self) -> bool:
        return self.symmetry != "general"


def read_matrix_market_header(path: str | os.PathLike | PipeInput) -> MatrixMarketHeader:
    """The header of ``path`` (plain, gzip, xz or bz2; or a pipe), checked: ``coordinate``, square, known field
    and symmetry.

    Raises:
        InputFormatError: naming the file and line of a bad banner or size line.
    """
    head = read_head(path, _HEAD_BYTES)
    lines = head.split(b"\n")
    if len(head) == _HEAD_BYTES:
        lines = lines[:-1]  # the last line may be cut off
    banner = lines[0].decode("utf-8", "replace").strip() if lines else ""
    words = banner.lower().split()
    expected = "expected '%%MatrixMarket matrix coordinate <field> <symmetry>'"
    if len(words) != 5 or words[0] != BANNER.decode() or words[1] != "matrix":
        raise InputFormatError(path, f"not a Matrix Market banner: {expected}, found {banner[:80]!r}", line=1)
    fmt, field, symmetry = words[2:]
    if fmt == "array":
        raise InputFormatError(path, "a dense 'array' matrix: expected the sparse 'coordinate' format, whose "
                                     "entries are a graph's edges", line=1)
    if fmt != "coordinate" or field not in FIELDS or symmetry not in SYMMETRIES:
        raise InputFormatError(path, f"unknown Matrix Market banner {banner[:80]!r}: {expected} with field one of "
                                     f"{', '.join(FIELDS)} and symmetry one of {', '.join(SYMMETRIES)}", line=1)
    for lineno, raw in enumerate(lines[1:], start=2):
        text = raw.decode("utf-8", "replace").strip()
        if not text or text.startswith("%"):
            continue
        sizes = text.split()
        if len(sizes) != 3 or not all(s.isascii() and s.isdigit() for s in sizes):
            raise InputFormatError(path, f"bad size line: expected 'rows cols entries' (three integers), found "
                                         f"{text[:80]!r}", line=lineno)
        rows, cols, entries = (int(s) for s in sizes)
        if rows != cols:
            raise InputFormatError(path, f"a {rows:,} x {cols:,} matrix: expected a square one (rows = cols = the "
                                         f"graph's nodes); a rectangular matrix is no adjacency matrix", line=lineno)
        return MatrixMarketHeader(field, symmetry, rows, entries, lineno)
    raise InputFormatError(path, f"no size line 'rows cols entries' after the banner in the first "
                                 f"{_HEAD_BYTES >> 10} KiB: expected one after the '%' comment lines")


def read_matrix_market(path: str | os.PathLike | PipeInput) -> CSRGraph:
    """Read a coordinate Matrix Market file (as ``scipy.io.mmwrite`` writes it) as a graph (see the module
    docstring): directed for ``general``, both directions of every entry for the symmetric kinds.

    Raises:
        InputFormatError: the file and line of a bad header or entry (as ``scipy.io.mmread`` found it), an empty
            0 x 0 matrix, or a size line whose entries cannot fit in the memory this machine has free.
        ConfigError: a node count whose per-node arrays cannot fit in memory (``check_node_count``).
    """
    import scipy.io

    from haloflow.utils.memory import available_bytes, format_bytes

    header = read_matrix_market_header(path)
    n, entries = header.num_nodes, header.num_entries
    if n == 0:
        raise InputFormatError(path, "empty graph: the size line says a 0 x 0 matrix", line=header.line)
    need, have = _BYTES_PER_ENTRY * entries * (2 if header.symmetric else 1), available_bytes()
    if have is not None and need > have:  # before mmread allocates for all of them
        raise InputFormatError(path, f"the size line says {entries:,} entries, which need {format_bytes(need)} to "
                                     f"read, but this machine has {format_bytes(have)} free (is it corrupt?)",
                               line=header.line)
    check_node_count(n, path, "the size line's n")
    if n > max_plausible_nodes(entries):
        log.warning("%s: %s nodes for %s entries: at least %s nodes will have no edges", path, f"{n:,}",
                    f"{entries:,}", f"{n - 2 * entries:,}")
    opened = nullcontext(path) if isinstance(path, PipeInput) else open_decompressed(path)
    with codec_errors(path), opened as f:
        try:
            matrix = scipy.io.mmread(f)  # coo_matrix, 0-based; the symmetric kinds mirrored
        except ValueError as err:
            raise _entry_error(path, err, n) from None
    graph = CSRGraph.from_edges(matrix.row, matrix.col, n)
    log.info("read %s (%s %s): %s", path, header.field, header.symmetry, graph)
    return graph


def _entry_error(path, err: ValueError, n: int) -> InputFormatError:
    """``scipy.io.mmread``'s complaint (``Line 4: Row index out of bounds``) as one line naming file and line."""
    text = str(err).strip()
    found = _SCIPY_LINE.match(text)
    line, what = (int(found.group(1)), found.group(2)) if found else (None, text)
    what = "; ".join(s[:1].lower() + s[1:] for s in what.rstrip(".").split(". "))  # "Truncated file. Expected.."
    return InputFormatError(path, f"{what} (scipy.io.mmread): expected entry lines "
                                  f"'row col [value]' with 1-based ids in 1..{n:,}, as many as the size line says",
                            line=line)
