"""What a partition folder's arrays must mean, checked on load and by ``haloflow inspect``.

Sizes and CRC-32s (``format.py``) catch a truncated or damaged file; they do not catch a meta.json or an array
that was edited and re-checksummed, or written by a buggy tool, which used to pass ``inspect`` and then stop
training with an IndexError. These checks hold every part to the layout of ``partition/types.py``::

    meta      bounds non-decreasing from 0 to num_nodes; num_classes >= 1 when parts hold labels
    files     dtypes as the format writes them: int64 index arrays, float32 features, int64 labels, bool masks
    part k    n_inner = bounds[k+1] - bounds[k] rows; indptr from 0, non-decreasing, ending at nnz;
              indices in [0, n_inner + n_halo); halo ids in [0, num_nodes), outside part k, grouped by owner as
              halo_offsets says; send ids in [0, n_inner); degrees >= 0; orig_ids in [0, num_nodes);
              labels in [-1, num_classes) (-1: unlabelled), and no unlabelled node in the train mask
    id map    new_to_orig.npy (num_nodes,): a permutation of 0 .. num_nodes-1 (new id -> original id)

Each check is one vectorised pass over an array (about as costly as its checksum); a failure is a
``PartitionFormatError`` naming the file, what was found and what was expected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from haloflow.errors import PartitionFormatError

__all__ = ["EXPECTED_DTYPES", "check_meta_meaning", "check_file_dtype", "check_id_map", "check_part_arrays"]

# The dtype the writer stores for each array name (numpy dtype strings, little-endian as np.save writes them).
EXPECTED_DTYPES = {
    **{name: "<i8" for name in ("indptr", "indices", "halo_gids", "halo_offsets", "send_ids", "send_offsets",
                                "in_degree", "out_degree", "orig_ids", "labels", "new_to_orig")},
    "features": "<f4",
    **{name: "|b1" for name in ("train_mask", "val_mask", "test_mask")},
}


def check_meta_meaning(meta, meta_path: Path) -> None:
    """The parts of meta.json that index arrays: bounds, num_classes, the node and edge counts."""
    bounds = np.asarray(meta.bounds, dtype=np.int64)
    if np.any(np.diff(bounds) < 0):
        k = int(np.argmax(np.diff(bounds) < 0))
        raise PartitionFormatError(f"{meta_path}: bounds must not decrease (part k owns ids bounds[k] .. "
                                   f"bounds[k+1]-1), found bounds[{k}] = {bounds[k]} > bounds[{k + 1}] = "
                                   f"{bounds[k + 1]}")
    for name in ("num_nodes", "num_edges", "num_classes"):
        if getattr(meta, name) < 0:
            raise PartitionFormatError(f"{meta_path}: {name} is {getattr(meta, name)}, expected >= 0")
    if "labels" in meta.node_data and meta.num_classes < 1:
        raise PartitionFormatError(f"{meta_path}: num_classes is {meta.num_classes} but the parts hold labels: "
                                   "expected the number of classes, >= 1")


def check_file_dtype(path: Path, rel: str, recorded: str) -> None:
    """The dtype meta.json records for ``rel`` is the one the format writes for that array."""
    name = Path(rel).stem
    expected = EXPECTED_DTYPES.get(name)
    if expected is not None and recorded != expected:
        raise PartitionFormatError(f"{path}: meta.json records dtype {recorded} for {rel}, expected {expected} "
                                   f"(the dtype `haloflow partition` writes for {name})")


def check_id_map(path: Path, new_to_orig: np.ndarray, num_nodes: int) -> None:
    """``new_to_orig`` is a permutation of 0 .. num_nodes-1: one pass for the range, one ``bincount`` (N ints)."""
    if new_to_orig.shape != (num_nodes,):
        raise _fail(path, f"shape {new_to_orig.shape}, expected (num_nodes,) = ({num_nodes},) (meta.json)")
    _in_range(path, "new_to_orig", new_to_orig, 0, num_nodes, "original ids")
    seen = np.bincount(new_to_orig, minlength=num_nodes)  # (N,) how many new ids map to each original id
    if seen.size and int(seen.max()) > 1:
        orig = int(np.argmax(seen > 1))
        raise _fail(path, f"original id {orig} appears {int(seen[orig])} times: expected a permutation of "
                          f"0..{num_nodes - 1} (each node has one new id)")


def _fail(path: Path, message: str) -> PartitionFormatError:
    return PartitionFormatError(f"{path}: {message}")


def _in_range(path: Path, name: str, arr: np.ndarray, lo: int, hi: int, what: str) -> None:
    """Every value of ``arr`` in [lo, hi)."""
    if arr.size == 0:
        return
    a_min, a_max = int(arr.min()), int(arr.max())
    if a_min < lo or a_max >= hi:
        i = int(np.argmax((arr < lo) | (arr >= hi)))
        raise _fail(path, f"{name}[{i}] = {int(arr[i])} is out of range: expected {what} in [{lo}, {hi})")


def _offsets(path: Path, name: str, arr: np.ndarray, end: int, end_what: str) -> None:
    """An offsets array: from 0, non-decreasing, ending at ``end``."""
    if arr.shape[0] == 0 or int(arr[0]) != 0 or int(arr[-1]) != end:
        first = int(arr[0]) if arr.shape[0] else None
        last = int(arr[-1]) if arr.shape[0] else None
        raise _fail(path, f"{name} runs from {first} to {last}, expected from 0 to {end} ({end_what})")
    down = np.flatnonzero(np.diff(arr) < 0)
    if down.size:
        i = int(down[0])
        raise _fail(path, f"{name} decreases at entry {i + 1} ({int(arr[i])} -> {int(arr[i + 1])}): "
                          "expected non-decreasing offsets")


def check_part_arrays(part_dir: Path, k: int, arrays: dict[str, np.ndarray], meta) -> None:
    """Check part ``k``'s loaded arrays (``name -> array``) against ``meta`` and each other."""
    sub = part_dir / f"part-{k}"
    where = {name: sub / f"{name}.npy" for name in arrays}
    bounds = meta.bounds
    K, N = meta.num_parts, meta.num_nodes
    lo, hi = int(bounds[k]), int(bounds[k + 1])
    n_inner = hi - lo
    indptr, indices, halo = arrays["indptr"], arrays["indices"], arrays["halo_gids"]
    for name, arr in arrays.items():  # dtypes (meta.json may have been edited together with the file)
        expected = EXPECTED_DTYPES.get(name)
        if expected is not None and arr.dtype.str != expected:
            raise _fail(where[name], f"dtype {arr.dtype.str}, expected {expected}")
        if name != "features" and arr.ndim != 1:
            raise _fail(where[name], f"shape {arr.shape}, expected one dimension")
    if indptr.shape[0] != n_inner + 1:
        raise _fail(where["indptr"], f"{indptr.shape[0]} entries, but meta.json's bounds give part {k} "
                                     f"{n_inner} nodes: expected n_inner + 1 = {n_inner + 1}")
    n_halo = int(halo.shape[0])
    num_local = n_inner + n_halo
    _offsets(where["indptr"], "indptr", indptr, int(indices.shape[0]), "the length of indices.npy")
    _in_range(where["indices"], "indices", indices, 0, num_local, "local ids (inner, then halo)")
    for name in ("halo_offsets", "send_offsets"):
        if arrays[name].shape[0] != K + 1:
            raise _fail(where[name], f"{arrays[name].shape[0]} entries, expected num_parts + 1 = {K + 1}")
    _offsets(where["halo_offsets"], "halo_offsets", arrays["halo_offsets"], n_halo, "the halo size")
    _offsets(where["send_offsets"], "send_offsets", arrays["send_offsets"], int(arrays["send_ids"].shape[0]),
             "the length of send_ids.npy")
    _in_range(where["halo_gids"], "halo_gids", halo, 0, N, "global ids")
    owners = np.searchsorted(np.asarray(bounds, dtype=np.int64), halo, side="right") - 1  # (n_halo,)
    group = np.repeat(np.arange(K), np.diff(arrays["halo_offsets"]))  # (n_halo,) the owner halo_offsets says
    if np.any(owners != group):
        i = int(np.argmax(owners != group))
        raise _fail(where["halo_gids"], f"halo_gids[{i}] = {int(halo[i])} is owned by part {int(owners[i])} but "
                                        f"halo_offsets puts it in part {int(group[i])}'s group"
                                        + (" (a part's halo never holds its own nodes)" if owners[i] == k else ""))
    _in_range(where["send_ids"], "send_ids", arrays["send_ids"], 0, n_inner, "local inner ids")
    for name in ("in_degree", "out_degree"):
        if arrays[name].shape[0] != num_local:
            raise _fail(where[name], f"{arrays[name].shape[0]} entries, expected inner + halo = {num_local}")
        _in_range(where[name], name, arrays[name], 0, np.iinfo(np.int64).max, "degrees")
    if arrays["orig_ids"].shape[0] != n_inner:
        raise _fail(where["orig_ids"], f"{arrays['orig_ids'].shape[0]} entries, expected n_inner = {n_inner}")
    _in_range(where["orig_ids"], "orig_ids", arrays["orig_ids"], 0, N, "original ids")
    for name in ("features", "labels", "train_mask", "val_mask", "test_mask"):
        if name in arrays and arrays[name].shape[0] != n_inner:
            raise _fail(where[name], f"{arrays[name].shape[0]} rows, expected one per inner node ({n_inner})")
    if "features" in arrays and arrays["features"].ndim != 2:
        raise _fail(where["features"], f"shape {arrays['features'].shape}, expected (nodes, features)")
    if "labels" in arrays:
        labels = arrays["labels"]
        _in_range(where["labels"], "labels", labels, -1, meta.num_classes,
                  f"class ids (meta.json: num_classes = {meta.num_classes}; -1 = unlabelled)")
        if "train_mask" in arrays and labels.size:
            unlabelled = arrays["train_mask"] & (labels < 0)
            if unlabelled.any():
                i = int(np.argmax(unlabelled))
                raise _fail(where["labels"], f"node {i} is in the train mask but unlabelled (label -1): expected "
                                             "a class id for every training node")
