"""Reader for the Planetoid citation sets (Cora, CiteSeer, PubMed) in the ``ind.<name>.*`` files of Kipf's GCN code.

Files (Python-2 pickles except ``test.index``)::

    ind.cora.x           scipy sparse (140, F)    features of the training nodes (rows 0..139)
    ind.cora.y           one-hot      (140, C)
    ind.cora.allx        scipy sparse (A, F)      features of nodes 0..A-1 (labelled and unlabelled)
    ind.cora.ally        one-hot      (A, C)
    ind.cora.tx          scipy sparse (T, F)      features of the test nodes, in test.index order
    ind.cora.ty          one-hot      (T, C)
    ind.cora.graph       dict {node: [neighbours]}
    ind.cora.test.index  text, one node id per line (ids >= A, not sorted, for CiteSeer not contiguous)

Assembled as PyG's and DGL's loaders do::

    node id   0 ............ A-1 | A ......................... N-1
    features  allx                | tx row i placed at node test.index[i]; ids never listed (CiteSeer's
    labels    argmax(ally)        | argmax(ty) the same way            isolated test nodes) get zero features, -1
    masks     train = 0..len(y)-1, val = len(y)..len(y)+499, test = test.index

The graph is symmetrised with self-loops dropped (Cora: 2,708 nodes, 10,556 adjacency entries).
The pickles are loaded by a restricted unpickler that builds only numpy arrays, scipy sparse matrices and
dicts of lists, so a crafted file cannot run code.
"""

from __future__ import annotations

import codecs
import collections
import copyreg
import logging
import os
import pickle
from pathlib import Path

import numpy as np

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.data.textscan import read_int_rows
from haloflow.errors import InputFormatError

__all__ = ["read_planetoid", "load_restricted_pickle"]

log = logging.getLogger(__name__)

_NUM_VAL = 500  # the standard Planetoid validation set: the 500 nodes after the training nodes


