"""Reader for OGB node-property-prediction folders as the OGB downloader leaves them (no ``ogb`` package needed).

Layout (every file gzip CSV without a header; one graph)::

    ogbn_arxiv/
      raw/edge.csv.gz            src,dst          E lines, 0-based node ids, directed as given
      raw/node-feat.csv.gz       f_0,...,f_F-1    N lines (optional)
      raw/node-label.csv.gz      label            N lines (optional; an empty field or NaN = unlabelled -> -1)
      raw/node_year.csv.gz       year             N lines (optional; kept in GraphDataset.extra["node_year"])
      raw/num-node-list.csv.gz   N                one line
      raw/num-edge-list.csv.gz   E                one line
      split/<scheme>/train.csv.gz, valid.csv.gz, test.csv.gz     one node id per line

Integer files go through :func:`haloflow.data.textscan.read_int_rows` (line numbers in errors); the float
features through pyarrow's multi-threaded CSV reader.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from haloflow.data.graph import CSRGraph, GraphDataset, check_disjoint_splits, max_plausible_nodes
from haloflow.data.textscan import arrow_threads, open_decompressed, read_int_rows
from haloflow.errors import ConfigError, InputFormatError

__all__ = ["read_ogb", "ogb_split_schemes"]

log = logging.getLogger(__name__)

_SPLIT_FILES = {"train_mask": "train", "val_mask": "valid", "test_mask": "test"}


def ogb_split_schemes(folder: str | os.PathLike) -> list[str]:
    """Names of the split schemes under ``folder/split`` (e.g. ``["time"]``), sorted."""
    split_dir = Path(folder) / "split"
    return sorted(p.name for p in split_dir.iterdir() if p.is_dir()) if split_dir.is_dir() else []


def read_ogb(folder: str | os.PathLike, *, split: str | None = None, symmetrize: bool = False) -> GraphDataset:
    """Read an OGB node-property folder (layout in the module docstring).

    Args:
        folder: the data set folder holding ``raw/`` (and usually ``split/``).
        split: the split scheme under ``split/``; may be omitted when there is exactly one (or none: no masks).
        symmetrize: add every reverse edge (duplicates merged), as OGB's ``add_inverse_edge`` data sets need.

    Raises:
        InputFormatError: a malformed file, or counts that disagree with num-node-list / num-edge-list.
        ConfigError: ``split`` missing or ambiguous (the message lists the schemes found).
        FileNotFoundError: ``raw/`` or one of its required files is missing.
    """
    folder = Path(folder)
    raw = folder / "raw"
    if not raw.is_dir():
        raise FileNotFoundError(f"{folder} is not an OGB folder: expected {raw} to exist")
    num_nodes = _single_count(_require(raw / "num-node-list.csv.gz"), "nodes")
    num_edges = _single_count(_require(raw / "num-edge-list.csv.gz"), "edges")
    if num_nodes > max_plausible_nodes(num_edges):  # before N sizes anything (the edge count is checked below)
        raise InputFormatError(
            raw / "num-node-list.csv.gz", f"{num_nodes:,} nodes for {num_edges:,} edges (num-edge-list.csv.gz), but "
            f"E edges touch at most 2E nodes: expected at most 2E + 1,024 = {max_plausible_nodes(num_edges):,} "
            f"(is the file corrupt?)"
        )

    edge_path = _require(raw / "edge.csv.gz")
    edges = read_int_rows(edge_path, 2, comment=None, columns="src,dst", what="node id", upper=num_nodes)  # (E, 2)
    if edges.shape[0] != num_edges:
        raise InputFormatError(
            edge_path, f"{edges.shape[0]:,} edges, but num-edge-list.csv.gz says {num_edges:,}: expected them equal"
        )
    graph = CSRGraph.from_edges(edges[:, 0], edges[:, 1], num_nodes, symmetrize=symmetrize)

    features = labels = None
    extra: dict = {}
    if (raw / "node-feat.csv.gz").exists():
        features = _read_float_table(raw / "node-feat.csv.gz")  # (N, F) float32
        _check_rows(raw / "node-feat.csv.gz", features.shape[0], num_nodes)
    if (raw / "node-label.csv.gz").exists():
        labels = _read_labels(raw / "node-label.csv.gz")  # (N,) int64
        _check_rows(raw / "node-label.csv.gz", labels.shape[0], num_nodes)
    if (raw / "node_year.csv.gz").exists():
        year = read_int_rows(raw / "node_year.csv.gz", 1, comment=None, columns="year", what="year")[:, 0]
        _check_rows(raw / "node_year.csv.gz", year.shape[0], num_nodes)
        extra["node_year"] = year
    masks = _read_split(folder, split, num_nodes)
    dataset = GraphDataset(
        graph, features=features, labels=labels, name=folder.resolve().name, extra=extra, **masks
    )
    log.info("read %s: %s", folder, dataset)
    return dataset


def _require(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: an OGB raw folder needs it")
    return path


def _single_count(path: Path, what: str) -> int:
    rows = read_int_rows(path, 1, comment=None, columns=f"number of {what}", what="count")  # (G, 1)
    if rows.shape[0] != 1:
        raise InputFormatError(
            path, f"expected one line (one graph of a node-property data set), found {rows.shape[0]}"
        )
    return int(rows[0, 0])


def _check_rows(path: Path, found: int, num_nodes: int) -> None:
    if found != num_nodes:
        raise InputFormatError(
            path, f"{found:,} rows, but num-node-list.csv.gz says {num_nodes:,} nodes: expected one row per node"
        )


def _read_split(folder: Path, split: str | None, num_nodes: int) -> dict[str, np.ndarray | None]:
    schemes = ogb_split_schemes(folder)
    if split is None:
        if not schemes:
            log.info("%s has no split/ folder: no train/val/test masks", folder)
            return {}
        if len(schemes) > 1:
            raise ConfigError(f"{folder}/split holds several schemes {schemes}: pass split= to choose one")
        split = schemes[0]
    elif split not in schemes:
        raise ConfigError(f"split {split!r} not found in {folder}/split: expected one of {schemes}")
    masks = {}
    for attr, stem in _SPLIT_FILES.items():
        path = _require(folder / "split" / split / f"{stem}.csv.gz")
        ids = read_int_rows(path, 1, comment=None, columns="node id", what="node id", upper=num_nodes)[:, 0]
        mask = np.zeros(num_nodes, dtype=bool)
        mask[ids] = True
        masks[attr] = mask
    check_disjoint_splits(masks, {attr: folder / "split" / split / f"{stem}.csv.gz"
                                  for attr, stem in _SPLIT_FILES.items()})
    return masks


def _read_float_table(path: Path) -> np.ndarray:
    """A headerless numeric CSV as float32 ``(rows, cols)``, parsed by pyarrow (multi-threaded when large)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(
            str(path),
            read_options=pacsv.ReadOptions(autogenerate_column_names=True, use_threads=arrow_threads(path)),
            parse_options=pacsv.ParseOptions(ignore_empty_lines=False),  # an empty label = unlabelled row
        )
    except pa.ArrowInvalid as err:
        raise _locate_float_error(path, err) from None
    except OSError as err:  # pyarrow's word for a cut-off or garbled compressed stream
        raise InputFormatError(path, f"truncated or corrupt compressed data ({err}): expected a complete gzip "
                                     "file (download it again)") from None
    out = np.empty((table.num_rows, table.num_columns), dtype=np.float32)  # (N, F)
    for j, column in enumerate(table.columns):
        if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type) or pa.types.is_null(column.type)):
            raise _locate_float_error(path, f"column {j} parsed as {column.type}")
        out[:, j] = column.cast(pa.float32()).to_numpy(zero_copy_only=False)  # nulls (empty fields) -> NaN
    return out


