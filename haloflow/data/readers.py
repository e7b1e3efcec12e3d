"""Readers for graph files users hold, and ``read_dataset``, the dispatcher the CLI calls.

SNAP edge list (``.txt``, ``.txt.gz``, ``.txt.xz``; 0-based unless ``one_based``; directed; kept as given)::

    # Directed graph: soc-Slashdot0902.txt          <- '#' or '%' comment lines, anywhere
    # FromNodeId<TAB>ToNodeId
    src dst                                         <- optional header line (every token holds a letter)
    0<TAB>1\\r\\n                                      <- src dst: tabs, spaces or commas; LF or CRLF
    0 2 1217567877                                  <- up to 2 more fields (weight, time): read past, ignored
                                                       (the first edge line fixes the count for the file)

A header of another shape (JuliaGraphs ``.jlg``: ``n,m,directed,name,...``, then 1-based ``u,v`` lines) is not
guessed at: ``skip_lines`` (``--skip-lines``) skips the file's first lines, and a first line that breaks the
shape of the next says so in its error.

Node ids must lie below ``2 E + 1024`` (E edge lines) unless ``num_nodes`` says how many there are: E edges
touch at most 2E nodes, so a larger id means mostly isolated nodes -- usually a stray id or raw external ids --
and would otherwise allocate memory for all of them.

PACE / DIMACS ``.gr`` (also ``.gr.xz`` / ``.gr.gz``; 1-based; undirected, each edge stored once)::

    c a comment                                     <- 'c' comment lines
    p tw 4 3                                        <- header: p <kind> <n nodes> <m edges>, before any edge
    1 2                                             <- u v              (PACE)
    a 2 3 7                                         <- a u v [weight]   (DIMACS 9; the weight is ignored)

Both are scanned by :mod:`haloflow.data.textscan` (vectorised, line numbers in every error). Matrix Market
``.mtx`` files are read by :mod:`haloflow.data.matrix_market` (``scipy.io.mmread``).

A pipe, a FIFO or ``/dev/stdin`` (``printf '0 1\n' | haloflow partition /dev/stdin``) can be read only once: it is
opened once (``textscan.PipeInput``), its format told from its name and first bytes, and read as one stream; the
text formats (SNAP, PACE, Matrix Market) can come that way, the others are refused with one line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from haloflow.data.graph import CSRGraph, GraphDataset, check_node_count, max_plausible_nodes
from haloflow.data.matrix_market import BANNER, read_matrix_market
from haloflow.data.textscan import (PipeInput, TokenBlock, first_problem, is_pipe, iter_token_blocks, read_head,
                                    scan_int_rows)
from haloflow.errors import ConfigError, InputFormatError

__all__ = ["read_snap", "read_pace", "PaceHeader", "PaceBlocks", "read_dataset", "detect_format", "planetoid_sets", "FORMATS"]

log = logging.getLogger(__name__)

FORMATS = ("auto", "snap", "pace", "ogb", "planetoid", "mtx", "npy", "parquet", "metis", "arrays")
_OPTIONS = {"snap": ("num_nodes", "one_based", "skip_lines"), "pace": (), "mtx": (), "ogb": ("split", "symmetrize"),
            "planetoid": ("name",), "npy": ("num_nodes",), "parquet": ("num_nodes",), "metis": (),
            "arrays": ("num_nodes",)}
# Formats for graphs larger than memory (binary_edges.py, metis_graph.py, graph_folder.py): suffix -> format.
_BIG_SUFFIXES = {".npy": "npy", ".parquet": "parquet", ".graph": "metis", ".metis": "metis"}
_MAX_FIELDS = 4  # src dst [weight] [time], as SNAP's and KONECT's edge lists have them


# --------------------------------------------------------------------------------------------- SNAP
def read_snap(path: str | os.PathLike | PipeInput, *, num_nodes: int | None = None, one_based: bool = False,
              skip_lines: int = 0) -> CSRGraph:
    """Read a SNAP edge list as a directed graph; self-loops and duplicate edges are kept.

    Args:
        path: plain, gzip or xz text (recognised by the magic bytes), or a pipe opened as a ``PipeInput``.
        num_nodes: N when known (ids must be < N, or <= N when ``one_based``); by default ``max id + 1``, and then
            ids must be < 2 E + 1024 (see the module docstring).
        one_based: the file numbers nodes from 1 (as KONECT and some SNAP copies do); id k becomes node k - 1.
        skip_lines: the file's first lines are not read, whatever they hold (a header of another shape).

    Raises:
        InputFormatError: a malformed line (file and 1-based line in the message), an implausibly large id, or
            no edges and no nodes.
    """
    if num_nodes is not None and num_nodes < 0:
        raise ConfigError(f"num_nodes must be >= 0, got {num_nodes}")
    if skip_lines < 0:
        raise ConfigError(f"skip_lines must be >= 0, got {skip_lines}")
    shift = int(one_based)
    kw = dict(comment="#%", columns="src dst", what="node id", lower=shift, header=True, max_fields=_MAX_FIELDS,
              skip_lines=skip_lines, skip_hint="skip_lines={line} (--skip-lines {line})")
    if one_based:
        kw["range_hint"] = "the file is read as 1-based (one_based=True, --one-based)"
    scan = scan_int_rows(path, 2, upper=None if num_nodes is None else num_nodes + shift, **kw)
    edges = scan.values  # (E, 2)
    if edges.shape[0] == 0 and not num_nodes:
        raise InputFormatError(path, "empty graph: no edge lines and no num_nodes (expected 'src dst' lines)")
    bound = max_plausible_nodes(edges.shape[0])
    if num_nodes is None and edges.size and int(edges.max()) - shift >= bound:  # before max id sizes anything
        _raise_implausible_id(path, kw, bound + shift, edges.shape[0])
    if num_nodes is not None and num_nodes > bound:
        check_node_count(num_nodes, path)
        log.warning("%s: num_nodes = %s for %s edge lines: at least %s nodes will have no edges", path,
                    f"{num_nodes:,}", f"{edges.shape[0]:,}", f"{num_nodes - 2 * edges.shape[0]:,}")
    if skip_lines:
        log.info("%s: skipped the first %d line%s (skip_lines)", path, skip_lines, "s" if skip_lines > 1 else "")
    if scan.header is not None:
        log.info("%s: skipped the header line %d (%s)", path, scan.header_line, " ".join(scan.header))
    if scan.ignored:
        log.warning("%s: ignored %s of every edge line (%s): the graph keeps src -> dst only", path,
                    "a field" if len(scan.ignored) == 1 else f"{len(scan.ignored)} fields", ", ".join(scan.ignored))
    if one_based:
        edges = edges - 1
    elif edges.size and (low := int(edges.min())) > 0:
        isolated = "node 0 is" if low == 1 else f"nodes 0..{low - 1} are"
        log.warning("%s: node id 0 never appears (the smallest id is %d): if the file numbers nodes from 1, pass "
                    "one_based=True (--one-based); read as 0-based, %s isolated", path, low, isolated)
    graph = CSRGraph.from_edges(edges[:, 0], edges[:, 1], num_nodes)
    log.info("read %s: %s", path, graph)
    return graph


def _raise_implausible_id(path, kw: dict, upper: int, num_edges: int) -> None:
    """Scan again (only on this error path) to name the line of the first id >= ``upper``, and raise."""
    hint = (f"without num_nodes, ids must be < 2 x {num_edges:,} edge lines + 1,024, since a larger id would make "
            f"a graph of mostly isolated nodes; pass num_nodes=N (--num-nodes N) if the graph really has that many "
            f"nodes, or renumber the ids to 0..n-1")
    if not isinstance(path, PipeInput):  # a pipe cannot be read again: its message names no line
        scan_int_rows(path, 2, **{**kw, "upper": upper, "range_hint": hint})
    raise InputFormatError(path, f"a node id is >= {upper:,}: {hint}")  # (or the file changed between the scans)


# --------------------------------------------------------------------------------------------- PACE / DIMACS
@dataclass(frozen=True)
class PaceHeader:
    """The ``p <kind> <n> <m>`` line of a PACE/DIMACS file."""

    kind: str
    num_nodes: int
    num_edges: int
    line: int


_C, _P, _A = ord("c"), ord("p"), ord("a")


def read_pace(path: str | os.PathLike | PipeInput) -> CSRGraph:
    """Read a PACE (``u v``) or DIMACS 9 (``a u v [w]``) ``.gr`` file as a symmetric graph.

    Ids become 0-based; every edge is stored in both directions once (duplicates merged), so a DIMACS file that
    already lists both arcs gives the same graph as a PACE file listing each edge once.

    Raises:
        InputFormatError: missing or bad ``p`` header, a malformed line, an id outside ``1..n``, an edge count
            different from the header's m, or a graph with no nodes and no edges.
    """
    blocks = PaceBlocks(path)
    srcs, dsts = [], []
    for u, v in blocks:
        srcs.append(u)
        dsts.append(v)
    src = np.concatenate(srcs) if srcs else np.zeros(0, dtype=np.int64)
    dst = np.concatenate(dsts) if dsts else np.zeros(0, dtype=np.int64)
    header = blocks.check_end(src.shape[0])
    graph = CSRGraph.from_edges(src - 1, dst - 1, header.num_nodes, symmetrize=True)
    log.info("read %s (p %s): %s", path, header.kind, graph)
    return graph


class PaceBlocks:
    """The edges of a PACE / DIMACS ``.gr`` file block by block: iterating yields ``(u, v)`` int64 1-based, one
    pair of arrays per text block, with every line checked (``header`` is set once the ``p`` line is read);
    `check_end` then checks what needs the whole file. ``read_pace`` and the out-of-core reader share it."""

    def __init__(self, path: str | os.PathLike | PipeInput, *, block_bytes: int | None = None,
                 progress: bool = True):
        self.path, self.block_bytes, self.progress = path, block_bytes, progress
        self.header: PaceHeader | None = None

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        self.header = None
        kw = {} if self.block_bytes is None else {"block_bytes": self.block_bytes}
        for tb in iter_token_blocks(self.path, progress=self.progress, **kw):
            if tb.num_lines == 0:
                continue
            lead = tb.lead_byte()  # (L,)
            body = lead != _C
            header_problem = None
            headers = np.flatnonzero(body & (lead == _P))
            if self.header is None:
                first_body = int(np.argmax(body)) if body.any() else -1
                if first_body >= 0 and lead[first_body] != _P:
                    lineno = int(tb.line[tb.line_start[first_body]])
                    raise tb.error(lineno, f"missing header: expected 'p <kind> <n> <m>' before the first edge, "
                                           f"found {tb.line_text(lineno)!r}")
                if first_body < 0:
                    continue  # only comments so far
                self.header = _parse_header(tb, int(headers[0]))
                headers = headers[1:]
            if headers.size:
                lineno = int(tb.line[tb.line_start[headers[0]]])
                header_problem = (lineno, f"second 'p' header (the first is on line {self.header.line}): expected one")
            body[lead == _P] = False
            u, v, problem = _pace_edges(tb, body, self.header.num_nodes)
            problem = first_problem(header_problem, problem)
            if problem is not None:
                raise tb.error(*problem)
            yield u, v

    def check_end(self, num_edges: int) -> PaceHeader:
        """The header, once ``num_edges`` edge lines were read: raises unless it said m = that and n > 0."""
        header = self.header
        if header is None:
            raise InputFormatError(self.path, "missing header: expected a 'p <kind> <n> <m>' line, found none")
        if num_edges != header.num_edges:
            raise InputFormatError(
                self.path, f"the header says m = {header.num_edges:,} edges but the file has {num_edges:,} edge lines",
                line=header.line,
            )
        if header.num_nodes == 0:
            raise InputFormatError(self.path, "empty graph: the header says n = 0 nodes and m = 0 edges",
                                   line=header.line)
        return header


def _parse_header(tb: TokenBlock, j: int) -> PaceHeader:
    """Header on the block's line ``j``: exactly ``p <kind> <n> <m>`` with integers n, m."""
    lineno = int(tb.line[tb.line_start[j]])
    first, count = int(tb.line_start[j]), int(tb.line_count[j])
    expected = f"expected 'p <kind> <n> <m>' with integers n and m, found {tb.line_text(lineno)!r}"
    if count != 4 or tb.token_text(first) != "p":
        raise tb.error(lineno, f"bad header: {expected}")
    values, problem = tb.parse_ints(np.arange(first + 2, first + 4), "count")
    if problem is not None:
        raise tb.error(lineno, f"bad header: {expected}")
    n, m = int(values[0]), int(values[1])
    if n > max_plausible_nodes(m):  # checked before n sizes anything
        raise tb.error(lineno, f"bad header: n = {n:,} nodes for m = {m:,} edges, but m edges touch at most "
                               f"{2 * m:,} nodes; expected n <= 2m + 1,024 = {max_plausible_nodes(m):,} "
                               f"(is the header corrupt?)")
    return PaceHeader(tb.token_text(first + 1), n, m, lineno)


