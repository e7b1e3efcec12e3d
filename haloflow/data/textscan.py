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
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import BinaryIO

import numpy as np

from haloflow.errors import InputFormatError
from haloflow.utils.progress import progress_bar

__all__ = ["open_decompressed", "TokenBlock", "iter_token_blocks", "read_int_rows", "first_problem"]

BLOCK_BYTES = 16 << 20  # decompressed bytes per block: ~10 bytes of temporaries per input byte at the peak
_MAX_DIGITS = 18  # every 18-digit decimal fits in int64

_COMMA, _NEWLINE, _ZERO, _NINE = 44, 10, 48, 57


def _separators(buf: np.ndarray) -> np.ndarray:
    """bool (B,): space, tab, CR, LF and the other ASCII control bytes, and commas (comparisons beat a lookup)."""
    return (buf <= 32) | (buf == _COMMA)

_MAGIC = [(b"\x1f\x8b", gzip.GzipFile), (b"\xfd7zXZ\x00", lzma.LZMAFile), (b"BZh", bz2.BZ2File)]


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
    path: str | os.PathLike, *, block_bytes: int = BLOCK_BYTES, progress: bool = True
) -> Iterator[TokenBlock]:
    """Tokenise a (possibly compressed) text file block by block.

    A progress bar over the bytes of the file on disk is drawn when ``progress`` and stderr is a terminal.
    """
    path = Path(path)
    cls = _decompressor(path)
    with open(path, "rb") as raw, progress_bar(
        total=os.path.getsize(path), desc=f"reading {path.name}", unit="B", enabled=progress
    ) as bar:
        if cls is None:
            f = raw
        elif cls is gzip.GzipFile:
            f = cls(fileobj=raw, mode="rb")
        else:  # LZMAFile and BZ2File take a file object in place of a name
            f = cls(raw, "rb")
        for block, first_line in _iter_blocks(f, block_bytes):
            bar.update(raw.tell() - bar.n)  # compressed bytes consumed so far
            yield _tokenize(str(path), block, first_line)


def first_problem(*problems: tuple[int, str] | None) -> tuple[int, str] | None:
    """The problem on the earliest line, or None when there is none."""
    found = [p for p in problems if p is not None]
    return min(found, key=lambda p: p[0]) if found else None


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
    lead = None if comment is None else ord(comment)
    out: list[np.ndarray] = []
    for tb in iter_token_blocks(path, block_bytes=block_bytes):
        if tb.num_lines == 0:
            continue
        data = tb.lead_byte() != lead if lead is not None else np.ones(tb.num_lines, dtype=bool)
        wrong = data & (tb.line_count != num_columns)
        shape_problem = None
        if wrong.any():
            j = int(np.argmax(wrong))
            lineno = int(tb.line[tb.line_start[j]])
            named = f" ({columns})" if columns else ""
            shape_problem = (
                lineno,
                f"expected {num_columns} field{'s' if num_columns > 1 else ''}{named} separated by tabs, spaces or "
                f"commas, found {int(tb.line_count[j])}: {tb.line_text(lineno)!r}",
            )
            data &= ~wrong
        tokens = _tokens_of_lines(tb, data)
        values, parse_problem = tb.parse_ints(tokens, what)
        range_problem = None
        if upper is not None and parse_problem is None and values.size and int(values.max()) >= upper:
            i = int(tokens[np.argmax(values >= upper)])
            lineno = int(tb.line[i])
            range_problem = (
                lineno,
                f"{what} {tb.token_text(i)} is out of range: expected {what}s in [0, {upper}) "
                f"(line {tb.line_text(lineno)!r})",
            )
        problem = first_problem(shape_problem, parse_problem, range_problem)
        if problem is not None:
            raise tb.error(*problem)
        out.append(values.reshape(-1, num_columns))
    if not out:
        return np.zeros((0, num_columns), dtype=np.int64)
    return np.concatenate(out) if len(out) > 1 else out[0]


def _tokens_of_lines(tb: TokenBlock, keep: np.ndarray) -> np.ndarray:
    """Indices of all tokens on the lines where ``keep`` (L,) is True, in file order."""
    per_token = np.repeat(keep, tb.line_count)
    return np.flatnonzero(per_token)