def _read_labels(path: Path) -> np.ndarray:
    """Labels as int64 (N,); an empty or NaN entry (unlabelled node) becomes -1."""
    table = _read_float_table(path)  # (N, T)
    if table.shape[1] != 1:
        raise InputFormatError(path, f"expected one label column, found {table.shape[1]} (multi-task labels)")
    col = table[:, 0]  # (N,) float32: exact for class ids < 2^24
    missing = np.isnan(col)
    bad = ~missing & ((col < 0) | (col != np.floor(col)))
    if bad.any():
        row = int(np.argmax(bad))
        raise InputFormatError(path, f"label {col[row]} is not a class id: expected an integer >= 0", line=row + 1)
    labels = np.full(col.shape[0], -1, dtype=np.int64)
    labels[~missing] = col[~missing].astype(np.int64)
    return labels


def _locate_float_error(path: Path, err) -> InputFormatError:
    """Slow second pass, run only after pyarrow failed: find the first line that is not ``F`` numbers."""
    expected = None
    with open_decompressed(path) as f:
        for lineno, raw in enumerate(f, start=1):
            fields = raw.decode("utf-8", "replace").rstrip("\r\n").split(",")
            if expected is None:
                expected = len(fields)
            if len(fields) != expected:
                return InputFormatError(
                    path, f"expected {expected} comma-separated numbers (as on line 1), found {len(fields)}", lineno
                )
            for field in fields:
                try:
                    float(field) if field.strip() else None
                except ValueError:
                    return InputFormatError(path, f"non-numeric field {field!r}: expected a number", lineno)
    return InputFormatError(path, f"could not be parsed as numbers: {err}")
