"""Parse Criteo click logs (Kaggle ``train.txt``, Criteo 1TB ``day_N``) into the Parquet layout of ``criteo_loader``.

A raw line is tab-separated, 40 fields; an empty field is a missing value::

    label  I1 .. I13            C1 .. C26
    0      1  5  ''  ... 2      68fd1e64  80e26c9b  ''  ...  9727dd16
    |      13 integers          26 categoricals, hex strings (8 digits in the real data)

Comma-separated copies with a header line (``label,I1,...,C26``, maybe led by an ``Id`` column) are read too; each
file's format is sniffed from its first line (``criteo_text.sniff_format``). The header is not a data line.

Some copies strip trailing empty fields, so a line may have fewer than 40 fields: the missing ones are missing
values. A line needs at least the label and the 13 integer fields (14 fields) and at most 40; anything else,
a label other than 0/1, a non-integer I or a non-hex C makes a *bad row*: it is dropped, counted and its line
number reported (``strict`` raises ``InputFormatError`` naming ``file:line`` at the first one instead). A file
whose every line is bad (a graph, a CSV of something else) is an ``InputFormatError``, as is an empty, binary,
truncated or corrupt file, and the same file given twice.

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
of the few bad rows that are reported). Reading and parsing live in ``criteo_text``; this module makes the passes.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from haloflow.data.criteo_loader import SPLITS, ClickParquetWriter, is_click_folder
from haloflow.data.criteo_text import (
    NUM_DENSE,
    NUM_FIELDS,
    NUM_SPARSE,
    READ_ERRORS,
    CriteoTextFormat,
    ParsedBlock,
    count_lines,
    explain_bad_line,
    parse_block,
    read_line_blocks,
    sniff_format,
    unreadable,
)
from haloflow.data.paths import check_output_parent
from haloflow.errors import ConfigError, InputFormatError
from haloflow.utils.atomic import atomic_directory, check_replaceable
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

# Rows of the 26 categorical tables of Criteo Kaggle (facebookresearch/dlrm, FACTS.md); 33,762,577 in all.
KAGGLE_TABLE_SIZES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
_DAY = re.compile(r"^day_(\d+)(\..*)?$")
_WHAT = "click-log folder"  # what `--overwrite` may replace: a folder of ours (its metadata.json)


@dataclass(frozen=True, kw_only=True)
class CriteoPreprocessConfig:
    """Options of ``preprocess_criteo`` (the CLI's ``haloflow preprocess criteo``).

    Args:
        raw: input files (plain or compressed: ``.gz``, ``.bz2``, ``.xz``, ``.zst``), in order; each once.
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
        seen: dict[tuple[int, int], int] = {}
        for k, p in enumerate(self.raw):
            if not p.is_file():
                raise FileNotFoundError(f"RAW input {p} does not exist or is not a file")
            st = os.stat(p)
            first = seen.setdefault((st.st_dev, st.st_ino), k)  # the same file under two names counts too
            if first != k:
                raise ConfigError(f"RAW input {p} is given twice (inputs {first + 1} and {k + 1}"
                                  f"{', as ' + str(self.raw[first]) if self.raw[first] != p else ''}): expected each "
                                  f"file once, or its rows would be counted and split twice")
        check_output_parent(self.out)
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
    (counted; the first ``max_reported`` described; ``strict`` raises at the first; a file with no good row
    raises)."""

    def __init__(self, config: CriteoPreprocessConfig, bar: tqdm, formats: dict[Path, CriteoTextFormat]):
        self.config, self.bar, self.formats = config, bar, formats
        self.line_counts: list[int] = []  # data lines per input (a header line is not one)
        self.bad = 0
        self.first_bad: list[BadRow] = []
        self._file_first_bad: BadRow | None = None

    def blocks(self) -> Iterator[tuple[ParsedBlock, np.ndarray]]:
        """Yield ``(parsed, global_line_index (n,))`` for the good and bad rows of each block."""
        base = 0
        for path in self.config.ordered_inputs():
            fmt = self.formats[path]
            skipped: list[tuple[int, str]] = []
            next_line = 1  # 1-based line number in this file of the next row the reader yields
            handled = good = 0
            header_pending = fmt.header
            self._file_first_bad = None
            try:
                for lines, nbytes in read_line_blocks(path, self.config.block_size, skipped):
                    if header_pending and len(lines):  # the header is the file's first row: not data
                        lines, next_line, header_pending = lines.slice(1), 2, False
                    n = len(lines)
                    numbers = np.arange(next_line, next_line + n, dtype=np.int64)
                    for s in sorted(num for num, _ in skipped):  # skipped lines shift the rows after them
                        numbers[numbers >= s] += 1
                    parsed = parse_block(lines, fmt) if n else None
                    new_skips = sorted(skipped[handled:])
                    handled = len(skipped)
                    bad_idx = np.flatnonzero(~parsed.ok) if parsed is not None else np.empty(0, dtype=np.int64)
                    self._report(path, fmt, [(int(numbers[i]), lambda i=i: lines[i].as_py()) for i in bad_idx]
                                 + [(num, lambda t=text: t) for num, text in new_skips])  # fmt: skip
                    if n:
                        good += n - bad_idx.shape[0]
                        next_line = int(numbers[-1]) + 1
                        yield parsed, base + numbers - 1 - fmt.header  # data line index: the header is not one
                    self.bar.update(nbytes)
            except READ_ERRORS as err:  # a cut-off .gz, bytes Arrow cannot take as text
                raise unreadable(path, err, next_line - 1) from None
            file_lines = max(next_line - 1, max((num for num, _ in skipped), default=0)) - fmt.header
            self._check_some_good(path, fmt, file_lines, good)
            self.line_counts.append(file_lines)
            base += file_lines

    def _report(self, path: Path, fmt: CriteoTextFormat, bad: list[tuple[int, Callable[[], str]]]) -> None:
        if not bad:
            return
        bad.sort(key=lambda x: x[0])
        if self.config.strict:
            line, text = bad[0]
            raise InputFormatError(path, explain_bad_line(text(), fmt) + " (drop --strict to skip bad rows)",
                                   line=line)
        if self._file_first_bad is None:
            self._file_first_bad = BadRow(str(path), bad[0][0], explain_bad_line(bad[0][1](), fmt))
        self.bad += len(bad)
        for line, text in bad[: max(0, self.config.max_reported - len(self.first_bad))]:
            self.first_bad.append(BadRow(str(path), line, explain_bad_line(text(), fmt)))

    def _check_some_good(self, path: Path, fmt: CriteoTextFormat, lines: int, good: int) -> None:
        """A file that adds no row is a mistake (a graph, another CSV), not a data set: say so, and why."""
        if lines == 0:
            raise InputFormatError(path, "a header line and no data lines: expected Criteo lines after it")
        if good == 0:
            first = self._file_first_bad
            raise InputFormatError(
                path, f"all {lines:,} lines were rejected, so the file adds no rows (read as {fmt.describe()}); "
                f"the first, line {first.line}: {first.reason}"
            )


def preprocess_criteo(config: CriteoPreprocessConfig) -> PreprocessSummary:
    """Turn raw Criteo files into ``config.out`` (see the module docstring); returns the summary."""
    t0 = time.perf_counter()
    check_replaceable(config.out, config.overwrite, is_click_folder, _WHAT)  # now, not after the first pass
    inputs = config.ordered_inputs()
    formats = {p: sniff_format(p) for p in inputs}  # an empty or binary file fails here, before any pass
    for p, fmt in formats.items():
        log.info("%s: %s", p, fmt.describe())
    layout = config.resolved_layout()
    compressed = any(p.suffix in (".gz", ".bz2", ".xz", ".zst", ".lz4") for p in inputs)
    passes = 2 if config.mode == "threshold" else 1
    total = None if compressed else passes * sum(p.stat().st_size for p in inputs)
    with progress_bar(total=total, unit="B", unit_scale=True, desc="preprocess criteo") as bar:
        if config.mode == "threshold":
            counters = [_ValueCounter() for _ in range(NUM_SPARSE)]
            first = _Pass(config, bar, formats)
            for parsed, _ in first.blocks():
                for j in range(NUM_SPARSE):
                    counters[j].add(parsed.values[parsed.ok & ~parsed.missing[:, j], j])
            maps = [_IdMap.from_counts(c, config.threshold) for c in counters]
            table_sizes = [m.size for m in maps]
            line_counts = first.line_counts
        else:
            maps = None
            table_sizes = [config.max_ind_range] * NUM_SPARSE
            line_counts = [count_lines(p) - formats[p].header for p in inputs]
        train_end, test_end, total_lines = split_boundaries(layout, line_counts)

        with atomic_directory(config.out, overwrite=config.overwrite, ours=is_click_folder, what=_WHAT) as tmp:
            writer = ClickParquetWriter(
                tmp, table_sizes=table_sizes, num_dense=NUM_DENSE, row_group_size=config.row_group_size
            )
            second = _Pass(config, bar, formats)
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
