"""Binary edge files, read without parsing: a ``.npy`` edge array, and Parquet ``src`` / ``dst`` columns.

::

    edges.npy      integer (E, 2): row i = (src, dst)         memory-mapped; chunks of rows are copied out and
                   integer (2, E): column i = (src, dst)      the pages released behind them (utils/mapped.py)
                   ((E, 2) is taken when both axes could be: a (2, 2) array is two edges, one per row)

    edges.parquet  columns src, dst (any integer type)        read one row group at a time (pyarrow), a row group
    edges/         part-0.parquet, part-1.parquet, ...        longer than a chunk cut into slices; a folder's files
                                                              are read in name order

Both are directed and kept as given (repeats and self-loops too), as a SNAP edge list is; ids are 0-based. The node
count is ``num_nodes`` when given, else ``max id + 1`` below the plausible bound of ``graph.max_plausible_nodes``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from haloflow.data.edge_source import EdgeSource, check_ids, plausible_node_count, read_edges
from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError, InputFormatError
from haloflow.utils.mapped import MappedNpy, NpyWriter

__all__ = ["NpyEdges", "ParquetEdges", "read_npy_edges", "read_parquet_edges", "parquet_files", "write_npy_edges"]


def _stem(path: Path) -> str:
    return path.name.split(".")[0] or path.name


class NpyEdges(EdgeSource):
    """An (E, 2) or (2, E) integer ``.npy`` edge array (see the module docstring)."""

    reader_bytes_per_edge = 16  # the copied slice, before it is widened to int64

    def __init__(self, path: str | os.PathLike, *, num_nodes: int | None = None, name: str | None = None):
        if num_nodes is not None and num_nodes < 0:
            raise ConfigError(f"num_nodes must be >= 0, got {num_nodes}")
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"{self.path} is a folder, expected a .npy file of shape (E, 2) or (2, E)")
        self.name = name or _stem(self.path)
        self._num_nodes = num_nodes
        self._map = MappedNpy(self.path)
        shape, dtype = self._map.shape, self._map.dtype
        if not np.issubdtype(dtype, np.integer):
            raise InputFormatError(self.path, f"holds {dtype} values: expected integer node ids")
        if len(shape) != 2 or 2 not in shape:
            raise InputFormatError(self.path, f"has shape {shape}: expected (E, 2) or (2, E) node ids")
        self.by_rows = shape[1] == 2  # (E, 2)
        self._edges = shape[0] if self.by_rows else shape[1]

    @property
    def num_nodes(self) -> int | None:
        return self._num_nodes

    @property
    def num_edges(self) -> int:
        return self._edges

    def chunks(self, max_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        step = max(int(max_edges), 1)
        for lo in range(0, self._edges, step):
            hi = min(lo + step, self._edges)
            if self.by_rows:
                block = self._map.rows(lo, hi)  # (e, 2)
                src, dst = block[:, 0].astype(np.int64), block[:, 1].astype(np.int64)
            else:
                block = self._map.columns(lo, hi)  # (2, e)
                src, dst = block[0].astype(np.int64), block[1].astype(np.int64)
            del block
            check_ids(self.path, src, dst, lo, self._num_nodes)
            yield src, dst
            del src, dst  # this frame's references would keep the chunk alive while the next one is read

    def finish(self, num_edges: int, max_id: int) -> int:
        return plausible_node_count(self.path, num_edges, max_id, self._num_nodes)


def parquet_files(path: Path) -> list[Path]:
    """The Parquet files of ``path``: itself, or a folder's ``*.parquet`` in name order."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".parquet" and p.is_file())
        if not files:
            raise InputFormatError(path, "holds no .parquet files: expected Parquet files with src and dst columns")
        return files
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    return [path]


