"""Raw Criteo text: how one input file is written (its ``CriteoTextFormat``), reading it block by block, and parsing
a block of lines into labels, dense values and raw categorical values with Arrow kernels and numpy.

The text formats met in practice::

    0<TAB>1<TAB>5<TAB><TAB>...<TAB>68fd1e64          Kaggle train.txt, Criteo 1TB day_N: tab-separated, no header
    label,I1,...,I13,C1,...,C26                      Kaggle samples as CSV: a header line, commas, and often
    0,1.0,1,5.0,,1382.0,...,68fd1e64                 integers written as floats ("1382.0": pandas wrote NaN)
    Id,Label,I1,...,C26                              the same with a leading Id column (dropped)
    10000743,1,1.0,0,...

``sniff_format`` reads the first 64 KiB of a file once: an empty file, binary data, or a compressed file whose
name hides its codec is an ``InputFormatError`` there, before any pass over the data. Compressed files are
recognised by their suffix (Arrow's codecs; Python's lzma for ``.xz``).
"""

from __future__ import annotations

import lzma
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from haloflow.errors import InputFormatError

__all__ = [
    "NUM_DENSE",
    "NUM_SPARSE",
    "NUM_FIELDS",
    "MIN_FIELDS",
    "READ_ERRORS",
    "CriteoTextFormat",
    "sniff_format",
    "read_line_blocks",
    "ParsedBlock",
    "parse_block",
    "explain_bad_line",
    "count_lines",
    "unreadable",
]

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE  # 40
MIN_FIELDS = 1 + NUM_DENSE  # trailing categoricals may be stripped, the label and integers may not
# What a cut-off or garbled stream raises: OSError from Arrow's codecs, EOFError / LZMAError from Python's lzma,
# ArrowInvalid for bytes the CSV reader cannot take.
READ_ERRORS = (OSError, EOFError, lzma.LZMAError, pa.ArrowException)

_LINE = "a 0/1 label, 13 integer and 26 hex fields per line, tab- or comma-separated"
_INT = re.compile(r"-?[0-9]{1,18}(\.0*)?")  # an integer, or one written as a float ("1382.0")
_HEX = re.compile(r"[0-9a-fA-F]{1,16}")
_HEX_LUT = np.full(256, 255, dtype=np.uint8)  # byte -> nibble, 255 = not a hex digit
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i
_SNIFF_BYTES = 1 << 16
_MAGIC = {b"\x1f\x8b": ".gz", b"BZh": ".bz2", b"\xfd7zXZ\x00": ".xz", b"\x28\xb5\x2f\xfd": ".zst"}


@dataclass(frozen=True)
class CriteoTextFormat:
    """How one input file is written (see the module docstring)."""

    delimiter: str = "\t"
    header: bool = False  # the first line names the columns; it is not a data line
    id_column: bool = False  # each line starts with a row id before the label (dropped)

    def describe(self) -> str:
        parts = ["tab-separated" if self.delimiter == "\t" else f"{self.delimiter!r}-separated"]
        parts += ["a header line"] * self.header + ["a leading Id column"] * self.id_column
        return ", ".join(parts)

    @property
    def skip(self) -> int:
        return int(self.id_column)


def unreadable(path: Path, err: BaseException, lines_read: int) -> InputFormatError:
    """The error for a file Arrow cannot read on: a truncated or corrupt compressed stream, undecodable bytes."""
    text = re.sub(r"[^\x20-\x7e]+", "?", str(err)).strip()  # Arrow quotes the offending bytes; keep one clean line
    text = text if len(text) <= 120 else text[:120] + "..."
    where = f" after line {lines_read:,}" if lines_read else ""
    return InputFormatError(path, f"cannot be read{where} ({type(err).__name__}: {text}): expected complete "
                                  f"Criteo text, plain or compressed (is the file truncated or corrupt?)")


def _open(path: Path):
    """The decompressed bytes of ``path`` as a stream: Arrow's codecs, chosen by the suffix (.gz, .bz2, .zst,
    .lz4), or Python's lzma for .xz, which Arrow lacks."""
    if path.name.endswith(".xz"):
        return pa.PythonFile(lzma.open(path, "rb"), mode="r")
    return pa.input_stream(str(path), compression="detect")