def _allowed_globals() -> dict[tuple[str, str], object]:
    """Every class or function a Planetoid pickle may name, keyed by the (module, name) written in the file."""
    import scipy.sparse as sp

    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray

    table: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("collections", "defaultdict"): collections.defaultdict,
        ("copyreg", "_reconstructor"): copyreg._reconstructor,
        ("copy_reg", "_reconstructor"): copyreg._reconstructor,
        # Python 3 writes bytes into protocol-2 pickles as _codecs.encode(text, "latin1"): a pure conversion.
        ("_codecs", "encode"): codecs.encode,
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[(module, "_reconstruct")] = multiarray._reconstruct
        table[(module, "scalar")] = multiarray.scalar
    for module in ("__builtin__", "builtins"):
        table[(module, "list")] = list
        table[(module, "object")] = object
        table[(module, "bytes")] = bytes  # empty bytes in protocol-2 pickles written by Python 3
    for fmt in ("csr", "csc", "coo", "lil"):
        cls = getattr(sp, f"{fmt}_matrix")
        for module in (f"scipy.sparse.{fmt}", f"scipy.sparse._{fmt}", "scipy.sparse"):
            table[(module, f"{fmt}_matrix")] = cls
    return table


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler whose ``find_class`` returns only entries of :func:`_allowed_globals` and refuses the rest."""

    def __init__(self, file, path: Path):
        super().__init__(file, encoding="latin1")
        self._path = path
        self._allowed = _allowed_globals()

    def find_class(self, module: str, name: str):
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise InputFormatError(
                self._path,
                f"refusing to unpickle {module}.{name}: a Planetoid file may only hold numpy arrays, "
                "scipy sparse matrices and dicts of lists",
            ) from None


def load_restricted_pickle(path: str | os.PathLike):
    """Unpickle ``path`` (Python 2 or 3 pickle) allowing only numpy arrays, scipy sparse matrices, dicts, lists.

    Raises:
        InputFormatError: the file names any other class or function (nothing it names is ever called),
            or it is not a pickle.
    """
    path = Path(path)
    with open(path, "rb") as f:
        try:
            return _RestrictedUnpickler(f, path).load()
        except InputFormatError:
            raise
        except Exception as err:  # truncated or garbled: pickle raises many types
            raise InputFormatError(path, f"not a readable pickle: {type(err).__name__}: {err}") from None


def read_planetoid(folder: str | os.PathLike, name: str = "cora") -> GraphDataset:
    """Read ``folder/ind.<name>.*`` (layout in the module docstring) as a symmetric graph with the standard split.

    Raises:
        FileNotFoundError: one of the eight files is missing.
        InputFormatError: a file holds something other than expected, or the files disagree on sizes.
    """
    folder = Path(folder)
    files = {key: folder / f"ind.{name}.{key}" for key in ("x", "y", "allx", "ally", "tx", "ty", "graph", "test.index")}
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"Planetoid set {name!r} is incomplete: missing {', '.join(missing)}")
    m = {k: _dense_matrix(files[k], load_restricted_pickle(files[k])) for k in ("x", "y", "allx", "ally", "tx", "ty")}
    for a, b in (("x", "y"), ("allx", "ally"), ("tx", "ty")):
        if m[a].shape[0] != m[b].shape[0]:
            raise InputFormatError(
                files[a], f"{m[a].shape[0]} rows but ind.{name}.{b} has {m[b].shape[0]}: expected one label row each"
            )
    for a, b in (("x", "allx"), ("tx", "allx"), ("y", "ally"), ("ty", "ally")):
        if m[a].shape[1] != m[b].shape[1]:
            raise InputFormatError(
                files[a], f"{m[a].shape[1]} columns but ind.{name}.{b} has {m[b].shape[1]}: expected the same width"
            )
    allx, ally, tx, ty, y = m["allx"], m["ally"], m["tx"], m["ty"], m["y"]
    adjacency = load_restricted_pickle(files["graph"])
    test_ids = read_int_rows(files["test.index"], 1, comment=None, columns="node id", what="test id")[:, 0]
    if tx.shape[0] != test_ids.shape[0]:
        raise InputFormatError(
            files["test.index"], f"{test_ids.shape[0]} ids but ind.{name}.tx has {tx.shape[0]} rows: expected equal"
        )

    num_labelled = allx.shape[0]
    if y.shape[0] + _NUM_VAL > num_labelled:
        raise InputFormatError(
            files["allx"], f"{num_labelled} rows: the standard split needs len(y) + {_NUM_VAL} = "
            f"{y.shape[0] + _NUM_VAL} <= allx rows (validation nodes come after the training nodes)"
        )
    # CiteSeer's test ids leave gaps (15 ids without a row, up to its graph's last node), so the ids may pass the
    # rows by as many gaps as there are test ids, but one id far beyond would size every array by it
    keys = [k for k in adjacency if isinstance(k, (int, np.integer))] if isinstance(adjacency, dict) else []
    bound = max(num_labelled + tx.shape[0], int(max(keys, default=-1)) + 1) + tx.shape[0]
    _check_test_ids(files["test.index"], test_ids, num_labelled, bound)
    num_nodes = max(num_labelled + tx.shape[0], int(test_ids.max(initial=-1)) + 1)
    features = np.zeros((num_nodes, allx.shape[1]), dtype=np.float32)  # (N, F)
    features[:num_labelled] = allx
    features[test_ids] = tx  # tx row i belongs to node test_ids[i]
    labels = np.full(num_nodes, -1, dtype=np.int64)  # (N,); -1 where no one-hot row exists
    labels[:num_labelled] = _argmax_or_missing(ally)
    labels[test_ids] = _argmax_or_missing(ty)

    graph = CSRGraph.from_edges(*_dict_edges(files["graph"], adjacency, num_nodes), num_nodes,
                                symmetrize=True, drop_self_loops=True)
    masks = {key: np.zeros(num_nodes, dtype=bool) for key in ("train_mask", "val_mask", "test_mask")}
    masks["train_mask"][: y.shape[0]] = True
    masks["val_mask"][y.shape[0] : y.shape[0] + _NUM_VAL] = True
    masks["test_mask"][test_ids] = True
    dataset = GraphDataset(graph, features=features, labels=labels, num_classes=ally.shape[1], name=name, **masks)
    log.info("read %s: %s", folder, dataset)
    return dataset


def _dense_matrix(path: Path, obj) -> np.ndarray:
    """A 2-D float32 array from a scipy sparse matrix or numpy array."""
    import scipy.sparse as sp

    if sp.issparse(obj):
        obj = _checked_sparse(path, obj).toarray()
    if not isinstance(obj, np.ndarray) or obj.ndim != 2:
        raise InputFormatError(path, f"expected a 2-D matrix, found {type(obj).__name__}")
    try:
        return obj.astype(np.float32, copy=False)
    except (TypeError, ValueError) as err:  # an object array, strings
        raise InputFormatError(path, f"expected a matrix of numbers, found dtype {obj.dtype} ({err})") from None


def _checked_sparse(path: Path, m):
    """``m`` as a CSR matrix whose structure has been checked. A pickle restores a matrix's arrays as stored, and
    scipy's ``toarray`` trusts them: a flipped byte in ``indices`` writes outside the dense array (a segfault)."""
    import scipy.sparse as sp

    from haloflow.utils.memory import available_bytes, format_bytes

    try:
        shape = tuple(int(d) for d in m.shape)
        if len(shape) != 2 or min(shape) < 0:
            raise ValueError(f"shape {shape}")
        need, have = 4 * shape[0] * shape[1], available_bytes()
        if have is not None and need > have:
            raise InputFormatError(path, f"a {shape[0]:,} x {shape[1]:,} matrix needs {format_bytes(need)} dense, "
                                         f"more than the {format_bytes(have)} free (is the file corrupt?)")
        if m.format in ("csr", "csc"):
            m.check_format(full_check=True)  # indptr monotone and within indices, every index inside the shape
            return m.tocsr()
        if m.format == "coo":
            row, col = np.asarray(m.row, dtype=np.int64), np.asarray(m.col, dtype=np.int64)
            data = np.asarray(m.data)
        elif m.format == "lil":
            lengths = [len(r) for r in m.rows]
            row = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
            col = np.concatenate([np.asarray(r, dtype=np.int64).ravel() for r in m.rows] or [np.zeros(0, np.int64)])
            data = np.concatenate([np.asarray(d).ravel() for d in m.data] or [np.zeros(0)])
        else:
            raise ValueError(f"sparse format {m.format!r}")
        if len(m.rows if m.format == "lil" else row) != shape[0] and m.format == "lil":
            raise ValueError(f"{len(m.rows)} row lists for {shape[0]} rows")
        return sp.coo_matrix((data, (row, col)), shape=shape).tocsr()  # the constructor checks the indices
    except InputFormatError:
        raise
    except Exception as err:  # a garbled matrix raises anything from a TypeError to scipy's ValueErrors
        raise InputFormatError(path, f"a corrupt sparse matrix ({type(err).__name__}: {err}): expected a "
                                     "well-formed scipy sparse matrix") from None