class ParquetEdges(EdgeSource):
    """``src`` and ``dst`` columns of a Parquet file or a folder of them, one row group at a time."""

    reader_bytes_per_edge = 32  # the row group in Arrow's buffers, then as numpy int64

    def __init__(self, path: str | os.PathLike, *, num_nodes: int | None = None, name: str | None = None):
        import pyarrow.parquet as pq

        if num_nodes is not None and num_nodes < 0:
            raise ConfigError(f"num_nodes must be >= 0, got {num_nodes}")
        self.path = Path(path)
        self.name = name or _stem(self.path)
        self._num_nodes = num_nodes
        self.files = parquet_files(self.path)
        self._groups: list[tuple[Path, int, int]] = []  # (file, row group, rows)
        for f in self.files:
            try:
                meta = pq.ParquetFile(f).metadata
            except Exception as err:  # pyarrow raises ArrowInvalid (a ValueError) or OSError for a damaged file
                raise InputFormatError(f, f"not a readable Parquet file ({err})") from None
            names = [meta.schema.column(i).name for i in range(meta.num_columns)]
            missing = [c for c in ("src", "dst") if c not in names]
            if missing:
                raise InputFormatError(f, f"has no {' and no '.join(missing)} column: expected columns src and dst "
                                          f"(found {', '.join(names) or 'none'})")
            self._groups += [(f, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        self._edges = sum(rows for _, _, rows in self._groups)

    @property
    def num_nodes(self) -> int | None:
        return self._num_nodes

    @property
    def num_edges(self) -> int:
        return self._edges

    def chunk_edges(self, max_edges: int) -> int:
        """A row group is read whole, then sliced: the largest row group bounds what one read holds."""
        return max([max_edges] + [rows for _, _, rows in self._groups])

    def chunks(self, max_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        import pyarrow.parquet as pq

        step = max(int(max_edges), 1)
        first = 0
        handle, opened = None, None
        for f, g, rows in self._groups:
            if opened != f:
                handle, opened = pq.ParquetFile(f), f
            table = handle.read_row_group(g, columns=["src", "dst"])
            cols = []
            for name in ("src", "dst"):
                col = table.column(name)
                if col.null_count:
                    raise InputFormatError(f, f"row group {g}: column {name} has {col.null_count:,} missing values: "
                                              f"expected a node id on every row")
                arr = col.to_numpy()
                if not np.issubdtype(arr.dtype, np.integer):
                    raise InputFormatError(f, f"column {name} holds {arr.dtype} values: expected integer node ids")
                cols.append(arr)
            del table
            for lo in range(0, rows, step):
                hi = min(lo + step, rows)
                src, dst = cols[0][lo:hi].astype(np.int64), cols[1][lo:hi].astype(np.int64)
                check_ids(f, src, dst, first + lo, self._num_nodes, what="row")
                yield src, dst
                del src, dst
            first += rows

    def finish(self, num_edges: int, max_id: int) -> int:
        return plausible_node_count(self.path, num_edges, max_id, self._num_nodes)


def read_npy_edges(path: str | os.PathLike, *, num_nodes: int | None = None) -> CSRGraph:
    """An (E, 2) or (2, E) ``.npy`` edge array as a directed graph (repeats and self-loops kept)."""
    return read_edges(NpyEdges(path, num_nodes=num_nodes))


def read_parquet_edges(path: str | os.PathLike, *, num_nodes: int | None = None) -> CSRGraph:
    """Parquet ``src`` / ``dst`` columns (a file or a folder of files) as a directed graph."""
    return read_edges(ParquetEdges(path, num_nodes=num_nodes))


def write_npy_edges(path: str | os.PathLike, chunks, num_edges: int, *, dtype=np.int32) -> Path:
    """Write ``(src, dst)`` chunks (``num_edges`` in all) as an (E, 2) ``.npy`` without holding them whole."""
    with NpyWriter(path, dtype, (num_edges, 2)) as out:
        for src, dst in chunks:
            out.write(np.stack([src, dst], axis=1))  # (e, 2)
    return Path(path)
