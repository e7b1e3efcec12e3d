"""Parse Criteo click logs (Kaggle ``train.txt``, Criteo 1TB ``day_N``) into the Parquet layout of ``criteo_loader``.

A raw line is tab-separated, 40 fields; an empty field is a missing value::

    label  I1 .. I13            C1 .. C26
    0      1  5  ''  ... 2      68fd1e64  80e26c9b  ''  ...  9727dd16
    |      13 integers          26 categoricals, hex strings (8 digits in the real data)

Some copies strip trailing empty fields, so a line may have fewer than 40 fields: the missing ones are missing
values. A line needs at least the label and the 13 integer fields (14 fields) and at most 40; anything else,
a label other than 0/1, a non-integer I or a non-hex C makes a *bad row*: it is dropped, counted and its line
number reported (``strict`` raises ``InputFormatError`` naming ``file:line`` at the first one instead).

Output per row (FACTS.md, facebookresearch/dlrm):
    dense   I_j -> log(1 + max(x, 0)), float32; missing -> 0
    sparse  C_j hex -> integer -> id in table j:
            threshold mode (two passes, ``min_count``): first count every value over all rows of all splits;
                values seen >= min_count times get ids 1, 2, ... in order of descending count (ties by value),
                so id 1 is the most frequent; missing values and rarer values share id 0 ("unknown").
                table size = kept values + 1.
            modulo mode (one pass, ``max_ind_range`` = R): id = int(hex) % R, missing -> 0 (as the reference
                does, so missing shares id 0 with values divisible by R). table size = R.

Splits, by position of the line in the input (bad lines are dropped from the split they fall in):
    kaggle  all inputs concatenated, N lines, cut into 7 near-equal parts (the first N % 7 one line longer):
            parts 1-6 -> train; part 7 halved: its first ceil(n/2) lines -> test, the rest -> val.
    days    inputs named day_<N> (Criteo 1TB), sorted by N: all days but the last -> train; the last day
            halved the same way: first half -> test, second half -> val.

Lines are read with pyarrow's streaming CSV reader, block by block, each line as one string; fields are cut and
parsed with Arrow kernels and numpy over the whole block (no Python work per line, except to word the message
of the few bad rows that are reported).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from haloflow.data.criteo_loader import SPLITS, ClickParquetWriter
from haloflow.errors import ConfigError, InputFormatError
from haloflow.utils.atomic import atomic_directory, check_absent
from haloflow.utils.progress import progress_bar
from haloflow.utils.table import format_table

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = [
    "KAGGLE_TABLE_SIZES",
    "NUM_DENSE",
    "NUM_SPARSE",
    "NUM_FIELDS",
    "CriteoPreprocessConfig",
    "PreprocessSummary",
    "BadRow",
    "preprocess_criteo",
    "split_boundaries",
]

log = logging.getLogger(__name__)

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE  # 40
MIN_FIELDS = 1 + NUM_DENSE  # trailing categoricals may be stripped, the label and integers may not
# Rows of the 26 categorical tables of Criteo Kaggle (facebookresearch/dlrm, FACTS.md); 33,762,577 in all.
KAGGLE_TABLE_SIZES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
_DAY = re.compile(r"^day_(\d+)(\..*)?$")
_INT = re.compile(r"-?[0-9]{1,18}")
_HEX = re.compile(r"[0-9a-fA-F]{1,16}")
_HEX_LUT = np.full(256, 255, dtype=np.uint8)  # byte -> nibble, 255 = not a hex digit
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i


@dataclass(frozen=True, kw_only=True)
class CriteoPreprocessConfig:
    """Options of ``preprocess_criteo`` (the CLI's ``haloflow preprocess criteo``).

    Args:
        raw: input files (plain or compressed, e.g. ``.gz``), in order.
        out: output folder; written to a temporary folder beside it and renamed at the end.
        min_count: threshold mode: values seen fewer times map to id 0. Default (when neither mode is given) 1.
        max_ind_range: modulo mode: id = value % max_ind_range. Exclusive with ``min_count``.
        layout: "kaggle", "days" or "auto" (days when every input is named day_<N>).
        row_group_size: rows per Parquet row group (the loader's unit of shuffling).
        strict: raise at the first bad row instead of dropping it.
        max_reported: how many bad rows the summary lists with their line numbers.
        block_size: bytes per CSV block.
        overwrite: replace an existing ``out``.
    """

    raw: tuple[Path, ...]
    out: Path
    min_count: int | None = None
    max_ind_range: int | None = None
    layout: str = "auto"
    row_group_size: int = 65536  # ~4 MB of int32 ids per group: fine-grained shuffling, cheap metadata
    strict: bool = False
    max_reported: int = 10
    block_size: int = 16 << 20  # 16 MB of text, ~90k Criteo lines per block
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "raw", tuple(Path(p) for p in self.raw))
        object.__setattr__(self, "out", Path(self.out))
        if not self.raw:
            raise ConfigError("preprocess criteo: give at least one RAW input file")
        for p in self.raw:
            if not p.is_file():
                raise FileNotFoundError(f"RAW input {p} does not exist or is not a file")
        if self.min_count is not None and self.max_ind_range is not None:
            raise ConfigError("give either --frequency-threshold (min_count) or --max-ind-range, not both")
        if self.min_count is not None and self.min_count < 1:
            raise ConfigError(f"--frequency-threshold must be >= 1, got {self.min_count}")
        if self.max_ind_range is not None and self.max_ind_range < 1:
            raise ConfigError(f"--max-ind-range must be >= 1, got {self.max_ind_range}")
        if self.layout not in ("auto", "kaggle", "days"):
            raise ConfigError(f"--layout must be auto, kaggle or days, got {self.layout!r}")
        if self.layout == "days" and (self._day_numbers() is None or len(self.raw) < 2):
            raise ConfigError(f"--layout days needs >= 2 inputs named day_<N>, got {[p.name for p in self.raw]}")
        for name in ("row_group_size", "max_reported", "block_size"):
            if getattr(self, name) < (0 if name == "max_reported" else 1):
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")

    def _day_numbers(self) -> list[int] | None:
        matches = [_DAY.match(p.name) for p in self.raw]
        return None if not all(matches) else [int(m.group(1)) for m in matches]

    @property
    def mode(self) -> str:
        return "modulo" if self.max_ind_range is not None else "threshold"

    @property
    def threshold(self) -> int:
        return 1 if self.min_count is None else self.min_count

    def resolved_layout(self) -> str:
        if self.layout != "auto":
            return self.layout
        return "days" if self._day_numbers() is not None and len(self.raw) > 1 else "kaggle"

    def ordered_inputs(self) -> tuple[Path, ...]:
        """Inputs in split order: as given for kaggle, by day number for days."""
        if self.resolved_layout() == "kaggle":
            return self.raw
        return tuple(p for _, p in sorted(zip(self._day_numbers(), self.raw)))


@dataclass(frozen=True)
class BadRow:
    path: str
    line: int  # 1-based within its file
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class PreprocessSummary:
    """What ``preprocess_criteo`` did; ``table()`` is the few lines the CLI prints."""

    out: Path
    layout: str
    mode: str
    lines: int
    rows: dict[str, int]
    bad_rows: int
    first_bad: list[BadRow]
    table_sizes: list[int]
    seconds: float
    metadata: dict = field(repr=False, default_factory=dict)

    def table(self) -> str:
        lines = [format_table(["split", "rows"], [[s, self.rows[s]] for s in SPLITS]),
                 f"{self.bad_rows:,} bad rows dropped, of {self.lines:,} lines"]
        lines += [f"  {b}" for b in self.first_bad]
        big = int(np.argmax(self.table_sizes))
        lines.append(
            f"{len(self.table_sizes)} tables, {sum(self.table_sizes):,} rows in all (largest C{big + 1}: "
            f"{self.table_sizes[big]:,}); mode {self.mode}, layout {self.layout}; {self.seconds:.1f} s -> {self.out}"
        )
        return "\n".join(lines)


def split_boundaries(layout: str, line_counts: list[int]) -> tuple[int, int, int]:
    """Global line indices ``(train_end, test_end, total)``: train < train_end <= test < test_end <= val < total."""
    total = sum(line_counts)
    if layout == "kaggle":
        q, r = divmod(total, 7)
        part = [q + 1 if k < r else q for k in range(7)]
        train_end = sum(part[:6])
        last = part[6]
    else:
        train_end = sum(line_counts[:-1])
        last = line_counts[-1]
    return train_end, train_end + math.ceil(last / 2), total


# --------------------------------------------------------------------------- reading and parsing blocks


def _read_blocks(path: Path, block_size: int, skipped: list[tuple[int, str]]) -> Iterator[tuple[pa.Array, int]]:
    """Yield ``(lines, bytes)`` per block; each line is one string. Lines the reader cannot take as one
    column (they contain the byte 0x1f, used as the never-seen delimiter) go to ``skipped`` as (number, text).
    """

    def on_invalid(row) -> str:
        skipped.append((row.number, row.text))
        return "skip"

    reader = pacsv.open_csv(
        path,
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
class _Parsed:
    """One block: labels int8 (n,), dense float32 (n, 13), raw categorical values uint64 (n, 26), missing
    bool (n, 26), ok bool (n,) (False for a bad row)."""

    labels: np.ndarray
    dense: np.ndarray
    values: np.ndarray
    missing: np.ndarray
    ok: np.ndarray


def _parse_block(lines: pa.Array) -> _Parsed:
    n = len(lines)
    parts = pc.split_pattern(lines, "\t")  # list<string> (n,)
    nf = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    offs = parts.offsets.to_numpy().astype(np.int64)  # (n+1,)
    flat = parts.flatten()
    offs -= offs[0]
    ok = (nf >= MIN_FIELDS) & (nf <= NUM_FIELDS)

    def column(j: int) -> pa.Array:
        present = ok & (j < nf)
        taken = pc.take(flat, pa.array(np.where(present, offs[:-1] + j, 0)))
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
            good = pc.match_substring_regex(filled, r"^-?[0-9]{1,18}$").to_numpy(zero_copy_only=False)
            ok &= good
            ints = pc.cast(pc.if_else(pa.array(good), filled, "0"), pa.int64()).to_numpy()
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
    return _Parsed(labels, dense, values, missing, ok)


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


def _explain(text: str) -> str:
    """Why one line is bad, in words (called for the few reported lines only)."""
    if "\x1f" in text:
        return "contains the control byte 0x1f, which a Criteo TSV line never holds"
    fields = text.split("\t")
    if not MIN_FIELDS <= len(fields) <= NUM_FIELDS:
        return (
            f"expected {NUM_FIELDS} tab-separated fields (at least {MIN_FIELDS} when trailing empty ones are "
            f"left out), found {len(fields)}"
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


# --------------------------------------------------------------------------- the two passes


class _ValueCounter:
    """Occurrences of uint64 values, merged from per-block ``np.unique`` results (amortised O(n log n))."""

    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.uint64)
        self.counts = np.empty(0, dtype=np.int64)
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending = 0

    def add(self, values: np.ndarray) -> None:
        keys, counts = np.unique(values, return_counts=True)
        self._parts.append((keys, counts))
        self._pending += len(keys)
        if self._pending > 2 * len(self.keys) + (1 << 20):
            self.merge()

    def merge(self) -> None:
        if not self._parts:
            return
        keys = np.concatenate([self.keys, *(k for k, _ in self._parts)])
        counts = np.concatenate([self.counts, *(c for _, c in self._parts)])
        self.keys, inverse = np.unique(keys, return_inverse=True)
        self.counts = np.bincount(inverse, weights=counts, minlength=len(self.keys)).astype(np.int64)
        self._parts, self._pending = [], 0


@dataclass
class _IdMap:
    """Value -> id for one table: ``sorted_keys`` ascending with their ``ids``; unknown -> 0."""

    sorted_keys: np.ndarray
    ids: np.ndarray

    @staticmethod
    def from_counts(counter: _ValueCounter, min_count: int) -> _IdMap:
        counter.merge()
        keep = counter.counts >= min_count
        keys, counts = counter.keys[keep], counter.counts[keep]  # keys ascending
        rank = np.lexsort((keys, -counts))  # most frequent first, ties by value
        ids = np.empty(len(keys), dtype=np.int64)
        ids[rank] = np.arange(1, len(keys) + 1)
        return _IdMap(keys, ids)

    @property
    def size(self) -> int:
        return len(self.sorted_keys) + 1

    def lookup(self, values: np.ndarray, missing: np.ndarray) -> np.ndarray:
        if len(self.sorted_keys) == 0:
            return np.zeros(len(values), dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.sorted_keys, values), len(self.sorted_keys) - 1)
        found = (self.sorted_keys[pos] == values) & ~missing
        return np.where(found, self.ids[pos], 0)


class _Pass:
    """One pass over every input: yields parsed blocks with their global line numbers, and deals with bad rows
    (counted; the first ``max_reported`` described; ``strict`` raises at the first)."""

    def __init__(self, config: CriteoPreprocessConfig, bar: tqdm):
        self.config, self.bar = config, bar
        self.line_counts: list[int] = []
        self.bad = 0
        self.first_bad: list[BadRow] = []

    def blocks(self) -> Iterator[tuple[_Parsed, np.ndarray]]:
        """Yield ``(parsed, global_line_index (n,))`` for the good and bad rows of each block."""
        base = 0
        for path in self.config.ordered_inputs():
            skipped: list[tuple[int, str]] = []
            next_line = 1  # 1-based line number in this file of the next row the reader yields
            handled = 0
            for lines, nbytes in _read_blocks(path, self.config.block_size, skipped):
                n = len(lines)
                numbers = np.arange(next_line, next_line + n, dtype=np.int64)
                for s in sorted(num for num, _ in skipped):  # skipped lines shift the rows after them
                    numbers[numbers >= s] += 1
                parsed = _parse_block(lines) if n else None
                new_skips = sorted(skipped[handled:])
                handled = len(skipped)
                bad_idx = np.flatnonzero(~parsed.ok) if parsed is not None else np.empty(0, dtype=np.int64)
                self._report(path, [(int(numbers[i]), lambda i=i: lines[i].as_py()) for i in bad_idx]
                             + [(num, lambda t=text: t) for num, text in new_skips])  # fmt: skip
                if n:
                    next_line = int(numbers[-1]) + 1
                    yield parsed, base + numbers - 1
                self.bar.update(nbytes)
            file_lines = max(next_line - 1, max((num for num, _ in skipped), default=0))
            self.line_counts.append(file_lines)
            base += file_lines

    def _report(self, path: Path, bad: list[tuple[int, Callable[[], str]]]) -> None:
        if not bad:
            return
        bad.sort(key=lambda x: x[0])
        if self.config.strict:
            line, text = bad[0]
            raise InputFormatError(path, _explain(text()) + " (drop --strict to skip bad rows)", line=line)
        self.bad += len(bad)
        for line, text in bad[: max(0, self.config.max_reported - len(self.first_bad))]:
            self.first_bad.append(BadRow(str(path), line, _explain(text())))


def preprocess_criteo(config: CriteoPreprocessConfig) -> PreprocessSummary:
    """Turn raw Criteo files into ``config.out`` (see the module docstring); returns the summary."""
    t0 = time.perf_counter()
    check_absent(config.out, config.overwrite)  # now, not after the first pass over the inputs
    inputs = config.ordered_inputs()
    layout = config.resolved_layout()
    compressed = any(p.suffix in (".gz", ".bz2", ".xz", ".zst", ".lz4") for p in inputs)
    passes = 2 if config.mode == "threshold" else 1
    total = None if compressed else passes * sum(p.stat().st_size for p in inputs)
    with progress_bar(total=total, unit="B", unit_scale=True, desc="preprocess criteo") as bar:
        if config.mode == "threshold":
            counters = [_ValueCounter() for _ in range(NUM_SPARSE)]
            first = _Pass(config, bar)
            for parsed, _ in first.blocks():
                for j in range(NUM_SPARSE):
                    counters[j].add(parsed.values[parsed.ok & ~parsed.missing[:, j], j])
            maps = [_IdMap.from_counts(c, config.threshold) for c in counters]
            table_sizes = [m.size for m in maps]
            line_counts = first.line_counts
        else:
            maps = None
            table_sizes = [config.max_ind_range] * NUM_SPARSE
            line_counts = [_count_lines(p) for p in inputs]
        train_end, test_end, total_lines = split_boundaries(layout, line_counts)

        with atomic_directory(config.out, overwrite=config.overwrite) as tmp:
            writer = ClickParquetWriter(
                tmp, table_sizes=table_sizes, num_dense=NUM_DENSE, row_group_size=config.row_group_size
            )
            second = _Pass(config, bar)
            for parsed, gline in second.blocks():
                if maps is not None:
                    cols = [maps[j].lookup(parsed.values[:, j], parsed.missing[:, j]) for j in range(NUM_SPARSE)]
                    ids = np.stack(cols, axis=1)  # (n, 26)
                else:  # modulo: missing values were parsed as 0, so they land on id 0
                    ids = (parsed.values % np.uint64(config.max_ind_range)).astype(np.int64)  # (n, 26)
                split_of = np.searchsorted(np.array([train_end, test_end]), gline, side="right")  # 0 train 1 test 2 val
                for s, name in ((0, "train"), (1, "test"), (2, "val")):
                    keep = parsed.ok & (split_of == s)
                    if keep.any():
                        writer.append(name, parsed.labels[keep], parsed.dense[keep], ids[keep])
            options = {
                "mode": config.mode,
                "min_count": config.threshold if config.mode == "threshold" else None,
                "max_ind_range": config.max_ind_range,
                "layout": layout,
                "row_group_size": config.row_group_size,
                "strict": config.strict,
            }
            extra = {
                "sources": [{"file": str(p), "lines": c} for p, c in zip(inputs, line_counts)],
                "split_lines": {"train": [0, train_end], "test": [train_end, test_end], "val": [test_end, total_lines]},
                "bad_rows": {"count": second.bad, "first": [vars(b) for b in second.first_bad]},
                "id_convention": (
                    "threshold: 0 = missing or seen fewer than min_count times; 1.. = kept values by descending count"
                    if config.mode == "threshold"
                    else "modulo: id = int(hex) % max_ind_range; missing -> 0"
                ),
                "dense_transform": "log(1 + max(x, 0)); missing -> 0",
            }
            meta = writer.close(options, extra)
    summary = PreprocessSummary(
        out=config.out, layout=layout, mode=config.mode, lines=total_lines, rows=dict(writer.rows),
        bad_rows=second.bad, first_bad=second.first_bad, table_sizes=table_sizes,
        seconds=time.perf_counter() - t0, metadata=meta,
    )  # fmt: skip
    log.info("preprocessed %d lines into %s (%d bad rows)", total_lines, config.out, second.bad)
    return summary


def _count_lines(path: Path) -> int:
    """Lines in a (possibly compressed) file, read in 16 MB chunks: one C-speed pass, no parsing."""
    count, last = 0, b"\n"
    with pa.input_stream(str(path), compression="detect") as f:
        while chunk := f.read(16 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")