def sniff_format(path: Path) -> CriteoTextFormat:
    """The text format of ``path`` from its first line: delimiter (a tab, else a comma), header, Id column.

    Raises:
        InputFormatError: the file is empty, binary, compressed under a name without the codec's suffix (Arrow
            picks the codec by the suffix), or cannot be decompressed.
    """
    try:
        with _open(path) as f:
            head = f.read(_SNIFF_BYTES)
    except READ_ERRORS as err:
        raise unreadable(path, err, 0) from None
    if not head:
        raise InputFormatError(path, f"empty file: expected Criteo lines ({_LINE})")
    for magic, suffix in _MAGIC.items():
        if head.startswith(magic):
            raise InputFormatError(path, f"compressed data in a file not named *{suffix}: expected text, or a name "
                                         f"ending in {suffix} so that it is decompressed")
    bad = _binary_offset(head, complete=len(head) < _SNIFF_BYTES)
    if bad is not None:
        raise InputFormatError(path, f"binary data, not text (byte 0x{head[bad]:02x} at offset {bad:,}): "
                                     f"expected Criteo lines ({_LINE})")
    first = head.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", "replace")
    delimiter = "\t" if "\t" in first else "," if "," in first else "\t"
    lead = first.split(delimiter, 1)[0].strip()
    header = bool(re.match(r"[A-Za-z_]", lead))  # a data line starts with its 0/1 label (or a numeric Id)
    return CriteoTextFormat(delimiter=delimiter, header=header, id_column=header and lead.lower() == "id")


def _binary_offset(head: bytes, complete: bool) -> int | None:
    """Offset of the first NUL byte or invalid UTF-8 sequence in ``head``, or None (text)."""
    found = [head.find(b"\x00")]
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if complete or err.start < len(head) - 3:  # not a character cut in two by the end of the sniffed bytes
            found.append(err.start)
    found = [i for i in found if i >= 0]
    return min(found) if found else None


def read_line_blocks(path: Path, block_size: int, skipped: list[tuple[int, str]]) -> Iterator[tuple[pa.Array, int]]:
    """Yield ``(lines, bytes)`` per block; each line is one string. Lines the reader cannot take as one
    column (they contain the byte 0x1f, used as the never-seen delimiter) go to ``skipped`` as (number, text).
    Raises what Arrow raises (``READ_ERRORS``); the caller names the file and line.
    """

    def on_invalid(row) -> str:
        skipped.append((row.number, row.text))
        return "skip"

    with _open(path) as stream:
        reader = pacsv.open_csv(
            stream,
            read_options=pacsv.ReadOptions(column_names=["line"], block_size=block_size, use_threads=False),
            parse_options=pacsv.ParseOptions(
                delimiter="\x1f", quote_char=False, escape_char=False, ignore_empty_lines=False,
                invalid_row_handler=on_invalid,
            ),  # fmt: skip
            convert_options=pacsv.ConvertOptions(
                column_types={"line": pa.string()}, strings_can_be_null=False, quoted_strings_can_be_null=False,
                check_utf8=False,
            ),  # fmt: skip
        )
        for batch in reader:
            lines = batch.column(0)
            yield lines, int(pc.sum(pc.binary_length(lines)).as_py() or 0) + len(lines)


@dataclass
class ParsedBlock:
    """One block: labels int8 (n,), dense float32 (n, 13), raw categorical values uint64 (n, 26), missing
    bool (n, 26), ok bool (n,) (False for a bad row)."""

    labels: np.ndarray
    dense: np.ndarray
    values: np.ndarray
    missing: np.ndarray
    ok: np.ndarray


