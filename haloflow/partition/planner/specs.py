"""Where table specs come from: the built-in Criteo Kaggle spec, a JSON or CSV file, a preprocessed Criteo folder.

::

    kaggle                  26 tables C1..C26, the Kaggle cardinalities (FACTS.md), one id per sample
    FILE.json               {"tables": [{"name": "t0", "num_rows": 1000, "dim": 16, "pooling_factor": 2.5,
                                         "id_frequencies": [...optional histogram...]}, ...]}   (or the bare list)
    FILE.csv                header  name,num_rows,dim[,pooling_factor]  then one table per line
    DIR (preprocessed)      DIR/metadata.json "table_sizes" + DIR/id_counts.npz (per-id counts of the train
                            split, folded into <= ``max_bins`` histogram bins; pooling = ids / train rows)

Every mistake is an ``InputFormatError`` naming the file, the line (CSV) or the table entry, what was found and
what was expected.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import numpy as np

from haloflow.errors import ConfigError, InputFormatError
from haloflow.partition.planner.types import TableSpec

__all__ = ["kaggle_tables", "load_table_specs", "parse_bytes", "fold_histogram"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str, what: str = "size") -> float:
    """``2GiB`` -> 2147483648; ``1.5GB``, ``512MiB``, ``100000`` likewise (ConfigError naming ``what``)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{what}: cannot read {text!r} as a size; expected a number with an optional unit "
                          f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 2GiB")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value):  # '1e400' reads as infinity
        raise ConfigError(f"{what}: {text!r} is too large to be a size; expected a finite number of bytes, e.g. 2GiB")
    return value


def kaggle_tables(dim: int = 16) -> tuple[TableSpec, ...]:
    """The 26 Criteo Kaggle tables (one-hot: pooling factor 1)."""
    from haloflow.data.criteo import KAGGLE_TABLE_SIZES

    return tuple(TableSpec(name=f"C{i + 1}", num_rows=n, dim=dim) for i, n in enumerate(KAGGLE_TABLE_SIZES))


def load_table_specs(source: str | Path, *, dim: int = 16, max_bins: int = 4096) -> tuple[TableSpec, ...]:
    """Table specs from ``"kaggle"``, a ``.json``/``.csv`` file or a preprocessed folder (see the module docs).

    ``dim`` is the embedding dimension wherever the source does not give one.
    """
    if str(source) == "kaggle":
        return kaggle_tables(dim)
    path = Path(source)
    if path.is_dir():
        return _from_folder(path, dim, max_bins)
    if not path.exists():
        raise FileNotFoundError(f"tables file {path} not found; expected 'kaggle', a .json or .csv file, or a "
                                f"folder written by `haloflow preprocess`")
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFormatError(path, f"not text ({err.reason} at byte {err.start}): expected a .json or .csv "
                                     "table file") from None
    suffix = path.suffix.lower()
    if suffix == ".json":
        return _from_json(path, dim)
    if suffix == ".csv":
        return _from_csv(path, dim)
    raise InputFormatError(path, f"unknown tables file type {path.suffix!r}; expected .json or .csv")


def _from_json(path: Path, dim: int) -> tuple[TableSpec, ...]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputFormatError(path, f"not valid JSON ({err.msg}, column {err.colno})", line=err.lineno) from None
    entries = data.get("tables") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise InputFormatError(path, "expected a non-empty list of tables, or an object with one under 'tables'")
    specs = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise InputFormatError(path, f"tables[{i}] is {type(e).__name__}, expected an object")
        unknown = set(e) - {"name", "num_rows", "dim", "pooling_factor", "id_frequencies"}
        if unknown:
            raise InputFormatError(path, f"tables[{i}]: unknown fields {sorted(unknown)}; expected name, num_rows, "
                                         f"dim, pooling_factor, id_frequencies")
        freq = e.get("id_frequencies")
        specs.append(_spec(path, f"tables[{i}]", None, e.get("name", f"t{i}"), e.get("num_rows"),
                           e.get("dim", dim), e.get("pooling_factor", 1.0),
                           None if freq is None else np.asarray(freq, dtype=np.float64)))
    return tuple(specs)


