import numpy as np
import pytest
import torch

from haloflow.data.convert import from_dgl, from_pyg
from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError

# 4 nodes plus an isolated node 4; src -> dst: 0->1, 1->2, 1->0, 3->2, 3->2 (duplicate kept), 2->2 (self-loop kept)
SRC = [0, 1, 1, 3, 3, 2]
DST = [1, 2, 0, 2, 2, 2]
INDPTR = [0, 1, 2, 6, 6, 6]  # in-neighbours: 0 <- 1, 1 <- 0, 2 <- {1, 2, 3, 3}
INDICES = [1, 0, 1, 2, 3, 3]


def node_tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(5, 3, generator=g, dtype=torch.float64),
        "y": torch.tensor([0, 2, 1, 1, 0]),
        "train_mask": torch.tensor([True, True, False, False, False]),
        "val_mask": torch.tensor([False, False, True, False, False]),
        "test_mask": torch.tensor([False, False, False, True, True]),
    }


@pytest.mark.slow  # importing torch_geometric takes several seconds
def test_from_pyg_real_data_object():
    Data = pytest.importorskip("torch_geometric.data").Data
    t = node_tensors()
    data = Data(edge_index=torch.tensor([SRC, DST]), num_nodes=5, **t)
    ds = from_pyg(data, name="toy")
    np.testing.assert_array_equal(ds.graph.indptr, INDPTR)
    np.testing.assert_array_equal(ds.graph.indices, INDICES)
    assert ds.features.dtype == np.float32
    np.testing.assert_array_equal(ds.features, t["x"].numpy().astype(np.float32))
    np.testing.assert_array_equal(ds.labels, [0, 2, 1, 1, 0])
    assert ds.num_classes == 3 and ds.name == "toy"
    for key in ("train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(ds, key), t[key].numpy())


@pytest.mark.slow  # importing torch_geometric takes several seconds
def test_from_pyg_minimal_and_errors():
    Data = pytest.importorskip("torch_geometric.data").Data
    ds = from_pyg(Data(edge_index=torch.tensor([SRC, DST]), num_nodes=7))
    assert ds.num_nodes == 7 and ds.features is None and ds.labels is None and ds.train_mask is None
    assert ds.graph.equals(CSRGraph.from_edges(SRC, DST, 7))
    with pytest.raises(ConfigError, match=r"data.edge_index must have shape \(2, E\), found \(3, 2\)"):
        from_pyg(Data(edge_index=torch.zeros(3, 2, dtype=torch.long), num_nodes=3))
    with pytest.raises(ConfigError, match="data has no edge_index"):
        from_pyg(Data(x=torch.zeros(3, 2)))
    with pytest.raises(ConfigError, match="labels must be integer class ids .* found float32"):
        from_pyg(Data(edge_index=torch.tensor([SRC, DST]), y=torch.zeros(5), num_nodes=5))
    with pytest.raises(ConfigError, match="train_mask must be a boolean mask"):
        from_pyg(Data(edge_index=torch.tensor([SRC, DST]), train_mask=torch.zeros(5), num_nodes=5))
    with pytest.raises(ConfigError, match="features has 4 rows but the graph has 5 nodes"):
        from_pyg(Data(edge_index=torch.tensor([SRC, DST]), x=torch.zeros(4, 2), num_nodes=5))


class TinyDGLGraph:
    """Just what from_dgl touches of a DGLGraph: edges(), num_nodes() and ndata."""

    def __init__(self, src, dst, n, ndata):
        self._src, self._dst, self._n = torch.tensor(src), torch.tensor(dst), n
        self.ndata = ndata

    def edges(self):
        return self._src, self._dst

    def num_nodes(self):
        return self._n


def test_from_dgl_duck_typed():
    t = node_tensors()
    year = torch.arange(2000, 2005)
    ndata = {"feat": t["x"], "label": t["y"], "train_mask": t["train_mask"], "valid_mask": t["val_mask"],
             "test_mask": t["test_mask"], "year": year}
    ds = from_dgl(TinyDGLGraph(SRC, DST, 5, ndata))
    np.testing.assert_array_equal(ds.graph.indptr, INDPTR)
    np.testing.assert_array_equal(ds.graph.indices, INDICES)
    np.testing.assert_array_equal(ds.features, t["x"].numpy().astype(np.float32))
    np.testing.assert_array_equal(ds.labels, t["y"].numpy())
    np.testing.assert_array_equal(ds.val_mask, t["val_mask"].numpy())  # 'valid_mask' read as the val mask
    np.testing.assert_array_equal(ds.extra["year"], year.numpy())
    assert ds.name == "dgl"


@pytest.mark.slow  # importing torch_geometric takes several seconds
def test_from_dgl_and_from_pyg_agree():
    Data = pytest.importorskip("torch_geometric.data").Data
    t = node_tensors()
    ndata = {"feat": t["x"], "label": t["y"], **{k: t[k] for k in ("train_mask", "val_mask", "test_mask")}}
    a = from_dgl(TinyDGLGraph(SRC, DST, 5, ndata))
    b = from_pyg(Data(edge_index=torch.tensor([SRC, DST]), num_nodes=5, **t))
    assert a.graph.equals(b.graph)
    for key in ("features", "labels", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))


def test_from_dgl_errors():
    with pytest.raises(ConfigError, match=r"ndata\['year'\] has shape \(3,\): expected 5 rows"):
        from_dgl(TinyDGLGraph(SRC, DST, 5, {"year": torch.arange(3)}))
    with pytest.raises(ConfigError, match=r"node features must have shape \(num_nodes, F\), found \(5,\)"):
        from_dgl(TinyDGLGraph(SRC, DST, 5, {"feat": torch.zeros(5)}))
    with pytest.raises(ConfigError, match="node id 5 is out of range"):
        from_dgl(TinyDGLGraph([0], [5], 5, {}))
