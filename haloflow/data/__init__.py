"""Data: graphs (the CSR format, readers for the formats users hold, generators), click logs and event streams.

The graph side needs only numpy; the click-log side (Parquet, torch batches) and the event-stream side (pyarrow,
numba) are imported on first use, so that ``import haloflow.data`` (and every ``haloflow.data.<module>`` import,
which runs this file) stays light.
"""

from haloflow._lazy import lazy_getattr
from haloflow.data.convert import from_dgl, from_pyg
from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.data.ogb import read_ogb
from haloflow.data.paths import data_root
from haloflow.data.planetoid import read_planetoid
from haloflow.data.readers import FORMATS, detect_format, read_dataset, read_pace, read_snap

__all__ = [
    "CSRGraph",
    "GraphDataset",
    "data_root",
    "FORMATS",
    "detect_format",
    "read_dataset",
    "read_snap",
    "read_pace",
    "read_ogb",
    "read_planetoid",
    "from_pyg",
    "from_dgl",
]

# Click logs: torch and pyarrow, imported on first use.
_LAZY = {
    "JaggedBatch": "haloflow.data.jagged",
    "ClickBatch": "haloflow.data.jagged",
    "ClickLogConfig": "haloflow.data.clicks",
    "ClickLogGenerator": "haloflow.data.clicks",
    "CriteoPreprocessConfig": "haloflow.data.criteo",
    "preprocess_criteo": "haloflow.data.criteo",
    "ClickLoader": "haloflow.data.criteo_loader",
    "ClickLoaderConfig": "haloflow.data.criteo_loader",
}
# Event streams (temporal GNNs): pyarrow and numba, imported on first use.
_LAZY.update({
    name: "haloflow.data.temporal"
    for name in ("TemporalEvents", "read_jodie_csv", "read_snap_temporal", "TemporalSplit", "chronological_split",
                 "InductiveSplit", "inductive_nodes")
})
_LAZY.update({
    name: "haloflow.data.temporal_sampler" for name in ("TemporalCSR", "RecentNeighbors", "NegativeSampler")
})
__all__ += list(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY)
