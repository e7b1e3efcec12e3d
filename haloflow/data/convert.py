"""Conversion from the graph objects of PyG and DGL, duck-typed: neither library is imported here.

::

    PyG Data                                 DGL graph                         GraphDataset
    edge_index (2, E): row 0 src, row 1 dst  g.edges() -> (src, dst)           graph: CSRGraph, row v = in-neighbours
    num_nodes                                g.num_nodes()                     (edges kept as given: direction,
    x (N, F)                                 ndata["feat"]                      duplicates and self-loops)
    y (N,)                                   ndata["label"]                    features float32, labels int64
    train_mask / val_mask / test_mask        ndata["train_mask"], ...          masks bool
                                             any other ndata entry         ->  extra[name]
"""

from __future__ import annotations

import numpy as np

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.errors import ConfigError

__all__ = ["from_pyg", "from_dgl"]

_MASKS = ("train_mask", "val_mask", "test_mask")


def _numpy(value, what: str) -> np.ndarray:
    """A torch tensor (any device) or array-like as a numpy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as err:
        raise ConfigError(f"{what} is not array-like: found {type(value).__name__} ({err})") from None


def _node_arrays(x, y, masks: dict) -> tuple[np.ndarray | None, np.ndarray | None, dict[str, np.ndarray]]:
    """Features float32, labels int64 and bool masks, naming the source attribute in every shape or dtype error."""
    features = labels = None
    if x is not None:
        features = _numpy(x, "features").astype(np.float32, copy=False)
        if features.ndim != 2:
            raise ConfigError(f"node features must have shape (num_nodes, F), found {features.shape}")
    if y is not None:
        y = _numpy(y, "labels")
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or y.dtype == bool):
            raise ConfigError(f"labels must be integer class ids of shape (num_nodes,), found {y.dtype} {y.shape}")
        labels = y.astype(np.int64, copy=False)
    mask_arrays = {}
    for key, value in masks.items():
        if value is not None:
            arr = _numpy(value, key)
            if arr.dtype != bool:
                raise ConfigError(f"{key} must be a boolean mask of shape (num_nodes,), found {arr.dtype} {arr.shape}")
            mask_arrays[key] = arr
    return features, labels, mask_arrays


def from_pyg(data, *, name: str = "pyg") -> GraphDataset:
    """A ``torch_geometric.data.Data`` (or anything with its attributes) as a :class:`GraphDataset`.

    Args:
        data: needs ``edge_index`` (2, E) with sources in row 0 and ``num_nodes``; ``x``, ``y``, ``train_mask``,
            ``val_mask``, ``test_mask`` are used when present.

    Raises:
        ConfigError: a missing ``edge_index``, or an attribute of the wrong shape or dtype.
    """
    if getattr(data, "edge_index", None) is None:
        raise ConfigError(f"data has no edge_index: expected a (2, E) tensor, found {type(data).__name__}")
    edge_index = _numpy(data.edge_index, "edge_index")
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ConfigError(f"data.edge_index must have shape (2, E), found {edge_index.shape}")
    n = getattr(data, "num_nodes", None)
    graph = CSRGraph.from_edges(edge_index[0], edge_index[1], None if n is None else int(n))
    x, y = getattr(data, "x", None), getattr(data, "y", None)
    masks = {key: getattr(data, key, None) for key in _MASKS}
    features, labels, masks = _node_arrays(x, y, masks)
    return GraphDataset(graph, features=features, labels=labels, name=name, **masks)


def from_dgl(g, *, name: str = "dgl") -> GraphDataset:
    """A DGL graph (anything with ``edges()``, ``num_nodes()`` and ``ndata``) as a :class:`GraphDataset`.

    ``ndata["feat"]`` becomes the features, ``ndata["label"]`` the labels, ``ndata["<x>_mask"]`` for train/val/test
    the masks (``valid_mask`` is taken as ``val_mask``); every other node field goes to ``extra``.

    Raises:
        ConfigError: an ndata field of the wrong shape or dtype.
    """
    src, dst = g.edges()
    graph = CSRGraph.from_edges(_numpy(src, "edges()[0]"), _numpy(dst, "edges()[1]"), int(g.num_nodes()))
    ndata = dict(g.ndata)
    x, y = ndata.pop("feat", None), ndata.pop("label", None)
    if "valid_mask" in ndata and "val_mask" not in ndata:
        ndata["val_mask"] = ndata.pop("valid_mask")
    masks = {key: ndata.pop(key, None) for key in _MASKS}
    features, labels, masks = _node_arrays(x, y, masks)
    extra = {key: _numpy(value, f"ndata[{key!r}]") for key, value in ndata.items()}
    for key, value in extra.items():
        if value.ndim == 0 or value.shape[0] != graph.num_nodes:
            raise ConfigError(f"ndata[{key!r}] has shape {value.shape}: expected {graph.num_nodes} rows, one per node")
    return GraphDataset(graph, features=features, labels=labels, name=name, extra=extra, **masks)
