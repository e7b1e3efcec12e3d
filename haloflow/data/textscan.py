"""Vectorised scanning of integer text files (edge lists, id lists), with exact line numbers for errors.

A file is decompressed as a stream (gzip / xz / bz2 recognised by their magic bytes, whatever the suffix) and cut
into blocks of whole lines. Each block is split into tokens by numpy on its bytes -- no Python loop per line::

    bytes   b"# c\\r\\n0\\t1\\r\\n2,3\\n"
    tokens     #  c     0   1     2 3             separators: space, tab, comma, CR, LF, other control bytes;
                                                  a run of them counts once
    start      0  2     5   7    10 12            first byte of each token (int64, block offsets)
    end        1  3     6   8    11 13            one past its last byte
    line       1  1     2   2     3  3            1-based line number in the *file*
    line_start [0, 2, 4]   line_count [2, 2, 2]   one entry per line that holds tokens (blank lines vanish)

Integers are parsed by looping over digit positions (at most 18), each step vectorised over all tokens, so the
cost is O(bytes) for the masks plus O(tokens x digits) for the values. Checks (field counts, non-integers,
negative ids, ranges) are vectorised too; only the first offending line of a block is looked at in Python, to
build the error message.

``scan_int_rows`` also takes the looser tables users hold (edge lists with a ``src dst`` header line and a weight
or time column)::

    % a comment                  <- any of the ``comment`` characters starts a comment line
    source,target,weight         <- header=True: a first line whose every token holds a letter is skipped
    0,1,0.5                      <- max_fields=4: the first line fixes the field count (here 3); only the
    1,2,-1                          first num_columns fields are parsed, the rest are never looked at

A truncated or corrupt compressed file raises ``InputFormatError`` naming it, not the codec's EOFError.

A regular file is opened again by every step that looks at it (its magic bytes, its first lines, then all of
it). A pipe, a FIFO or ``/dev/stdin`` would lose to each step what the last one read (and a FIFO would wait for
a second writer), so ``PipeInput`` opens it once, and every function here takes it in place of a path::

    the pipe      1f 8b 08 00 ...................................    read front to back, once
                  |magic| -> codec (gzip, xz, bz2 or none)
    PipeInput     "% comment\n0 1\n1 2\n ..."                      the decompressed text
                  |<- head: first 64 KiB, kept ->|<- the rest ->|
    peek(n)       the head's first n bytes, nothing consumed       (format detection, read_head)
    read()        the head, then the rest                          (iter_token_blocks, scipy.io.mmread)
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import BinaryIO

import numpy as np

from haloflow.errors import InputFormatError
from haloflow.utils.progress import progress_bar

__all__ = [
    "open_decompressed",
    "arrow_threads",
    "is_pipe",
    "PipeInput",
    "codec_errors",
    "read_head",
    "TokenBlock",
    "iter_token_blocks",
    "IntRows",
    "scan_int_rows",
    "IntRowScan",
    "read_int_rows",
    "first_problem",
]

BLOCK_BYTES = 16 << 20  # decompressed bytes per block: ~10 bytes of temporaries per input byte at the peak
_MAX_DIGITS = 18  # every 18-digit decimal fits in int64

_COMMA, _NEWLINE, _ZERO, _NINE = 44, 10, 48, 57


def _separators(buf: np.ndarray) -> np.ndarray:
    """bool (B,): space, tab, CR, LF and the other ASCII control bytes, and commas (comparisons beat a lookup)."""
    return (buf <= 32) | (buf == _COMMA)

_MAGIC = [(b"\x1f\x8b", gzip.GzipFile), (b"\xfd7zXZ\x00", lzma.LZMAFile), (b"BZh", bz2.BZ2File)]
_CODEC_NAMES = {gzip.GzipFile: "gzip", lzma.LZMAFile: "xz", bz2.BZ2File: "bz2"}
# What the codecs raise on a cut-off or garbled stream: EOFError (truncated), gzip.BadGzipFile and bz2's
# "Invalid data stream" (both OSError), zlib.error, lzma.LZMAError. Caught only around compressed reads.
_CODEC_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)


def _decompressor(path: Path):
    """The file class that decompresses ``path`` (recognised by its first bytes), or None for plain text."""
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, expected a file")
    with open(path, "rb") as f:
        head = f.read(6)
    return next((cls for magic, cls in _MAGIC if head.startswith(magic)), None)


def open_decompressed(path: str | os.PathLike) -> BinaryIO:
    """Open ``path`` for binary reading, decompressing gzip, xz or bz2 as recognised by the first bytes."""
    path = Path(path)
    cls = _decompressor(path)
    return open(path, "rb") if cls is None else cls(path, "rb")


def arrow_threads(path: str | os.PathLike) -> bool:
    """Whether Arrow's CSV reader may use its thread pool on ``path``: only for a file past 64 MiB. A process that
    exits right after a short threaded read (a bad stream refused in one line) could abort at exit ("terminate called
    without an active exception", SIGABRT), and a small file gains nothing from the threads."""
    return os.stat(path).st_size > (64 << 20)


def _open_codec(cls, raw: BinaryIO) -> BinaryIO:
    """``cls`` (a codec's file class, or None) reading the open file ``raw``."""
    if cls is None:
        return raw
    return cls(fileobj=raw, mode="rb") if cls is gzip.GzipFile else cls(raw, "rb")  # LZMA-, BZ2File: no fileobj=


def is_pipe(path: str | os.PathLike) -> bool:
    """``path`` is neither a regular file nor a folder, so that it can be read only once: a FIFO, ``/dev/stdin``
    (a pipe or a terminal), a socket. False for a missing path (the reader's FileNotFoundError says so)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


class _Prefixed(io.RawIOBase):
    """The bytes ``prefix``, then the rest of ``stream``: what was already read from a pipe, handed back."""

    def __init__(self, prefix: bytes, stream: BinaryIO):
        super().__init__()
        self._prefix, self._stream = memoryview(prefix), stream
        self.bytes_read = 0  # for a progress bar: a pipe has no size and no tell()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._prefix:
            n = min(len(b), len(self._prefix))
            b[:n], self._prefix = self._prefix[:n], self._prefix[n:]
        else:
            data = self._stream.read(len(b))
            n = len(data)
            b[:n] = data
        self.bytes_read += n
        return n


def _read_up_to(f: BinaryIO, size: int) -> bytes:
    """``size`` bytes of ``f``, fewer only at its end (a pipe's read returns what its writer has written so far)."""
    parts, got = [], 0
    while got < size and (data := f.read(size - got)):
        parts.append(data)
        got += len(data)
    return b"".join(parts)


class PipeInput(_Prefixed):
    """A pipe, FIFO or ``/dev/stdin`` opened once, decompressed and its head kept (picture in the module
    docstring); pass it wherever a path goes here. Use it as a context manager (it closes the pipe)."""

    HEAD_BYTES = 64 << 10

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._raw = open(self.path, "rb", buffering=0)  # a FIFO's open waits here for its writer
        magic = _read_up_to(self._raw, 6)
        self.codec = next((cls for m, cls in _MAGIC if magic.startswith(m)), None)
        self._text = _open_codec(self.codec, _Prefixed(magic, self._raw))
        self._head = self._guard(_read_up_to, self._text, self.HEAD_BYTES)
        super().__init__(self._head, self._text)

    def __str__(self) -> str:
        return str(self.path)

    def peek(self, size: int = HEAD_BYTES) -> bytes:
        """The first ``size`` bytes of the text (at most ``HEAD_BYTES``), however much has been read."""
        return self._head[:size]

    def readinto(self, b) -> int:
        return self._guard(super().readinto, b)

    def close(self) -> None:
        if not self.closed:
            self._text.close()
            self._raw.close()
        super().close()

    def _guard(self, read, *args):
        """``read(*args)``, a cut-off or garbled compressed stream raising ``InputFormatError`` naming the pipe."""
        try:
            return read(*args)
        except _CODEC_ERRORS as err:
            if self.codec is None:  # plain text: an OSError is the pipe's, not the data's
                raise
            raise _corrupt(self.path, self.codec, err) from None


def _corrupt(path, cls, err: BaseException, lines_read: int | None = None) -> InputFormatError:
    """The error for a compressed stream that ends early or does not decode."""
    codec = _CODEC_NAMES[cls]
    where = f" after {lines_read:,} complete lines" if lines_read else ""
    return InputFormatError(
        path, f"truncated or corrupt {codec} data{where} ({type(err).__name__}: {err}): expected a complete "
        f"{codec} file (download or compress it again)"
    )


@contextmanager
def codec_errors(path: str | os.PathLike) -> Iterator[None]:
    """Inside the block, a cut-off or garbled compressed ``path`` (however it is read: ``open_decompressed``,
    a reader handed the stream) raises ``InputFormatError`` naming it instead of the codec's EOFError or OSError.
    A plain file's errors pass unchanged (an OSError there is the disk's, not the data's); a ``PipeInput`` names
    itself."""
    cls = None if isinstance(path, PipeInput) else _decompressor(Path(path))
    if cls is None:
        yield
        return
    try:
        yield
    except _CODEC_ERRORS as err:
        raise _corrupt(path, cls, err) from None


def read_head(path: str | os.PathLike | PipeInput, size: int) -> bytes:
    """The first ``size`` decompressed bytes of ``path`` (fewer when the file is shorter; a ``PipeInput`` keeps
    ``PipeInput.HEAD_BYTES`` of them).

    Raises:
        InputFormatError: the compressed stream is truncated or corrupt within those bytes.
    """
    if isinstance(path, PipeInput):
        return path.peek(size)
    path = Path(path)
    cls = _decompressor(path)
    if cls is None:
        with open(path, "rb") as f:
            return f.read(size)
    try:
        with cls(path, "rb") as f:
            return f.read(size)
    except _CODEC_ERRORS as err:
        raise _corrupt(path, cls, err) from None


def _iter_blocks(f: BinaryIO, block_bytes: int) -> Iterator[tuple[bytes, int]]:
    """Yield ``(block, first_line)``: blocks of whole lines (the last may lack its newline)."""
    carry, line = b"", 1
    while True:
        data = f.read(block_bytes)
        if not data:
            if carry:
                yield carry, line
            return
        data = carry + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # one line longer than a block: keep reading
            carry = data
            continue
        block, carry = data[:cut], data[cut:]
        yield block, line
        line += block.count(b"\n")


@dataclass(frozen=True, eq=False)
class TokenBlock:
    """The tokens of one block of whole lines (layout in the module docstring).

    Shapes:
        buf uint8 (B,);  start, end, line int64 (T,);  line_start, line_count int64 (L,);  newlines int64 (B_nl,)
    """

    path: str
    buf: np.ndarray
    start: np.ndarray
    end: np.ndarray
    line: np.ndarray
    line_start: np.ndarray
    line_count: np.ndarray
    newlines: np.ndarray
    first_line: int

    @property
    def num_lines(self) -> int:
        return int(self.line_start.shape[0])

    def lead_byte(self) -> np.ndarray:
        """First byte of each line's first token, uint8 (L,)."""
        return self.buf[self.start[self.line_start]]

    def token_text(self, i: int) -> str:
        return bytes(self.buf[self.start[i] : self.end[i]]).decode("utf-8", "replace")

    def line_text(self, lineno: int, limit: int = 80) -> str:
        """The text of file line ``lineno`` (it must lie in this block), without its line ending."""
        k = lineno - self.first_line
        lo = int(self.newlines[k - 1]) + 1 if k > 0 else 0
        hi = int(self.newlines[k]) if k < self.newlines.shape[0] else self.buf.shape[0]
        text = bytes(self.buf[lo:hi]).decode("utf-8", "replace").rstrip("\r")
        return text if len(text) <= limit else text[:limit] + "..."

    def error(self, lineno: int, message: str) -> InputFormatError:
        return InputFormatError(self.path, message, line=lineno)

    # ------------------------------------------------------------------------------------- integers
    @cached_property
    def non_numeric(self) -> np.ndarray:
        """bool (T,): the token holds a byte that is not a decimal digit (one pass over the block's bytes)."""
        buf = self.buf
        flagged = np.zeros(self.start.shape[0], dtype=bool)
        nd = np.flatnonzero((buf > _NINE) | ((buf < _ZERO) & (buf > 32) & (buf != _COMMA)))
        if nd.size:
            flagged[np.searchsorted(self.start, nd, side="right") - 1] = True
        return flagged

    def parse_ints(self, tokens: np.ndarray, what: str = "id") -> tuple[np.ndarray, tuple[int, str] | None]:
        """Parse tokens ``tokens`` (int64 indices) as non-negative decimal integers.

        Returns ``(values int64 (len(tokens),), problem)`` where ``problem`` is ``(line, message)`` for the first
        token that is not a plain non-negative integer, or None. Values of bad tokens are meaningless.
        """
        s = self.start[tokens]
        length = self.end[tokens] - s
        bad = (length > _MAX_DIGITS) | self.non_numeric[tokens]
        end = self.end[tokens]
        values = np.zeros(tokens.shape[0], dtype=np.int64)
        width = int(min(length.max(initial=0), _MAX_DIGITS))
        for k in range(width):  # digits right-aligned to `width`: a missing leading digit counts as 0
            pos = end - (width - k)  # (n,)
            digit = np.where(pos >= s, self.buf[np.maximum(pos, 0)] - np.uint8(_ZERO), np.uint8(0))
            values *= 10
            values += digit
        if not bad.any():
            return values, None
        i = int(tokens[np.argmax(bad)])
        text, lineno = self.token_text(i), int(self.line[i])
        found = f"found {text!r} in line {self.line_text(lineno)!r}"
        if text.startswith("-") and text[1:].isascii() and text[1:].isdigit():
            return values, (lineno, f"negative {what} {text}: expected {what}s >= 0 ({found})")
        if text.isascii() and text.isdigit():
            return values, (lineno, f"{what} {text} has more than {_MAX_DIGITS} digits: expected a 64-bit integer")
        return values, (lineno, f"non-integer token {text!r}: expected an integer {what} ({found})")


def _tokenize(path: str, block: bytes, first_line: int) -> TokenBlock:
    nul = block.find(b"\x00")  # one memchr: a NUL would otherwise read as a separator (or a blank line)
    if nul >= 0:
        raise InputFormatError(path, "a NUL byte (\\x00): expected a text line (a binary or damaged file?)",
                               line=first_line + block.count(b"\n", 0, nul))
    buf = np.frombuffer(block, dtype=np.uint8)  # (B,)
    content = np.zeros(buf.shape[0] + 2, dtype=bool)
    np.logical_not(_separators(buf), out=content[1:-1])
    edges = np.flatnonzero(content[1:] != content[:-1])  # alternating token starts and ends
    start, end = edges[0::2].astype(np.int64), edges[1::2].astype(np.int64)
    newlines = np.flatnonzero(buf == _NEWLINE)
    line = np.searchsorted(newlines, start).astype(np.int64) + first_line  # (T,) newlines before + first line
    opens = np.ones(start.shape[0], dtype=bool)
    opens[1:] = line[1:] != line[:-1]
    line_start = np.flatnonzero(opens)
    line_count = np.diff(np.append(line_start, start.shape[0]))
    return TokenBlock(path, buf, start, end, line, line_start, line_count, newlines, first_line)


def iter_token_blocks(
    path: str | os.PathLike | PipeInput, *, block_bytes: int = BLOCK_BYTES, progress: bool = True
) -> Iterator[TokenBlock]:
    """Tokenise a (possibly compressed) text file, or a ``PipeInput`` from where it stands, block by block.

    A progress bar over the bytes of the file on disk (a pipe's: read so far) is drawn when ``progress`` and
    stderr is a terminal.
    """
    if isinstance(path, PipeInput):
        with progress_bar(desc=f"reading {path.path.name}", unit="B", enabled=progress) as bar:
            for block, first_line in _iter_blocks(path, block_bytes):  # its codec errors name it already
                bar.update(path.bytes_read - bar.n)
                yield _tokenize(str(path), block, first_line)
        return
    path = Path(path)
    cls = _decompressor(path)
    with open(path, "rb") as raw, progress_bar(
        total=os.path.getsize(path), desc=f"reading {path.name}", unit="B", enabled=progress
    ) as bar:
        f = _open_codec(cls, raw)
        blocks = _iter_blocks(f, block_bytes)
        lines_read = 0
        while True:
            try:
                block, first_line = next(blocks)
            except StopIteration:
                return
            except _CODEC_ERRORS as err:
                if cls is None:  # a plain file: an OSError here is the disk's, not the data's
                    raise
                raise _corrupt(path, cls, err, lines_read) from None
            bar.update(raw.tell() - bar.n)  # compressed bytes consumed so far
            tb = _tokenize(str(path), block, first_line)
            lines_read = first_line - 1 + tb.newlines.shape[0]
            yield tb


def first_problem(*problems: tuple[int, str] | None) -> tuple[int, str] | None:
    """The problem on the earliest line, or None when there is none."""
    found = [p for p in problems if p is not None]
    return min(found, key=lambda p: p[0]) if found else None


@dataclass(frozen=True)
class IntRows:
    """What :func:`scan_int_rows` found.

    Shapes:
        values int64 (R, num_columns): the parsed fields of each data line, in file order.
    """

    values: np.ndarray
    num_fields: int  # fields on every data line: num_columns, plus the ignored ones
    header: tuple[str, ...] | None = None  # the names on the header line, when one was skipped
    header_line: int | None = None

    @property
    def ignored(self) -> tuple[str, ...]:
        """Names of the fields after the parsed ones: from the header, else ``column 3``, ``column 4``."""
        start = self.values.shape[1]
        if self.header is not None:
            return self.header[start:]
        return tuple(f"column {k + 1}" for k in range(start, self.num_fields))


def scan_int_rows(path: str | os.PathLike, num_columns: int, **options) -> IntRows:
    """Read a text table whose first ``num_columns`` fields are non-negative integers (layouts in the module
    docstring).

    Args (``options`` are `IntRowScan`'s keywords, the same in both):
        path: plain, gzip, xz or bz2 file, or a ``PipeInput``.
        num_columns: fields parsed on each non-blank, non-comment line.
        comment: lines whose first token starts with any of these characters are skipped (None: no comments).
        columns: how to name the parsed fields in an error message, e.g. ``"src dst"``.
        what: how to name one value in an error message (``"node id"``).
        lower, upper: every value must be ``>= lower`` and, when ``upper`` is given, ``< upper``.
        range_hint: appended to an out-of-range message (why the bound, how to lift it).
        header: skip the first non-comment line when every token on it holds a letter (``src dst``).
        max_fields: lines may hold up to this many fields (default ``num_columns``); the first data line (or the
            header) fixes the count for the whole file, and the fields after ``num_columns`` are not parsed.
        skip_lines: the file's first lines not read at all, whatever they hold (a header of another shape, as
            JuliaGraphs' ``n,m,directed,...``); line numbers in errors still count them.
        skip_hint: how the caller skips lines, with ``{line}`` for a count (``"skip_lines={line}"``): when the
            first data line is malformed, or the second differs from it in shape, the error ends with
            "if line L is a header, pass" and this, L being the first data line.

    Raises:
        InputFormatError: naming the file and 1-based line of the first malformed line; or a truncated or
            corrupt compressed file.
    """
    scan = IntRowScan(path, num_columns, **options)
    out = list(scan)
    if not out:
        values = np.zeros((0, num_columns), dtype=np.int64)
    else:
        values = np.concatenate(out) if len(out) > 1 else out[0]
    return scan.result(values)


class IntRowScan:
    """The rows of :func:`scan_int_rows`, one block of whole lines at a time: iterate it for int64
    ``(r, num_columns)`` arrays in file order (the same checks and messages, raised at the block that holds the
    first bad line). After the iteration, ``num_fields``, ``header`` and ``header_line`` say what was found.

    This is how a file larger than memory is read: each block is handed on before the next is parsed.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        num_columns: int,
        *,
        comment: str | None = "#",
        columns: str = "",
        what: str = "id",
        lower: int = 0,
        upper: int | None = None,
        range_hint: str = "",
        header: bool = False,
        max_fields: int | None = None,
        skip_lines: int = 0,
        skip_hint: str = "",
        block_bytes: int = BLOCK_BYTES,
        progress: bool = True,
    ):
        if skip_lines < 0:
            raise ValueError(f"skip_lines must be >= 0, got {skip_lines}")
        self.skip_lines, self.skip_hint = skip_lines, skip_hint
        self.path, self.num_columns, self.columns, self.what = path, num_columns, columns, what
        self.lower, self.upper, self.range_hint, self.header_allowed = lower, upper, range_hint, header
        self.max_fields = num_columns if max_fields is None else max_fields
        self.leads = None if not comment else np.frombuffer(comment.encode(), dtype=np.uint8)
        self.block_bytes, self.progress = block_bytes, progress
        self.num_fields: int | None = None
        self.header: tuple[str, ...] | None = None
        self.header_line: int | None = None

    def result(self, values: np.ndarray) -> IntRows:
        """``values`` (the concatenated blocks) with what the scan found about the fields."""
        return IntRows(values, num_fields=self.num_fields or self.num_columns, header=self.header,
                       header_line=self.header_line if self.header is not None else None)

    def __iter__(self) -> Iterator[np.ndarray]:
        num_columns, max_fields, columns, what = self.num_columns, self.max_fields, self.columns, self.what
        lower, upper, range_hint, leads = self.lower, self.upper, self.range_hint, self.leads
        header = self.header_allowed
        fields = num_columns if max_fields == num_columns and not header else None  # None: the first line decides
        fields_line: int | None = None  # the line that fixed `fields`, when it was not fixed in advance
        names: tuple[str, ...] | None = None
        rows = 0  # data lines read in earlier blocks
        for tb in iter_token_blocks(self.path, block_bytes=self.block_bytes, progress=self.progress):
            if tb.num_lines == 0:
                continue
            data = _data_lines(tb, leads)
            if self.skip_lines:
                data &= tb.line[tb.line_start] > self.skip_lines
            if fields is None and data.any():
                j = int(np.argmax(data))
                fields_line = int(tb.line[tb.line_start[j]])
                if header and _is_header(tb, j):
                    first = int(tb.line_start[j])
                    names = tuple(tb.token_text(i) for i in range(first, first + int(tb.line_count[j])))
                    data[j] = False
                    if not num_columns <= len(names) <= max_fields:
                        raise tb.error(fields_line, f"header {tb.line_text(fields_line)!r} names {len(names)} column"
                                                    f"{'s' if len(names) != 1 else ''}: "
                                                    f"expected {_field_range(num_columns, max_fields, columns)}")
                    fields = len(names)
                else:
                    count = int(tb.line_count[j])
                    fields = count if num_columns <= count <= max_fields else num_columns
            if fields is None:
                continue  # only comments (or the header) so far
            wrong = data & (tb.line_count != fields)
            shape_problem = None
            if wrong.any():
                j = int(np.argmax(wrong))
                lineno = int(tb.line[tb.line_start[j]])
                shape_problem = (lineno, _shape_message(tb, j, lineno, fields, num_columns, max_fields, columns,
                                                        names, fields_line))
                data &= ~wrong
            if fields == num_columns:
                tokens = _tokens_of_lines(tb, data)
            else:  # the leading num_columns tokens of each line; the rest (a weight, a time) are never parsed
                tokens = (tb.line_start[data][:, None] + np.arange(num_columns)).ravel()
            values, parse_problem = tb.parse_ints(tokens, what)
            range_problem = None
            if parse_problem is None and values.size and (
                (upper is not None and int(values.max()) >= upper) or (lower > 0 and int(values.min()) < lower)
            ):
                bad = values < lower
                if upper is not None:
                    bad |= values >= upper
                i = int(tokens[np.argmax(bad)])
                lineno = int(tb.line[i])
                if upper is None:
                    expected = f"{what}s >= {lower}"
                else:
                    expected = f"{what}s in [0, {upper})" if lower == 0 else f"{what}s in {lower}..{upper - 1}"
                range_problem = (
                    lineno,
                    f"{what} {tb.token_text(i)} is out of range: expected {expected} (line {tb.line_text(lineno)!r})"
                    + (f"; {range_hint}" if range_hint else ""),
                )
            problem = first_problem(shape_problem, parse_problem, range_problem)
            if problem is not None:
                raise tb.error(problem[0], problem[1] + self._header_hint(tb, data, rows, problem, shape_problem,
                                                                          fields_line, names))
            rows += int(np.count_nonzero(data))
            self.num_fields, self.header, self.header_line = fields, names, fields_line
            yield values.reshape(-1, num_columns)
        self.num_fields, self.header, self.header_line = fields, names, fields_line


    def _header_hint(self, tb: TokenBlock, data: np.ndarray, rows: int, problem, shape_problem,
                     fields_line: int | None, names) -> str:
        """How to skip the first data line, when the problem may be that it is a header of another shape: it is
        the bad line itself, or the line after it breaks the shape it set."""
        if not self.skip_hint or fields_line is None or names is not None:
            return ""
        lineno = problem[0]
        before = rows + int(np.count_nonzero(data & (tb.line[tb.line_start] < lineno)))  # good data lines before
        if lineno != fields_line and not (problem is shape_problem and before == 1):
            return ""
        return f"; if line {fields_line} is a header, pass {self.skip_hint.format(line=fields_line)}"


def read_int_rows(
    path: str | os.PathLike,
    num_columns: int,
    *,
    comment: str | None = "#",
    columns: str = "",
    what: str = "id",
    upper: int | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> np.ndarray:
    """Read a text table of non-negative integers, ``num_columns`` per line, into int64 ``(R, num_columns)``.

    Args:
        path: plain, gzip, xz or bz2 file.
        num_columns: fields each non-blank, non-comment line must hold.
        comment: lines whose first token starts with this character are skipped (None: no comments).
        columns: how to name the fields in an error message, e.g. ``"src dst"``.
        what: how to name one value in an error message (``"node id"``).
        upper: when given, every value must be ``< upper``.

    Raises:
        InputFormatError: naming the file and 1-based line of the first malformed line.
    """
    return scan_int_rows(
        path, num_columns, comment=comment, columns=columns, what=what, upper=upper, block_bytes=block_bytes
    ).values


def _data_lines(tb: TokenBlock, leads: np.ndarray | None) -> np.ndarray:
    """bool (L,): the lines that are not comments."""
    if leads is None:
        return np.ones(tb.num_lines, dtype=bool)
    lead = tb.lead_byte()
    if leads.shape[0] == 1:
        return lead != leads[0]
    return ~np.isin(lead, leads)


def _is_header(tb: TokenBlock, j: int) -> bool:
    """Line ``j`` of the block is a header: every token holds a letter (so ``-1`` or ``1.5`` is not one)."""
    first = int(tb.line_start[j])
    return all(any(c.isalpha() for c in tb.token_text(i)) for i in range(first, first + int(tb.line_count[j])))


def _field_range(num_columns: int, max_fields: int, columns: str) -> str:
    named = f" ({columns})" if columns else ""
    if max_fields == num_columns:
        return f"{num_columns} field{'s' if num_columns > 1 else ''}{named}"
    return f"{num_columns} to {max_fields} fields{named[:-1] + ', then ignored ones)' if named else ''}"


def _shape_message(tb: TokenBlock, j: int, lineno: int, fields: int, num_columns: int, max_fields: int,
                   columns: str, names: tuple[str, ...] | None, fields_line: int | None) -> str:
    """Why line ``j`` (file line ``lineno``) has the wrong number of fields."""
    found = f"found {int(tb.line_count[j])}: {tb.line_text(lineno)!r}"
    if fields_line is None or (lineno == fields_line and names is None):  # fixed in advance, or the first line
        expected = _field_range(num_columns, max_fields, columns)
        return f"expected {expected} separated by tabs, spaces or commas, {found}"
    if names is not None:
        named = " ".join(names)
    elif fields > num_columns:
        named = f"{columns} + {fields - num_columns} ignored" if columns else f"{fields - num_columns} ignored"
    else:
        named = columns
    expected = f"{fields} field{'s' if fields > 1 else ''}{f' ({named})' if named else ''}"
    source = "the header" if names is not None else "the first data line"
    return (f"expected {expected} separated by tabs, spaces or commas, {found} "
            f"({source}, line {fields_line}, has {fields}; every line must have as many)")

def _tokens_of_lines(tb: TokenBlock, keep: np.ndarray) -> np.ndarray:
    """Indices of all tokens on the lines where ``keep`` (L,) is True, in file order."""
    per_token = np.repeat(keep, tb.line_count)
    return np.flatnonzero(per_token)
