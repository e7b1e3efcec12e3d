"""The on-disk partition format: one memory-mappable ``.npy`` per array, described and checksummed by meta.json.

::

    DIR/
      meta.json            format_version, method, seed, num_parts, num_nodes, num_edges, bounds, edge_cut,
                           balance, stats, node_data, num_classes, config, and for every file below:
                           {"size": bytes, "dtype": "<i8", "shape": [..], "crc32": int}
      new_to_orig.npy      int64 (N,) original id of each new id
      part-0/              one GraphPart (see haloflow/partition/types.py)
        indptr.npy  indices.npy  halo_gids.npy  halo_offsets.npy  send_ids.npy  send_offsets.npy
        in_degree.npy  out_degree.npy  orig_ids.npy
        features.npy  labels.npy  train_mask.npy  val_mask.npy  test_mask.npy     (those the data set has)
      part-1/ ...

The folder is written under a temporary sibling name and renamed into place at the end, so a crash leaves
nothing behind. Loading checks every file's size (cheap, catches truncation) and, with ``verify=True``, its CRC-32
(one read of the file, about 1 GB/s), then the dtype and shape that meta.json records, then what the arrays mean
(``format_check.py``: bounds, dtypes, ids and labels in range), so an edited folder stops at load, not in training.

A rank reads meta.json, its own part and, where it needs the owner of an original id, ``new_to_orig.npy``; it never
loads another rank's part::

    owner of new id g     searchsorted(bounds, g, side="right") - 1          (meta.json alone)
    owner of original v   the owner of g, where new_to_orig[g] = v            (one (N,) int64 file, memory-mapped)

`part_loads` counts the parts `load_partition` has loaded in this process, so a test can hold a trainer to that.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from haloflow.errors import ConfigError, PartitionFormatError
from haloflow.partition.format_check import check_file_dtype, check_id_map, check_meta_meaning, check_part_arrays
from haloflow.partition.stats import PartitionStats
from haloflow.partition.types import GraphPart, PartitionBook
from haloflow.utils.atomic import atomic_directory, check_replaceable
from haloflow.utils.checksum import crc32_file
from haloflow.utils.mapped import write_npy

__all__ = [
    "FORMAT_VERSION",
    "PART_ARRAYS",
    "NODE_DATA",
    "FileInfo",
    "PartitionMeta",
    "save_partitioned",
    "load_meta",
    "load_partition",
    "load_new_to_orig",
    "part_loads",
    "reset_part_loads",
    "verify_partition",
    "check_output_dir",
    "is_partition_folder",
]

FORMAT_VERSION = 1
META_FILE = "meta.json"
NEW_TO_ORIG_FILE = "new_to_orig.npy"
# GraphPart arrays every part has, then the optional node data.
PART_ARRAYS = (
    "indptr", "indices", "halo_gids", "halo_offsets", "send_ids", "send_offsets", "in_degree", "out_degree", "orig_ids",
)
NODE_DATA = ("features", "labels", "train_mask", "val_mask", "test_mask")


def part_dir_name(k: int) -> str:
    return f"part-{k}"


@dataclass(frozen=True)
class FileInfo:
    """What meta.json records about one ``.npy`` file."""

    size: int  # bytes, header included
    dtype: str  # numpy dtype string, e.g. "<i8"
    shape: tuple[int, ...]
    crc32: int  # zlib.crc32 of the whole file


@dataclass(frozen=True, kw_only=True)
class PartitionMeta:
    """Contents of meta.json. ``files`` maps paths relative to DIR to their `FileInfo`; `save_partitioned` fills it."""

    method: str
    seed: int
    num_parts: int
    num_nodes: int
    num_edges: int
    bounds: tuple[int, ...]
    stats: PartitionStats
    node_data: tuple[str, ...] = ()  # which of NODE_DATA each part holds
    num_classes: int = 0
    name: str = "graph"
    config: dict[str, Any] = field(default_factory=dict)  # the partitioning config, for the record
    files: dict[str, FileInfo] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.num_parts < 1:
            raise ConfigError(f"num_parts must be >= 1, got {self.num_parts}")
        if len(self.bounds) != self.num_parts + 1 or self.bounds[0] != 0 or self.bounds[-1] != self.num_nodes:
            raise ConfigError(
                f"bounds must have num_parts + 1 = {self.num_parts + 1} entries from 0 to num_nodes = {self.num_nodes},"
                f" got {list(self.bounds)}"
            )
        unknown = set(self.node_data) - set(NODE_DATA)
        if unknown:
            raise ConfigError(f"unknown node_data fields {sorted(unknown)}; expected a subset of {list(NODE_DATA)}")

    @property
    def edge_cut(self) -> float:
        return self.stats.edge_cut

    @property
    def book(self) -> PartitionBook:
        return PartitionBook(np.asarray(self.bounds, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        d = {
            "format_version": self.format_version,
            "name": self.name,
            "method": self.method,
            "seed": self.seed,
            "num_parts": self.num_parts,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "bounds": list(self.bounds),
            "edge_cut": self.stats.edge_cut,
            "balance": self.stats.balance,
            "stats": self.stats.to_dict(),
            "node_data": list(self.node_data),
            "num_classes": self.num_classes,
            "config": self.config,
            "files": {name: {**asdict(info), "shape": list(info.shape)} for name, info in self.files.items()},
        }
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], *, path: Path | str = META_FILE) -> "PartitionMeta":
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise PartitionFormatError(
                f"{path}: format_version is {version!r}, expected {FORMAT_VERSION} "
                "(written by another haloflow version; partition the graph again)"
            )
        try:
            files = {
                name: FileInfo(int(f["size"]), str(f["dtype"]), tuple(int(s) for s in f["shape"]), int(f["crc32"]))
                for name, f in d["files"].items()
            }
            return cls(
                method=str(d["method"]),
                seed=int(d["seed"]),
                num_parts=int(d["num_parts"]),
                num_nodes=int(d["num_nodes"]),
                num_edges=int(d["num_edges"]),
                bounds=tuple(int(b) for b in d["bounds"]),
                stats=PartitionStats.from_dict(d["stats"]),
                node_data=tuple(d.get("node_data", ())),
                num_classes=int(d.get("num_classes", 0)),
                name=str(d.get("name", "graph")),
                config=dict(d.get("config", {})),
                files=files,
                format_version=version,
            )
        except KeyError as err:
            raise PartitionFormatError(f"{path}: missing field {err.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError, OverflowError, IndexError, ConfigError) as err:
            # a field of the wrong JSON type (a list for a number, inf or 2**63 for an int, a short list)
            raise PartitionFormatError(f"{path}: invalid contents: {err}") from None


# ------------------------------------------------------------------------------------------------------ save
def _write_array(root: Path, rel: str, arr: np.ndarray) -> FileInfo:
    path = root / rel
    arr = np.ascontiguousarray(arr)
    write_npy(path, arr)  # np.save's bytes, in slices: a memory-mapped part is never resident whole
    return FileInfo(size=path.stat().st_size, dtype=arr.dtype.str, shape=tuple(arr.shape), crc32=crc32_file(path))


def _check_part(part: GraphPart, k: int, meta: PartitionMeta) -> None:
    if part.part_id != k:
        raise ConfigError(f"parts must come in order: part number {k} has part_id {part.part_id}")
    if tuple(int(b) for b in part.book.bounds) != tuple(meta.bounds):
        raise ConfigError(f"part {k} has bounds {part.book.bounds.tolist()} but meta has {list(meta.bounds)}")
    have = tuple(n for n in NODE_DATA if getattr(part, n) is not None)
    if have != tuple(n for n in NODE_DATA if n in meta.node_data):
        raise ConfigError(f"part {k} holds node data {list(have)} but meta.node_data is {list(meta.node_data)}")


def is_partition_folder(folder: Path) -> bool:
    """Does ``folder`` hold a partition's meta.json (a JSON object with our ``format_version``)? What
    ``--overwrite`` may replace; a meta.json of another program's is not one."""
    try:
        d = json.loads((folder / META_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(d, dict) and "format_version" in d and "num_parts" in d


def check_output_dir(out_dir: str | os.PathLike, overwrite: bool) -> None:
    """Fail early, before any work, when ``out_dir`` exists and may not (or must not) be replaced: only an empty
    folder or a partition folder is replaced, and only with ``overwrite``."""
    check_replaceable(out_dir, overwrite, is_partition_folder, "partition folder")


def save_partitioned(
    out_dir: str | os.PathLike,
    parts: Iterable[GraphPart],
    meta: PartitionMeta,
    *,
    new_to_orig: np.ndarray,
    overwrite: bool = False,
) -> PartitionMeta:
    """Write ``parts`` (consumed one at a time, in order 0..K-1) and meta.json; return meta with ``files`` filled.

    Args:
        out_dir: the partition folder DIR; it appears only once everything is written.
        parts: the K parts, e.g. a generator that builds each part as it is asked for.
        meta: everything but ``files``.
        new_to_orig: int64 (N,) original id of each new id.
        overwrite: replace an existing DIR (only if it is empty or a partition folder).

    Raises:
        ConfigError: DIR exists without ``overwrite``; parts disagree with meta or are not K in order.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir, overwrite)
    if new_to_orig.shape != (meta.num_nodes,):
        raise ConfigError(f"new_to_orig must have shape ({meta.num_nodes},), got {new_to_orig.shape}")
    files: dict[str, FileInfo] = {}
    with atomic_directory(out_dir, overwrite=overwrite, ours=is_partition_folder, what="partition folder") as tmp:
        files[NEW_TO_ORIG_FILE] = _write_array(tmp, NEW_TO_ORIG_FILE, new_to_orig.astype(np.int64, copy=False))
        count = 0
        for k, part in enumerate(parts):
            if k >= meta.num_parts:
                raise ConfigError(f"got more parts than meta.num_parts = {meta.num_parts}")
            _check_part(part, k, meta)
            sub = part_dir_name(k)
            (tmp / sub).mkdir()
            for name in PART_ARRAYS + NODE_DATA:
                arr = getattr(part, name)
                if arr is not None:
                    files[f"{sub}/{name}.npy"] = _write_array(tmp, f"{sub}/{name}.npy", arr)
            del part, arr  # before the next part is built: a generator's parts are never two in memory at once
            count += 1
        if count != meta.num_parts:
            raise ConfigError(f"got {count} parts, expected meta.num_parts = {meta.num_parts}")
        meta = replace(meta, files=files)
        (tmp / META_FILE).write_text(json.dumps(meta.to_json(), indent=1))
    return meta


# ------------------------------------------------------------------------------------------------------ load
def load_meta(part_dir: str | os.PathLike) -> PartitionMeta:
    """Read and validate DIR/meta.json.

    Raises:
        PartitionFormatError: DIR or meta.json is missing, not JSON, of another format_version, or incomplete.
    """
    part_dir = Path(part_dir)
    if not part_dir.is_dir():
        found = "is a file, not a folder" if part_dir.exists() else "does not exist"
        raise PartitionFormatError(f"partition folder {part_dir} {found} (expected the --out of `partition`)")
    path = part_dir / META_FILE
    if not path.is_file():
        raise PartitionFormatError(f"{path} is missing: {part_dir} is not a partition folder")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PartitionFormatError(f"{path}: not valid JSON at line {err.lineno}: {err.msg}") from None
    if not isinstance(d, dict):
        raise PartitionFormatError(f"{path}: expected a JSON object, found {type(d).__name__}")
    meta = PartitionMeta.from_json(d, path=path)
    check_meta_meaning(meta, path)
    return meta


def _check_file(part_dir: Path, rel: str, meta: PartitionMeta, verify: bool) -> Path:
    """Existence, size and (with ``verify``) checksum of one recorded file."""
    info = meta.files.get(rel)
    path = part_dir / rel
    if info is None:
        raise PartitionFormatError(f"{part_dir / META_FILE}: no entry for {rel}")
    check_file_dtype(path, rel, info.dtype)
    if not path.is_file():
        raise PartitionFormatError(f"{path} is missing (listed in {META_FILE})")
    size = path.stat().st_size
    if size != info.size:
        raise PartitionFormatError(f"{path} is truncated or altered: {size} bytes, expected {info.size}")
    if verify:
        crc = crc32_file(path)
        if crc != info.crc32:
            raise PartitionFormatError(f"{path} is corrupt: CRC-32 {crc:#010x}, expected {info.crc32:#010x}")
    return path


def _load_array(part_dir: Path, rel: str, meta: PartitionMeta, *, mmap: bool, verify: bool) -> np.ndarray:
    path = _check_file(part_dir, rel, meta, verify)
    info = meta.files[rel]
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception as err:  # a garbled header raises ValueError, SyntaxError, tokenize's TokenError, ...
        raise PartitionFormatError(f"{path}: not a readable .npy file: {err}") from None
    if arr.dtype.str != info.dtype or tuple(arr.shape) != info.shape:
        raise PartitionFormatError(
            f"{path}: found dtype {arr.dtype.str} shape {tuple(arr.shape)}, expected {info.dtype} {info.shape}"
        )
    return arr


_PART_LOADS: Counter[tuple[str, int]] = Counter()  # (real path of DIR, k) -> load_partition calls in this process


def part_loads(part_dir: str | os.PathLike) -> dict[int, int]:
    """How many times this process has loaded each part of ``part_dir`` with `load_partition` (since it started
    or since `reset_part_loads`): ``{k: loads}``, parts never loaded left out."""
    key = os.path.realpath(part_dir)
    return {k: n for (d, k), n in sorted(_PART_LOADS.items()) if d == key}


def reset_part_loads() -> None:
    """Forget the loads `part_loads` counts (for every folder)."""
    _PART_LOADS.clear()


def load_partition(
    part_dir: str | os.PathLike, k: int, *, mmap: bool = True, verify: bool = True, meta: PartitionMeta | None = None
) -> GraphPart:
    """Load part k of DIR as a `GraphPart` (arrays memory-mapped read-only when ``mmap``).

    Raises:
        PartitionFormatError: a missing folder, meta.json or file; another format_version; k out of range;
            a file whose size, checksum (with ``verify``), dtype or shape differs from meta.json.
    """
    part_dir = Path(part_dir)
    meta = meta if meta is not None else load_meta(part_dir)
    if not 0 <= k < meta.num_parts:
        raise PartitionFormatError(f"{part_dir}: part {k} is out of range: it has parts 0..{meta.num_parts - 1}")
    sub = part_dir_name(k)
    arrays = {
        name: _load_array(part_dir, f"{sub}/{name}.npy", meta, mmap=mmap, verify=verify)
        for name in PART_ARRAYS + tuple(n for n in NODE_DATA if n in meta.node_data)
    }
    check_part_arrays(part_dir, k, arrays, meta)
    _PART_LOADS[os.path.realpath(part_dir), k] += 1
    return GraphPart(
        part_id=k,
        book=meta.book,
        n_inner=int(arrays["indptr"].shape[0] - 1),
        n_halo=int(arrays["halo_gids"].shape[0]),
        num_classes=meta.num_classes,
        **arrays,
    )


def load_new_to_orig(
    part_dir: str | os.PathLike, *, mmap: bool = True, verify: bool = True, meta: PartitionMeta | None = None
) -> np.ndarray:
    """int64 (N,) original id of each new global id: the id map, read without loading any part.

    Raises:
        PartitionFormatError: the file is missing, or not listed in meta.json (a folder from a tool that did not
            write it: partition the graph again); its size, checksum (with ``verify``), dtype or shape differs
            from meta.json; it is not a permutation of 0..N-1.
    """
    part_dir = Path(part_dir)
    meta = meta if meta is not None else load_meta(part_dir)
    if NEW_TO_ORIG_FILE not in meta.files:
        raise PartitionFormatError(f"{part_dir / META_FILE} lists no {NEW_TO_ORIG_FILE} (the map from new to "
                                   "original node ids): partition the graph again with `haloflow partition`")
    new_to_orig = _load_array(part_dir, NEW_TO_ORIG_FILE, meta, mmap=mmap, verify=verify)
    check_id_map(part_dir / NEW_TO_ORIG_FILE, new_to_orig, meta.num_nodes)
    return new_to_orig


def verify_partition(part_dir: str | os.PathLike, *, checksums: bool = True) -> PartitionMeta:
    """Check that every file meta.json lists is present with the recorded size (and checksum), and that the
    arrays mean what the format says (``format_check.py``; parts agree on what they send each other); return
    the meta."""
    part_dir = Path(part_dir)
    meta = load_meta(part_dir)
    expected = {NEW_TO_ORIG_FILE} | {
        f"{part_dir_name(k)}/{n}.npy" for k in range(meta.num_parts) for n in PART_ARRAYS + meta.node_data
    }
    missing = sorted(expected - set(meta.files))
    if missing:
        raise PartitionFormatError(f"{part_dir / META_FILE}: no entry for {missing[0]} ({len(missing)} missing)")
    for rel in sorted(meta.files):
        _check_file(part_dir, rel, meta, checksums)
    new_to_orig = load_new_to_orig(part_dir, meta=meta, verify=False)  # the checksums were read above
    sends = np.zeros((meta.num_parts, meta.num_parts), dtype=np.int64)  # sends[k, p]: rows part k sends to p
    recvs = np.zeros_like(sends)  # recvs[k, p]: halo rows part k receives from p
    for k in range(meta.num_parts):
        part = load_partition(part_dir, k, meta=meta, verify=False)  # the checksums were read above
        sends[k], recvs[k] = part.send_counts(), part.recv_counts()
        if not np.array_equal(part.orig_ids, new_to_orig[part.book.part_range(k)[0]:part.book.part_range(k)[1]]):
            raise PartitionFormatError(f"{part_dir / part_dir_name(k) / 'orig_ids.npy'}: differs from the slice "
                                       f"of {NEW_TO_ORIG_FILE} that part {k} owns")
    if not np.array_equal(sends, recvs.T):
        k, p = (int(i) for i in np.argwhere(sends != recvs.T)[0])
        raise PartitionFormatError(f"{part_dir / part_dir_name(k) / 'send_offsets.npy'}: part {k} sends {sends[k, p]} "
                                   f"rows to part {p}, but part {p}'s halo_offsets expect {recvs[p, k]}")
    return meta
