"""A graph folder of binary arrays (format ``arrays``): edges plus memory-mappable node data, for graphs larger
than memory. An OGB or Planetoid data set is converted to one once (`write_graph_folder`).

::

    GRAPH/
      edges.npy          integer (E, 2) or (2, E)          one of these three (binary_edges.py)
      edges.parquet      src, dst columns
      edges/             *.parquet
      features.npy       float (N, F)        -> float32      optional, each memory-mapped and read in row ranges
      labels.npy         integer (N,)        -> int64        (-1 = unlabelled)
      train_mask.npy     bool (N,)   val_mask.npy   test_mask.npy

The node count is the node files' row count (they must agree), else ``num_nodes``, else ``max id + 1``. Edges are
directed and kept as given, as in every edge-list format; ``--symmetrize`` (the default) makes them undirected.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from haloflow.data.binary_edges import NpyEdges, ParquetEdges
from haloflow.data.edge_source import read_edges
from haloflow.data.graph import GraphDataset, check_disjoint_splits
from haloflow.errors import ConfigError, InputFormatError
from haloflow.utils.mapped import MappedNpy, NpyWriter

__all__ = ["NODE_FILES", "GraphFolder", "NodeArrays", "read_graph_folder", "write_graph_folder", "is_graph_folder"]

# Node arrays a folder may hold, and the dtype each is read as (what GraphDataset holds).
NODE_FILES = {"features": np.float32, "labels": np.int64, "train_mask": np.bool_, "val_mask": np.bool_,
              "test_mask": np.bool_}
_EDGE_NAMES = ("edges.npy", "edges.parquet", "edges")


def is_graph_folder(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in _EDGE_NAMES)


class NodeArrays:
    """The node files of a graph folder, memory-mapped; `rows` reads a range of one of them in its dataset dtype.

    Shapes:
        features (N, F) float32; labels (N,) int64; masks (N,) bool.
    """

    def __init__(self, files: dict[str, Path]):
        self.maps = {name: MappedNpy(path) for name, path in files.items()}
        rows = {name: m.shape[0] if m.shape else 0 for name, m in self.maps.items()}
        if len(set(rows.values())) > 1:
            found = ", ".join(f"{k} {v:,}" for k, v in rows.items())
            raise InputFormatError(next(iter(files.values())).parent, f"node files disagree on the node count: "
                                                                      f"{found} rows; expected one row per node in each")
        for name, m in self.maps.items():
            _check_node_file(files[name], name, m)
        self.num_nodes = next(iter(rows.values())) if rows else None
        self._num_classes: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The arrays present, in ``NODE_FILES`` order (the order of ``format.NODE_DATA``)."""
        return tuple(name for name in NODE_FILES if name in self.maps)

    def row_bytes(self, name: str) -> int:
        """Bytes of one row as read (after the cast to the dataset dtype)."""
        shape = self.maps[name].shape
        return int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(NODE_FILES[name]).itemsize

    def row_shape(self, name: str) -> tuple[int, ...]:
        return self.maps[name].shape[1:]

    def rows(self, name: str, lo: int, hi: int) -> np.ndarray:
        """``array[lo:hi]`` of ``name`` in its dataset dtype (pages released behind the read)."""
        return self.maps[name].rows(lo, hi).astype(NODE_FILES[name], copy=False)

    def iter_rows(self, name: str, max_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(lo, rows)`` over the whole array, at most ``max_rows`` rows at a time."""
        n = self.num_nodes or 0
        for lo in range(0, n, max(int(max_rows), 1)):
            yield lo, self.rows(name, lo, min(lo + max_rows, n))

    def num_classes(self, max_rows: int = 1 << 22) -> int:
        """``max label + 1`` (0 without labels), from one pass over labels.npy."""
        if self._num_classes is None:
            top = -1
            if "labels" in self.maps:
                for _, chunk in self.iter_rows("labels", max_rows):
                    if chunk.size:
                        top = max(top, int(chunk.max()))
            self._num_classes = top + 1
        return self._num_classes

    def close(self) -> None:
        for m in self.maps.values():
            m.close()


def _check_node_file(path: Path, name: str, m: MappedNpy) -> None:
    want = NODE_FILES[name]
    if name == "features":
        if len(m.shape) != 2 or not np.issubdtype(m.dtype, np.floating):
            raise InputFormatError(path, f"holds {m.dtype} of shape {m.shape}: expected float features (N, F)")
    elif name == "labels":
        if len(m.shape) != 1 or not np.issubdtype(m.dtype, np.integer):
            raise InputFormatError(path, f"holds {m.dtype} of shape {m.shape}: expected integer labels (N,)")
    elif len(m.shape) != 1 or m.dtype != want:
        raise InputFormatError(path, f"holds {m.dtype} of shape {m.shape}: expected a bool mask (N,)")


class GraphFolder:
    """An ``arrays`` folder opened: ``edges`` (an ``EdgeSource``) and ``nodes`` (its `NodeArrays`, or None when it
    has no node files)."""

    def __init__(self, path: str | os.PathLike, *, num_nodes: int | None = None):
        self.path = Path(path)
        if not self.path.is_dir():
            raise NotADirectoryError(f"{self.path} is not a folder: expected a graph folder holding edges.npy, "
                                     f"edges.parquet or edges/")
        files = {name: self.path / f"{name}.npy" for name in NODE_FILES if (self.path / f"{name}.npy").is_file()}
        self.nodes = NodeArrays(files) if files else None
        if self.nodes is not None and num_nodes is not None and num_nodes != self.nodes.num_nodes:
            raise ConfigError(f"num_nodes = {num_nodes:,} (--num-nodes) but the node files of {self.path} have "
                              f"{self.nodes.num_nodes:,} rows: expected the same count, or no --num-nodes")
        n = self.nodes.num_nodes if self.nodes is not None else num_nodes
        name = self.path.name.split(".")[0] or self.path.name
        if (self.path / "edges.npy").is_file():
            self.edges = NpyEdges(self.path / "edges.npy", num_nodes=n, name=name)
        elif (self.path / "edges.parquet").exists():
            self.edges = ParquetEdges(self.path / "edges.parquet", num_nodes=n, name=name)
        elif (self.path / "edges").is_dir():
            self.edges = ParquetEdges(self.path / "edges", num_nodes=n, name=name)
        else:
            raise InputFormatError(self.path, "holds no edges.npy, edges.parquet or edges/: expected the edges in "
                                              "one of them")


def read_graph_folder(path: str | os.PathLike, *, num_nodes: int | None = None) -> GraphDataset:
    """A graph folder as a `GraphDataset` in memory: the edges read whole, the node arrays memory-mapped."""
    folder = GraphFolder(path, num_nodes=num_nodes)
    graph = read_edges(folder.edges)
    data = {}
    if folder.nodes is not None:
        for name in folder.nodes.names:
            arr = np.load(folder.nodes.maps[name].path, mmap_mode="r")
            data[name] = arr if arr.dtype == NODE_FILES[name] else arr.astype(NODE_FILES[name])
        folder.nodes.close()
    check_disjoint_splits(data, {name: Path(path) / f"{name}.npy" for name in data})
    return GraphDataset(graph, name=folder.edges.name, **data)


def write_graph_folder(folder: str | os.PathLike, dataset: GraphDataset | None = None, *, edges=None,
                       num_edges: int | None = None, node_data: dict[str, np.ndarray] | None = None,
                       edge_dtype=np.int32) -> Path:
    """Write a graph folder: ``edges.npy`` (E, 2) and the node arrays, from a `GraphDataset` or from ``edges``,
    an iterable of ``(src, dst)`` chunks (``num_edges`` in all), with ``node_data`` arrays.

    The edges of a dataset are its CSR's entries (by destination); they are written chunk by chunk either way.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    node_data = dict(node_data or {})
    if dataset is not None:
        src, dst = dataset.graph.edges()
        edges, num_edges = [(src, dst)], src.shape[0]
        for name in NODE_FILES:
            if getattr(dataset, name) is not None:
                node_data[name] = getattr(dataset, name)
    if edges is None or num_edges is None:
        raise ConfigError("write_graph_folder needs a dataset, or edges with num_edges")
    with NpyWriter(folder / "edges.npy", edge_dtype, (num_edges, 2)) as out:
        for src, dst in edges:
            out.write(np.stack([src, dst], axis=1))
    for name, arr in node_data.items():
        if name not in NODE_FILES:
            raise ConfigError(f"unknown node array {name!r}: expected one of {', '.join(NODE_FILES)}")
        np.save(folder / f"{name}.npy", np.asarray(arr).astype(NODE_FILES[name], copy=False))
    return folder
