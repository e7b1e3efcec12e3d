import numpy as np
import pytest

from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError
from haloflow.partition.halo import build_parts
from haloflow.partition.stats import PartitionStats, format_stats, partition_stats
from tests.partition.part_oracle import relabelling_from_parts, small_dataset


def test_hand_built_example():
    graph = CSRGraph.from_edges(np.array([0, 3, 4, 1, 2, 3]), np.array([1, 1, 2, 3, 4, 4]), 5)
    rel = relabelling_from_parts(np.array([0, 0, 0, 1, 1]), 2)
    train = np.array([True, True, False, True, False])
    s = partition_stats(graph, rel, train_mask=train)
    assert (s.num_nodes, s.num_edges, s.cut_edges, s.num_parts) == (5, 6, 4, 2)
    assert s.edge_cut == pytest.approx(4 / 6)
    assert s.inner.tolist() == [3, 2] and s.halo.tolist() == [2, 2] and s.in_edges.tolist() == [3, 3]
    assert s.halo_ratio.tolist() == pytest.approx([2 / 3, 1.0])
    assert s.train.tolist() == [2, 1] and s.total_halo == 4
    assert s.balance == pytest.approx({"nodes": 3 / 2.5, "edges": 1.0, "train": 2 / 1.5})


def test_random_partition_against_brute_force_and_built_parts():
    ds = small_dataset(seed=7)
    k = 5
    assign = np.random.default_rng(7).integers(0, k, ds.num_nodes)
    assign[assign == 3] = 0  # one empty part: its ratio is 0, not a division by zero
    rel = relabelling_from_parts(assign, k)
    s = partition_stats(ds.graph, rel, train_mask=ds.train_mask)
    src, dst = ds.graph.edges()
    assert s.cut_edges == int(np.count_nonzero(assign[src] != assign[dst]))
    assert s.inner.tolist() == np.bincount(assign, minlength=k).tolist()
    assert s.in_edges.tolist() == np.bincount(assign[dst], minlength=k).tolist()
    assert s.train.tolist() == np.bincount(assign[ds.train_mask], minlength=k).tolist()
    parts = list(build_parts(ds.graph, rel))
    assert s.halo.tolist() == [p.n_halo for p in parts]
    assert s.halo_ratio[3] == 0.0
    nodes = np.bincount(assign, minlength=k)
    assert s.balance["nodes"] == pytest.approx(nodes.max() / nodes.mean())
    again = PartitionStats.from_dict(s.to_dict())
    assert again.to_dict() == s.to_dict()


def test_validation():
    ds = small_dataset(seed=8, num_nodes=30, num_edges=60)
    rel = relabelling_from_parts(np.zeros(30, np.int64), 1)
    with pytest.raises(ConfigError, match=r"train_mask must have shape \(30,\), got \(29,\)"):
        partition_stats(ds.graph, rel, train_mask=np.zeros(29, bool))
    s = partition_stats(ds.graph, rel)
    assert s.train is None and "train" not in s.balance and s.edge_cut == 0.0
    with pytest.raises(ConfigError, match=r"halo must have shape \(1,\)"):
        PartitionStats(num_nodes=30, num_edges=60, cut_edges=0, inner=s.inner, halo=np.zeros(2, np.int64),
                       in_edges=s.in_edges)


def test_format_stats_lists_parts_totals_cut_and_balance():
    graph = CSRGraph.from_edges(np.array([0, 3, 4, 1, 2, 3]), np.array([1, 1, 2, 3, 4, 4]), 5)
    s = partition_stats(graph, relabelling_from_parts(np.array([0, 0, 0, 1, 1]), 2))
    lines = format_stats(s).splitlines()
    assert lines[0].split() == ["part", "inner", "halo", "halo/inner", "edges"]
    assert lines[2].split() == ["0", "3", "2", "0.667", "3"]
    assert lines[3].split() == ["1", "2", "2", "1.000", "3"]
    assert lines[4].split() == ["total", "5", "4", "0.800", "6"]
    assert lines[5] == "edge cut: 66.67% (4 of 6 edges cross parts)"
    assert lines[6] == "balance (largest / mean part): nodes 1.200, edges 1.000"