def _pace_edges(tb: TokenBlock, body: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, tuple[int, str] | None]:
    """1-based ``(u, v)`` of the edge lines where ``body`` (L,) is True, and the first problem among them."""
    lead = tb.lead_byte()
    lone = tb.end[tb.line_start] - tb.start[tb.line_start] == 1  # the first token is one character
    arc = body & (lead == _A) & lone
    plain = body & ~arc
    problems = []
    unknown = plain & ((lead < ord("0")) | (lead > ord("9"))) & (lead != ord("-"))
    if unknown.any():
        lineno = int(tb.line[tb.line_start[np.argmax(unknown)]])
        problems.append((lineno, f"expected a 'c' comment, the 'p' header or an edge line 'u v' / 'a u v [weight]', "
                                 f"found {tb.line_text(lineno)!r}"))
        body, plain = body & ~unknown, plain & ~unknown
    wrong = (plain & (tb.line_count != 2)) | (arc & ((tb.line_count < 3) | (tb.line_count > 4)))
    if wrong.any():
        j = int(np.argmax(wrong))
        lineno = int(tb.line[tb.line_start[j]])
        problems.append((lineno, f"expected an edge line 'u v' or 'a u v [weight]', found {tb.line_text(lineno)!r}"))
        body = body & ~wrong
        arc, plain = arc & ~wrong, plain & ~wrong
    # Parse every token of an edge line except the leading 'a' (the weight is checked, then dropped).
    tokens = np.flatnonzero(np.repeat(body, tb.line_count))
    is_a = np.zeros(tb.start.shape[0], dtype=bool)
    is_a[tb.line_start[arc]] = True
    tokens = tokens[~is_a[tokens]]
    values, parse_problem = tb.parse_ints(tokens, "node id")
    problems.append(parse_problem)
    first = tb.line_start[body] + arc[body]  # token index of u on each edge line (after any 'a')
    pos = np.searchsorted(tokens, first)
    u, v = values[pos], values[pos + 1]  # (E_block,)
    if parse_problem is None:
        out = (u < 1) | (u > n) | (v < 1) | (v > n)
        if out.any():
            e = int(np.argmax(out))
            bad = int(u[e]) if not 1 <= u[e] <= n else int(v[e])
            lineno = int(tb.line[first[e]])
            problems.append((lineno, f"node id {bad} is out of range: ids are 1-based, expected 1..{n} (n from the "
                                     f"header), found {tb.line_text(lineno)!r}"))
    return u, v, first_problem(*problems)


