"""A partition folder is opened once per rank: on 2 real gloo ranks, rank r loads no part but part r, at most once.

Counted by ``haloflow.partition.format.part_loads`` inside each rank (tests/engine/scripts/part_loads.py).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.data.temporal import read_jodie_csv
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.conftest import run_torchrun
from tests.engine.scripts.common import small_dataset

SCRIPT = Path(__file__).parents[1] / "engine" / "scripts" / "part_loads.py"
K = 2


def _write_events(path: Path, num_events: int = 600, users: int = 40, items: int = 20, seed: int = 0) -> Path:
    """A small JODIE CSV (``u,i,ts,label,f0,f1``): users 0..39 visit items 40..59, times ascending."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, users, num_events)
    dst = users + rng.integers(0, items, num_events)
    t = np.cumsum(rng.integers(0, 4, num_events))
    feat = rng.standard_normal((num_events, 2))
    rows = "".join(f"{s},{d},{ts},0,{a:.4f},{b:.4f}\n" for s, d, ts, (a, b) in zip(src, dst, t, feat))
    path.write_text("u,i,ts,label,f0,f1\n" + rows)
    return path


@pytest.mark.slow
def test_each_rank_loads_its_own_part_once(tmp_path):
    gcn_parts, tgn_parts = tmp_path / "gcn", tmp_path / "tgn"
    partition_dataset(small_dataset(), PartitionConfig(num_parts=K, method="random", seed=1), gcn_parts,
                      progress=False)
    events = read_jodie_csv(_write_events(tmp_path / "events.csv"))
    graph = CSRGraph.from_edges(events.src, events.dst, events.num_nodes, symmetrize=True)  # the event graph
    partition_dataset(GraphDataset(graph, name="events"), PartitionConfig(num_parts=K, method="random", seed=1),
                      tgn_parts, progress=False)
    proc = run_torchrun(SCRIPT, K, [gcn_parts, tgn_parts, tmp_path / "events.csv", tmp_path], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in range(K):
        loads = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert loads["gcn"] == {str(r): 1}, f"rank {r}"  # its part, once
        # TGN trains on the event stream and needs only the owners (meta.json + new_to_orig.npy): today no part
        # at all; never another rank's, never twice
        assert loads["tgn"] in ({}, {str(r): 1}), f"rank {r}: {loads['tgn']}"