def _argmax_or_missing(onehot: np.ndarray) -> np.ndarray:
    return np.where(onehot.any(axis=1), onehot.argmax(axis=1), -1)


def _check_test_ids(path: Path, ids: np.ndarray, num_labelled: int, bound: int) -> None:
    if ids.size and int(ids.max()) >= bound:  # one bad id would size every array (and the graph) by it
        row = int(np.argmax(ids))
        raise InputFormatError(path, f"test id {int(ids[row])} is out of range: expected ids < {bound:,} (the rows of "
                               "allx and tx, or the graph's nodes, plus a gap per test id)", line=row + 1)
    if ids.size and int(ids.min()) < num_labelled:
        row = int(np.argmin(ids))
        raise InputFormatError(
            path, f"test id {int(ids[row])} overlaps the allx rows: expected ids >= {num_labelled}", line=row + 1
        )
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[np.argmax(counts > 1)])
        raise InputFormatError(path, f"test id {dup} is listed {int(counts.max())} times: expected each once")


def _node_id(v) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"found {v!r}")
    return int(v)


def _id_array(v) -> np.ndarray:
    arr = np.asarray(v).ravel()
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"found {arr[:3].tolist()!r}")
    return arr.astype(np.int64)


def _dict_edges(path: Path, adjacency, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """``{node: [neighbours]}`` -> ``(src, dst)`` int64; one Python step per node, not per edge."""
    if not isinstance(adjacency, dict):
        raise InputFormatError(path, f"expected a dict of adjacency lists, found {type(adjacency).__name__}")
    try:  # keys and neighbours must be integers: a string or float in a damaged file is not a node id
        keys = np.fromiter((_node_id(k) for k in adjacency.keys()), dtype=np.int64, count=len(adjacency))
        lists = [_id_array(v) for v in adjacency.values()]
    except (TypeError, ValueError, OverflowError) as err:
        raise InputFormatError(path, f"expected integer node ids in the adjacency lists ({err})") from None
    src = np.repeat(keys, [a.shape[0] for a in lists])
    dst = np.concatenate(lists) if lists else np.zeros(0, dtype=np.int64)
    ids = np.concatenate([src, dst])
    out = (ids < 0) | (ids >= num_nodes)
    if out.any():
        bad = int(ids[np.argmax(out)])
        raise InputFormatError(path, f"node id {bad} is out of range: expected ids in [0, {num_nodes})")
    return src, dst