# --------------------------------------------------------------------------------------------- dispatcher
def detect_format(path: str | os.PathLike) -> str:
    """Guess the format of ``path``: ``ogb``, ``planetoid``, ``pace``, ``mtx`` or ``snap`` (see
    :func:`read_dataset`)."""
    path = Path(path)
    if path.is_dir():
        if (path / "raw").is_dir():
            return "ogb"
        from haloflow.data.graph_folder import is_graph_folder

        if is_graph_folder(path):
            return "arrays"
        if any(path.glob("*.parquet")):
            return "parquet"
        if any(path.glob("ind.*.x")):
            return "planetoid"
        raise ConfigError(
            f"cannot tell the format of folder {path}: expected raw/ (OGB) or ind.<name>.x files (Planetoid)"
        )
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    name = path.name.lower()
    if Path(name).suffix in _BIG_SUFFIXES:
        return _BIG_SUFFIXES[Path(name).suffix]
    return _text_format(name, read_head(path, 4096))


def _text_format(name: str, head: bytes) -> str:
    """``pace``, ``mtx`` or ``snap`` for a text file named ``name`` (lower case) that begins with ``head``."""
    if name.endswith((".gr", ".gr.xz", ".gr.gz", ".gr.bz2")):
        return "pace"
    if name.endswith((".mtx", ".mtx.gz", ".mtx.xz", ".mtx.bz2")) or head[:len(BANNER)].lower() == BANNER:
        return "mtx"  # read as Matrix Market, or refused by its reader: never as an edge list
    for line in head.splitlines():
        token = line.strip()[:2]
        if not token:
            continue
        if token.startswith(b"c") and (len(token) == 1 or token[1:] in b" \t"):
            continue  # a PACE comment; keep looking for the 'p' line
        return "pace" if token in (b"p", b"p ", b"p\t") else "snap"
    return "snap"


