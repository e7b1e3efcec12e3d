"""The Parquet layout of preprocessed click logs, its writer, and a streaming batch loader.

Written by ``haloflow preprocess criteo`` and by the synthetic generator (``clicks.py``)::

    DIR/
      metadata.json     {"format": "haloflow-clicks", "version": 1, "num_dense": 13, "table_sizes": [...],
                         "splits": {"train": {"file": "train.parquet", "rows": n, "row_groups": g}, ...},
                         "options": {...how it was made...}, ...}
      train.parquet     row groups of ``row_group_size`` rows (the last one may be shorter)
      val.parquet         columns: label int8 | I1 .. I13 float32 | C1 .. C26 int32/int64 ids
      test.parquet        (a multi-hot feature is a list<int64> column: one bag of ids per row)
      id_counts.npz     "C1" .. "C26": int64 (table_size,), how often each id occurs in the train split

Ids of table t lie in ``[0, table_sizes[t])``. The loader streams ``ClickBatch`` (dense (B, 13), JaggedBatch,
labels (B,)) from one split, reading row groups on a background thread into a bounded queue.

Everything a folder says is checked before it is trusted, by the loader that every trainer uses (one process or
K ranks alike): metadata.json's fields and types; that each split file is Parquet with the recorded rows, row
groups and columns; and that every id lies inside its table -- from the row groups' min/max statistics when the
loader opens (a ``table_sizes`` edited smaller is an error before the first step), and again on every row group
read. A failure is a ``PartitionFormatError`` naming the file, the column and what was expected.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from haloflow.data.jagged import ClickBatch, JaggedBatch
from haloflow.errors import ConfigError, PartitionFormatError
from haloflow.utils.checksum import crc32_file

__all__ = [
    "SPLITS",
    "FORMAT_NAME",
    "dense_names",
    "sparse_names",
    "ClickParquetWriter",
    "load_metadata",
    "is_click_folder",
    "verify_file",
    "ClickLoaderConfig",
    "ClickLoader",
]

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
FORMAT_NAME = "haloflow-clicks"
FORMAT_VERSION = 1


def dense_names(n: int) -> list[str]:
    return [f"I{j + 1}" for j in range(n)]


def sparse_names(n: int) -> list[str]:
    return [f"C{j + 1}" for j in range(n)]


class ClickParquetWriter:
    """Appends rows to the split files in ``folder`` and cuts them into row groups of ``row_group_size``.

    ``append`` takes labels int (n,), dense float32 (n, num_dense) and sparse ids either as int64 (n, T) (one id
    per feature) or as a JaggedBatch over the n rows (multi-hot). ``close`` writes the last short row groups,
    ``id_counts.npz`` and ``metadata.json`` and returns the metadata.
    """

    def __init__(self, folder: Path, *, table_sizes: Sequence[int], num_dense: int, row_group_size: int,
                 multi_hot: bool = False):  # fmt: skip
        if row_group_size < 1:
            raise ConfigError(f"row_group_size must be >= 1, got {row_group_size}")
        self.folder = Path(folder)
        self.table_sizes = [int(s) for s in table_sizes]
        self.num_dense = num_dense
        self.row_group_size = row_group_size
        self.multi_hot = multi_hot
        # int32 ids halve the files unless a table is too large for them.
        self.id_type = pa.int32() if max(self.table_sizes) <= np.iinfo(np.int32).max else pa.int64()
        id_field = pa.list_(pa.int64()) if multi_hot else self.id_type
        self.schema = pa.schema(
            [("label", pa.int8())]
            + [(n, pa.float32()) for n in dense_names(num_dense)]
            + [(n, id_field) for n in sparse_names(len(self.table_sizes))]
        )
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._pending: dict[str, list[pa.Table]] = {s: [] for s in SPLITS}
        self._pending_rows = dict.fromkeys(SPLITS, 0)
        self.rows = dict.fromkeys(SPLITS, 0)
        self.row_groups = dict.fromkeys(SPLITS, 0)
        _check_counts_fit(self.table_sizes)
        self.id_counts = [np.zeros(n, dtype=np.int64) for n in self.table_sizes]

    def append(self, split: str, labels: np.ndarray, dense: np.ndarray, sparse: np.ndarray | JaggedBatch) -> None:
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        n = len(labels)
        if n == 0:
            return
        cols: list[pa.Array] = [pa.array(np.asarray(labels, dtype=np.int8))]
        cols += [pa.array(np.ascontiguousarray(dense[:, j], dtype=np.float32)) for j in range(self.num_dense)]
        cols += self._sparse_columns(split, sparse)
        self._pending[split].append(pa.Table.from_arrays(cols, schema=self.schema))
        self._pending_rows[split] += n
        if self._pending_rows[split] >= self.row_group_size:
            self._flush(split, final=False)

    def _sparse_columns(self, split: str, sparse: np.ndarray | JaggedBatch) -> list[pa.Array]:
        T = len(self.table_sizes)
        if isinstance(sparse, JaggedBatch):
            if not self.multi_hot:
                raise ConfigError("this writer stores one id per feature; pass ids (n, T) or multi_hot=True")
            offsets = sparse.bag_offsets().numpy()  # (T, n+1)
            bounds = sparse.feature_offsets().tolist()
            values = sparse.values.numpy()
            cols = []
            for t in range(T):
                vals = values[bounds[t] : bounds[t + 1]]
                if split == "train":
                    self._count(t, vals)
                cols.append(pa.ListArray.from_arrays(pa.array(offsets[t].astype(np.int32)), pa.array(vals)))
            return cols
        ids = np.asarray(sparse)
        if ids.ndim != 2 or ids.shape[1] != T:
            raise ConfigError(f"sparse ids must have shape (n, {T}), got {ids.shape}")
        if split == "train":
            for t in range(T):
                self._count(t, ids[:, t])
        np_type = np.int32 if self.id_type == pa.int32() else np.int64
        if self.multi_hot:
            one = np.arange(len(ids) + 1, dtype=np.int32)
            return [pa.ListArray.from_arrays(pa.array(one), pa.array(ids[:, t].astype(np.int64))) for t in range(T)]
        return [pa.array(ids[:, t].astype(np_type)) for t in range(T)]

    def _count(self, t: int, ids: np.ndarray) -> None:
        # bincount costs O(table rows) per call, add.at O(ids): pick the cheaper for this append.
        if len(ids) * 4 < self.table_sizes[t]:
            np.add.at(self.id_counts[t], ids, 1)
        else:
            self.id_counts[t] += np.bincount(ids, minlength=self.table_sizes[t])

    def _flush(self, split: str, final: bool) -> None:
        if not self._pending[split]:
            return
        table = pa.concat_tables(self._pending[split]).combine_chunks()
        full = (table.num_rows // self.row_group_size) * self.row_group_size
        cut = table.num_rows if final else full
        if cut:
            writer = self._writers.get(split)
            if writer is None:
                writer = self._writers[split] = pq.ParquetWriter(self.folder / f"{split}.parquet", self.schema)
            for start in range(0, cut, self.row_group_size):
                part = table.slice(start, min(self.row_group_size, cut - start))
                writer.write_table(part, row_group_size=self.row_group_size)
                self.row_groups[split] += 1
                self.rows[split] += part.num_rows
        rest = table.slice(cut)
        self._pending[split] = [rest] if rest.num_rows else []
        self._pending_rows[split] = rest.num_rows

    def close(self, options: dict, extra: dict | None = None) -> dict:
        for split in SPLITS:
            self._flush(split, final=True)
            if split not in self._writers:  # an empty split still gets a (row-group-less) file
                self._writers[split] = pq.ParquetWriter(self.folder / f"{split}.parquet", self.schema)
            self._writers[split].close()
        T = len(self.table_sizes)
        np.savez(self.folder / "id_counts.npz", **dict(zip(sparse_names(T), self.id_counts)))
        meta = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "num_dense": self.num_dense,
            "num_sparse": T,
            "table_sizes": self.table_sizes,
            "multi_hot": self.multi_hot,
            "row_group_size": self.row_group_size,
            "splits": {
                s: {"file": f"{s}.parquet", "rows": self.rows[s], "row_groups": self.row_groups[s]} for s in SPLITS
            },
            "options": options,
            # size and CRC-32 of every file, checked before a reader parses it: Arrow's Parquet reader trusts the
            # footer it decodes, and a flipped byte there can abort the process instead of raising
            "files": {p.name: {"size": p.stat().st_size, "crc32": crc32_file(p)}
                      for p in [*(self.folder / f"{s}.parquet" for s in SPLITS), self.folder / "id_counts.npz"]},
            **(extra or {}),
        }
        (self.folder / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
        return meta


def _check_counts_fit(table_sizes: Sequence[int]) -> None:
    """The writer counts every id of the train split (int64 per table row): refuse sizes that cannot fit."""
    from haloflow.utils.memory import available_bytes, format_bytes

    need, have = 8 * sum(table_sizes), available_bytes()
    if have is not None and need > have:
        raise ConfigError(f"tables of {sum(table_sizes):,} rows in all need {format_bytes(need)} for their id counts, "
                          f"but this machine has {format_bytes(have)} free: expected smaller tables (a smaller scale, "
                          "or max_rows)")


def is_click_folder(folder: Path) -> bool:
    """Does ``folder`` hold our metadata.json (``"format": "haloflow-clicks"``)? What ``--overwrite`` of
    ``haloflow preprocess`` may replace; any other folder is left alone."""
    try:
        meta = json.loads((Path(folder) / "metadata.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT_NAME


def load_metadata(folder: Path | str) -> dict:
    """Read and check ``folder/metadata.json``; a missing, foreign or malformed one raises PartitionFormatError."""
    path = Path(folder) / "metadata.json"
    if not path.is_file():
        raise PartitionFormatError(f"{folder}: no metadata.json; expected a folder written by `haloflow preprocess`")
    try:
        meta = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PartitionFormatError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise PartitionFormatError(f"{path}: expected a JSON object, found {type(meta).__name__}")
    if meta.get("format") != FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
        raise PartitionFormatError(
            f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, "
            f"expected {FORMAT_NAME!r} version {FORMAT_VERSION}"
        )
    _check_metadata(path, meta)
    return meta


def verify_file(folder: Path | str, meta: dict, name: str) -> Path:
    """``folder/name`` after checking its size and CRC-32 against metadata.json's ``files`` (folders written before
    the checksums were recorded are read unchecked). Raises PartitionFormatError naming the file."""
    path = Path(folder) / name
    if not path.is_file():
        raise PartitionFormatError(f"{path}: missing; the folder {folder} is incomplete")
    info = meta.get("files", {}).get(name)
    if info is None:
        return path
    size = path.stat().st_size
    if size != info["size"]:
        raise PartitionFormatError(f"{path} is truncated or altered: {size} bytes, expected {info['size']}")
    crc = crc32_file(path)
    if crc != info["crc32"]:
        raise PartitionFormatError(f"{path} is corrupt: CRC-32 {crc:#010x}, expected {info['crc32']:#010x}")
    return path


def _is_count(v, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _check_metadata(path: Path, meta: dict) -> None:
    """The fields the loader and the planner index with: types and ranges."""
    sizes = meta.get("table_sizes")
    if not isinstance(sizes, list) or not sizes or not all(_is_count(n, 1) for n in sizes):
        raise PartitionFormatError(f"{path}: table_sizes is {str(sizes)[:80]}, expected a non-empty list of "
                                   "integers >= 1 (rows of each table)")
    if not _is_count(meta.get("num_dense")):
        raise PartitionFormatError(f"{path}: num_dense is {meta.get('num_dense')!r}, expected an integer >= 0")
    if meta.get("num_sparse", len(sizes)) != len(sizes):
        raise PartitionFormatError(f"{path}: num_sparse is {meta.get('num_sparse')!r} but table_sizes lists "
                                   f"{len(sizes)} tables: expected them equal")
    meta.setdefault("num_sparse", len(sizes))
    splits = meta.get("splits")
    for split in SPLITS:
        entry = splits.get(split) if isinstance(splits, dict) else None
        if not (isinstance(entry, dict) and isinstance(entry.get("file"), str) and _is_count(entry.get("rows"))
                and _is_count(entry.get("row_groups"))):
            raise PartitionFormatError(f"{path}: splits.{split} is {str(entry)[:80]}, expected "
                                       "{\"file\": NAME, \"rows\": n >= 0, \"row_groups\": g >= 0}")
        if Path(entry["file"]).name != entry["file"]:
            raise PartitionFormatError(f"{path}: splits.{split}.file is {entry['file']!r}, expected a file name "
                                       "inside the folder")
    files = meta.get("files", {})
    if not isinstance(files, dict) or not all(
            isinstance(f, dict) and _is_count(f.get("size")) and _is_count(f.get("crc32")) for f in files.values()):
        raise PartitionFormatError(f"{path}: files is {str(files)[:80]}, expected {{NAME: {{\"size\": bytes, "
                                   "\"crc32\": int}}}")


@dataclass(frozen=True, kw_only=True)
class ClickLoaderConfig:
    """How to stream one split.

    Args:
        batch_size: samples per batch; batches run across row-group boundaries.
        split: "train", "val" or "test".
        shuffle: visit the row groups in a random order drawn from ``seed`` (+ epoch); rows inside a group
            keep their order.
        seed: seed of that order.
        drop_last: drop a last batch shorter than ``batch_size``.
        prefetch: batches the background thread may prepare ahead (the bound of its queue).
    """

    batch_size: int
    split: str = "train"
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    prefetch: int = 8  # a few batches hide the Parquet decode of the next row group

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.split not in SPLITS:
            raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if self.prefetch < 1:
            raise ConfigError(f"prefetch must be >= 1, got {self.prefetch}")


class _Rows:
    """Rows of one row group or a piece of one: dense (n, F), labels (n,), ids (n, T) or a JaggedBatch."""

    def __init__(self, dense: np.ndarray, labels: np.ndarray, sparse: np.ndarray | JaggedBatch):
        self.dense, self.labels, self.sparse = dense, labels, sparse

    def __len__(self) -> int:
        return len(self.labels)

    def split(self, sizes: list[int]) -> list[_Rows]:
        cuts = np.cumsum(sizes)[:-1]
        dense, labels = np.split(self.dense, cuts), np.split(self.labels, cuts)
        if isinstance(self.sparse, JaggedBatch):
            sparse = self.sparse.split_batch(sizes)
        else:
            sparse = np.split(self.sparse, cuts)
        return [_Rows(d, y, s) for d, y, s in zip(dense, labels, sparse)]

    @staticmethod
    def cat(parts: list[_Rows]) -> _Rows:
        if len(parts) == 1:
            return parts[0]
        dense = np.concatenate([p.dense for p in parts])
        labels = np.concatenate([p.labels for p in parts])
        if isinstance(parts[0].sparse, JaggedBatch):
            sparse = JaggedBatch.cat([p.sparse for p in parts])
        else:
            sparse = np.concatenate([p.sparse for p in parts])
        return _Rows(dense, labels, sparse)

    def batch(self) -> ClickBatch:
        sparse = self.sparse
        if not isinstance(sparse, JaggedBatch):
            sparse = JaggedBatch.from_dense(torch.from_numpy(np.ascontiguousarray(sparse, dtype=np.int64)))
        dense = torch.from_numpy(np.ascontiguousarray(self.dense, dtype=np.float32))  # (B, F)
        labels = torch.from_numpy(self.labels.astype(np.float32))  # (B,)
        return ClickBatch(dense, sparse, labels)


class ClickLoader:
    """Iterate ``ClickBatch`` over one split of a preprocessed folder.

    A background thread decodes row groups and cuts batches into a queue of ``prefetch`` batches, so Parquet
    decoding overlaps the training step. Each ``iter()`` is one epoch; ``set_epoch(e)`` changes the shuffle.
    """

    def __init__(self, folder: Path | str, config: ClickLoaderConfig):
        self.folder = Path(folder)
        self.config = config
        self.meta = load_metadata(folder)
        self.path = verify_file(self.folder, self.meta, self.meta["splits"][config.split]["file"])
        self.num_dense = int(self.meta["num_dense"])
        self.num_sparse = int(self.meta["num_sparse"])
        self.table_sizes = tuple(self.meta["table_sizes"])
        self.epoch = 0
        self._check_file()

    def _open(self) -> pq.ParquetFile:
        try:
            return pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as err:
            raise PartitionFormatError(f"{self.path}: not a readable Parquet file, truncated or corrupt "
                                       f"({type(err).__name__}: {err}); preprocess the data again") from None

    def _check_file(self) -> None:
        """The split file against metadata.json: rows, row groups, columns, and ids inside their tables (from the
        row groups' min/max statistics: metadata only, no data read)."""
        pf = self._open()
        md, entry = pf.metadata, self.meta["splits"][self.config.split]
        if md.num_rows != entry["rows"] or md.num_row_groups != entry["row_groups"]:
            raise PartitionFormatError(f"{self.path}: {md.num_rows} rows in {md.num_row_groups} row groups, but "
                                       f"metadata.json says {entry['rows']} in {entry['row_groups']}")
        have = pf.schema_arrow.names
        if len(have) != 1 + self.num_dense + self.num_sparse:  # before naming num_dense columns (it may be 10**12)
            raise PartitionFormatError(f"{self.path}: {len(have)} columns, but metadata.json's num_dense = "
                                       f"{self.num_dense} and {self.num_sparse} tables need 1 + {self.num_dense} + "
                                       f"{self.num_sparse}")
        want = ["label", *dense_names(self.num_dense), *sparse_names(self.num_sparse)]
        if have != want:
            missing = [c for c in want if c not in have]
            raise PartitionFormatError(f"{self.path}: columns {have[:3]}..{have[-1:]} ({len(have)}), expected label, "
                                       f"I1..I{self.num_dense}, C1..C{self.num_sparse} from metadata.json"
                                       + (f" (missing {missing[0]})" if missing else ""))
        sparse_at = {name: t for t, name in enumerate(sparse_names(self.num_sparse))}
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            for j in range(group.num_columns):
                col = group.column(j)
                t = sparse_at.get(col.path_in_schema.split(".")[0])
                stats = col.statistics
                if t is None or stats is None or not stats.has_min_max:
                    continue
                self._check_ids(int(stats.min), int(stats.max), t, f"row group {g}")

    def _check_ids(self, low: int, high: int, t: int, where: str) -> None:
        size = self.table_sizes[t]
        if low < 0 or high >= size:
            bad = low if low < 0 else high
            raise PartitionFormatError(
                f"{self.path}: {where}, column C{t + 1} holds id {bad}, but metadata.json's table_sizes[{t}] = "
                f"{size}: expected ids in [0, {size}) (was table_sizes edited, or the folder mixed with another?)")

    @property
    def num_rows(self) -> int:
        return int(self.meta["splits"][self.config.split]["rows"])

    def __len__(self) -> int:
        q, r = divmod(self.num_rows, self.config.batch_size)
        return q if self.config.drop_last or r == 0 else q + 1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def row_group_order(self) -> list[int]:
        n = int(self.meta["splits"][self.config.split]["row_groups"])
        if not self.config.shuffle:
            return list(range(n))
        return np.random.default_rng([self.config.seed, self.epoch]).permutation(n).tolist()

    def _read_group(self, pf: pq.ParquetFile, i: int) -> _Rows:
        try:
            table = pf.read_row_group(i)
        except (pa.ArrowException, OSError) as err:
            raise PartitionFormatError(f"{self.path}: row group {i} cannot be read ({type(err).__name__}: {err}); "
                                       "preprocess the data again") from None
        labels = table.column("label").to_numpy()
        dense = np.stack([table.column(n).to_numpy() for n in dense_names(self.num_dense)], axis=1)  # (n, F)
        cols = [table.column(n).combine_chunks() for n in sparse_names(self.num_sparse)]
        if pa.types.is_list(cols[0].type):
            lengths = np.stack([np.diff(c.offsets.to_numpy()) for c in cols])  # (T, n)
            values = np.concatenate([c.flatten().to_numpy() for c in cols]).astype(np.int64)
            sparse = JaggedBatch(torch.from_numpy(lengths.astype(np.int64)), torch.from_numpy(values))
        else:
            sparse = np.stack([c.to_numpy() for c in cols], axis=1)  # (n, T)
        # Ids inside their tables, whatever the statistics said: one min/max per column.
        for t, c in enumerate(cols):
            ids = c.flatten() if pa.types.is_list(c.type) else c
            if len(ids):
                low, high = pc.min_max(ids).values()
                self._check_ids(low.as_py(), high.as_py(), t, f"row group {i}")
        return _Rows(dense, labels, sparse)

    def _batches(self) -> Iterator[ClickBatch]:
        B = self.config.batch_size
        pending: _Rows | None = None
        pf = self._open()
        for i in self.row_group_order():
            rows = self._read_group(pf, i)
            if pending is not None:
                need = min(B - len(pending), len(rows))
                head, rows = rows.split([need, len(rows) - need])
                pending = _Rows.cat([pending, head])
                if len(pending) < B:
                    continue
                yield pending.batch()
                pending = None
            q, r = divmod(len(rows), B)
            pieces = rows.split([B] * q + [r])
            for piece in pieces[:q]:
                yield piece.batch()
            pending = pieces[q] if r else None
        if pending is not None and not self.config.drop_last:
            yield pending.batch()

    def __iter__(self) -> Iterator[ClickBatch]:
        q: queue.Queue = queue.Queue(maxsize=self.config.prefetch)
        stop = threading.Event()
        done = object()

        def put(item) -> bool:
            """Wait for room in the queue, waking every 0.1 s to see whether the consumer has gone."""
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for batch in self._batches():
                    if not put(batch):
                        return
                item = done
            except BaseException as err:  # handed to the consumer, re-raised there
                item = err
            put(item)

        thread = threading.Thread(target=produce, name="click-loader", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()  # a consumer that stops early releases the producer
            thread.join()
