"""Graph data: the CSR format, readers for the formats users hold, and generators."""

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.data.paths import data_root

__all__ = ["CSRGraph", "GraphDataset", "data_root"]
from haloflow.data.jagged import JaggedBatch

__all__ += ["JaggedBatch"]
from haloflow.data.convert import from_dgl, from_pyg
from haloflow.data.ogb import read_ogb
from haloflow.data.planetoid import read_planetoid
from haloflow.data.readers import FORMATS, detect_format, read_dataset, read_pace, read_snap

__all__ += ["read_snap", "read_pace", "read_ogb", "read_planetoid", "from_pyg", "from_dgl", "read_dataset",
            "detect_format", "FORMATS"]
from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.data.criteo import CriteoPreprocessConfig, preprocess_criteo
from haloflow.data.criteo_loader import ClickLoader, ClickLoaderConfig
from haloflow.data.jagged import ClickBatch

__all__ += ["ClickBatch", "ClickLoader", "ClickLoaderConfig", "ClickLogConfig", "ClickLogGenerator",
            "CriteoPreprocessConfig", "preprocess_criteo"]