def parse_block(lines: pa.Array, fmt: CriteoTextFormat = CriteoTextFormat()) -> ParsedBlock:
    n = len(lines)
    parts = pc.split_pattern(lines, fmt.delimiter)  # list<string> (n,)
    nf = pc.list_value_length(parts).to_numpy(zero_copy_only=False) - fmt.skip  # fields after any Id
    offs = parts.offsets.to_numpy().astype(np.int64)  # (n+1,)
    flat = parts.flatten()
    offs -= offs[0]
    ok = (nf >= MIN_FIELDS) & (nf <= NUM_FIELDS)

    def column(j: int) -> pa.Array:
        present = ok & (j < nf)
        taken = pc.take(flat, pa.array(np.where(present, offs[:-1] + fmt.skip + j, 0)))
        return pc.if_else(pa.array(present), taken, "")  # (n,) strings, "" = missing

    label = column(0)
    ok &= pc.or_(pc.equal(label, "0"), pc.equal(label, "1")).to_numpy(zero_copy_only=False)
    labels = pc.equal(label, "1").to_numpy(zero_copy_only=False).astype(np.int8)

    dense = np.zeros((n, NUM_DENSE), dtype=np.float32)
    for j in range(NUM_DENSE):
        text = column(1 + j)
        filled = pc.if_else(pc.equal(text, ""), "0", text)
        try:
            ints = pc.cast(filled, pa.int64()).to_numpy()  # fast path: the whole column is clean
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            good = pc.match_substring_regex(filled, f"^{_INT.pattern}$").to_numpy(zero_copy_only=False)
            ok &= good
            whole = pc.replace_substring_regex(filled, r"\.0*$", "")  # "1382.0" -> "1382"
            ints = pc.cast(pc.if_else(pa.array(good), whole, "0"), pa.int64()).to_numpy()
        dense[:, j] = np.log1p(np.maximum(ints, 0).astype(np.float64))  # log(1 + max(x, 0)), missing -> 0

    values = np.zeros((n, NUM_SPARSE), dtype=np.uint64)
    missing = np.zeros((n, NUM_SPARSE), dtype=bool)
    for j in range(NUM_SPARSE):
        text = column(1 + NUM_DENSE + j)
        length = pc.binary_length(text).to_numpy(zero_copy_only=False)
        missing[:, j] = length == 0
        too_long = length > 16
        ok &= ~too_long
        values[:, j], is_hex = _parse_hex(pc.if_else(pa.array(too_long), "0", text))
        ok &= is_hex
    return ParsedBlock(labels, dense, values, missing, ok)


def _parse_hex(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Strings of at most 16 chars -> (uint64 values (n,), is_hex (n,)); "" parses as 0. Vectorised via a
    byte lookup table: left-pad to 16 digits, map bytes to nibbles, pack pairs into bytes, read big-endian."""
    n = len(text)
    padded = pc.utf8_lpad(text, width=16, padding="0")
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int32, count=n + 1, offset=4 * padded.offset)
    start = int(offsets[0])
    raw = np.frombuffer(padded.buffers()[2], dtype=np.uint8, count=16 * n, offset=start).reshape(n, 16)
    nib = _HEX_LUT[raw]  # (n, 16)
    is_hex = (nib != 255).all(axis=1)
    packed = (nib[:, 0::2] << 4) | (nib[:, 1::2] & 15)  # (n, 8) bytes, most significant first
    return np.ascontiguousarray(packed).view(">u8").reshape(n).astype(np.uint64), is_hex


def explain_bad_line(text: str, fmt: CriteoTextFormat = CriteoTextFormat()) -> str:
    """Why one line is bad, in words (called for the few reported lines only)."""
    if "\x1f" in text:
        return "contains the control byte 0x1f, which a Criteo line never holds"
    fields = text.split(fmt.delimiter)[fmt.skip :]
    if not MIN_FIELDS <= len(fields) <= NUM_FIELDS:
        sep = "tab" if fmt.delimiter == "\t" else f"{fmt.delimiter!r}"
        return (
            f"expected {NUM_FIELDS} {sep}-separated fields{' after the Id' if fmt.skip else ''} (at least "
            f"{MIN_FIELDS} when trailing empty ones are left out), found {len(fields)}"
        )
    if fields[0] not in ("0", "1"):
        return f"label must be 0 or 1, found {fields[0]!r}"
    for j, f in enumerate(fields[1 : 1 + NUM_DENSE]):
        if f and not _INT.fullmatch(f):
            return f"I{j + 1} must be an integer, found {f!r}"
    for j, f in enumerate(fields[1 + NUM_DENSE :]):
        if f and not _HEX.fullmatch(f):
            return f"C{j + 1} must be a hex string of 1-16 digits, found {f!r}"
    return "unparseable line"


def count_lines(path: Path) -> int:
    """Lines in a (possibly compressed) file, read in 16 MB chunks: one C-speed pass, no parsing."""
    count, last = 0, b"\n"
    try:
        with _open(path) as f:
            while chunk := f.read(16 << 20):
                count += chunk.count(b"\n")
                last = chunk[-1:]
    except READ_ERRORS as err:
        raise unreadable(path, err, count) from None
    return count + (last != b"\n")