def planetoid_sets(folder: str | os.PathLike) -> list[str]:
    """Names of the Planetoid sets in ``folder`` (one per ``ind.<name>.x`` file), sorted."""
    return sorted(p.name[len("ind.") : -len(".x")] for p in Path(folder).glob("ind.*.x"))


def _planetoid_name(folder: Path, name: str | None) -> str:
    names = planetoid_sets(folder)
    if name is None and len(names) == 1:
        return names[0]
    if name is None:
        raise ConfigError(f"{folder} holds Planetoid sets {names}: pass name= (--name) to pick one")
    if name not in names:
        raise ConfigError(f"{folder} holds no Planetoid set {name!r} (no ind.{name}.x): expected one of {names}")
    return name


def _read_big_format(path: Path, format: str, stem: str, kw: dict) -> GraphDataset:
    """The formats made for graphs larger than memory, read whole (their modules stream them too)."""
    if format == "arrays":
        from haloflow.data.graph_folder import read_graph_folder

        return read_graph_folder(path, **kw)
    if format == "metis":
        from haloflow.data.metis_graph import read_metis

        return GraphDataset(read_metis(path), name=stem)
    from haloflow.data.binary_edges import read_npy_edges, read_parquet_edges

    reader = read_npy_edges if format == "npy" else read_parquet_edges
    return GraphDataset(reader(path, **kw), name=stem)