def _from_csv(path: Path, dim: int) -> tuple[TableSpec, ...]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise InputFormatError(path, "empty file; expected a header name,num_rows,dim[,pooling_factor]", line=1)
    header = [h.strip() for h in rows[0]]
    if "name" not in header or "num_rows" not in header:
        raise InputFormatError(path, f"header {header} lacks name and num_rows; expected "
                                     f"name,num_rows,dim[,pooling_factor]", line=1)
    specs = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise InputFormatError(path, f"{len(row)} fields, expected {len(header)} ({','.join(header)})", line=line)
        rec = dict(zip(header, (c.strip() for c in row)))
        specs.append(_spec(path, None, line, rec["name"], rec["num_rows"], rec.get("dim", dim),
                           rec.get("pooling_factor", 1.0), None))
    if not specs:
        raise InputFormatError(path, "no tables after the header")
    return tuple(specs)


def _spec(path, entry, line, name, rows, dim, pooling, freq) -> TableSpec:
    where = f"{entry}: " if entry else ""
    try:
        rows_i, dim_i, pool_f = _int(rows, "num_rows"), _int(dim, "dim"), float(pooling)
        return TableSpec(name=str(name), num_rows=rows_i, dim=dim_i, pooling_factor=pool_f, id_frequencies=freq)
    except (ConfigError, ValueError, TypeError) as err:
        raise InputFormatError(path, f"{where}{err}", line=line) from None


def _int(v, key: str) -> int:
    if isinstance(v, str):
        v = v.replace("_", "")
        if not v.lstrip("-").isdigit():
            raise ValueError(f"{key} is {v!r}, expected an integer")
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key} is {v!r}, expected an integer")
    return v


def _from_folder(folder: Path, dim: int, max_bins: int) -> tuple[TableSpec, ...]:
    from haloflow.data.criteo_loader import load_metadata, verify_file

    meta = load_metadata(folder)
    sizes = meta.get("table_sizes")
    if not isinstance(sizes, list) or not sizes:
        raise InputFormatError(folder / "metadata.json", f"'table_sizes' is {sizes!r}, expected a list of ints")
    train_rows = int(meta.get("splits", {}).get("train", {}).get("rows", 0))
    counts_path = folder / "id_counts.npz"
    counts = None
    if counts_path.is_file():
        verify_file(folder, meta, counts_path.name)
        try:
            with np.load(counts_path, allow_pickle=False) as npz:
                counts = {name: npz[name] for name in npz.files}
        except Exception as err:  # a damaged zip raises BadZipFile, ValueError, OSError, ...
            raise InputFormatError(counts_path, f"not a readable .npz file ({type(err).__name__}: {err})") from None
    specs = []
    for t, n in enumerate(sizes):
        name = f"C{t + 1}"
        hist, pooling = None, 1.0
        if counts is not None and name in counts:
            c = counts[name]
            if c.shape != (n,):
                raise InputFormatError(counts_path, f"{name} has shape {c.shape}, expected ({n},) from metadata.json")
            if c.sum() > 0:
                hist = fold_histogram(c, max_bins)
                pooling = float(c.sum()) / train_rows if train_rows else 1.0
        specs.append(TableSpec(name=name, num_rows=int(n), dim=dim, pooling_factor=pooling, id_frequencies=hist))
    return tuple(specs)


def fold_histogram(counts: np.ndarray, max_bins: int) -> np.ndarray:
    """Per-row counts (R,) -> (H,) bins, H = min(R, max_bins), bin h = rows floor(hR/H)..floor((h+1)R/H)-1."""
    r = counts.size
    h = min(r, max_bins)
    edges = (np.arange(h) * r) // h  # (H,) first row of each bin
    return np.add.reduceat(counts.astype(np.float64), edges)