def read_dataset(path: str | os.PathLike, format: str = "auto", **kw) -> GraphDataset:
    """Read a graph data set in any supported format.

    Args:
        path: a file (SNAP, PACE/DIMACS, Matrix Market), a pipe or FIFO holding one of those three, or a folder
            (OGB node-property, Planetoid).
        format: one of ``auto``, ``snap``, ``pace``, ``mtx``, ``ogb``, ``planetoid``. ``auto``: a folder with
            ``raw/`` is OGB, a folder with ``ind.*.x`` is Planetoid, a ``.gr``/``.gr.xz`` file or one whose first
            non-comment line is a ``p`` header is PACE, a ``.mtx`` file or one that starts ``%%MatrixMarket`` is
            Matrix Market, anything else SNAP.
        **kw: passed to the reader (``num_nodes``, ``one_based`` and ``skip_lines`` for SNAP, ``split`` for OGB,
            ``name`` for a Planetoid folder holding several sets).

    Raises:
        ConfigError: unknown format (the message lists the valid ones).
    """
    if format not in FORMATS:
        raise ConfigError(f"unknown graph format {format!r}: expected one of {', '.join(FORMATS)}")
    path = Path(path)
    if is_pipe(path):  # it can be read once only: opened once, and read as one stream
        with PipeInput(path) as pipe:
            return _read_pipe(pipe, format, kw)
    if format == "auto":
        format = detect_format(path)
        log.info("%s: detected format %s", path, format)
    _check_options(format, kw)
    stem = path.name.split(".")[0] or path.name
    if format == "snap":
        return GraphDataset(read_snap(path, **kw), name=stem)
    if format == "pace":
        return GraphDataset(read_pace(path, **kw), name=stem)
    if format == "mtx":
        return GraphDataset(read_matrix_market(path, **kw), name=stem)
    if format in ("npy", "parquet", "metis", "arrays"):
        return _read_big_format(path, format, stem, kw)
    if format == "ogb":
        from haloflow.data.ogb import read_ogb

        return read_ogb(path, **kw)
    from haloflow.data.planetoid import read_planetoid

    return read_planetoid(path, name=_planetoid_name(path, kw.get("name")))


def _check_options(format: str, kw: dict) -> None:
    unknown = sorted(set(kw) - set(_OPTIONS[format]))
    if unknown:
        raise ConfigError(
            f"format {format!r} takes no option {unknown[0]!r}: expected {' or '.join(_OPTIONS[format]) or 'none'}"
        )


_PIPE_READERS = {"snap": read_snap, "pace": read_pace, "mtx": read_matrix_market}  # read front to back, once


def _read_pipe(pipe: PipeInput, format: str, kw: dict) -> GraphDataset:
    """A pipe's data set: its format told from its name and first bytes; only a text format can come this way."""
    if format == "auto":
        format = _text_format(pipe.path.name.lower(), pipe.peek(4096))
        log.info("%s: detected format %s", pipe, format)
    if format not in _PIPE_READERS:
        raise ConfigError(f"{pipe} is a pipe, which can be read only once, front to back: format {format!r} cannot "
                          f"be read from one (expected {', '.join(_PIPE_READERS)}); save it to a file first")
    _check_options(format, kw)
    return GraphDataset(_PIPE_READERS[format](pipe, **kw), name=pipe.path.name.split(".")[0] or "stdin")
