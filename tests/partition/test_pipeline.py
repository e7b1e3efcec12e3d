import numpy as np
import pytest

from haloflow.errors import ConfigError
from haloflow.partition.api import PartitionConfig
from haloflow.partition.format import load_meta, load_new_to_orig, load_partition
from haloflow.partition.pipeline import partition_dataset, read_input
from tests.partition.part_oracle import check_parts, small_dataset


@pytest.fixture(scope="module")
def dataset():
    return small_dataset(seed=21)


@pytest.mark.parametrize("method", ["metis", "fennel", "random"])
def test_round_trip_every_method_and_k(tmp_path, dataset, method):
    # Save, load every part, map back to original ids: the parts must cut the input exactly (see part_oracle).
    for k in (1, 2, 3, 8):
        out = tmp_path / f"{method}-{k}"
        summary = partition_dataset(dataset, PartitionConfig(num_parts=k, method=method, seed=k), out, progress=False)
        meta = load_meta(out)
        assert (meta.method, meta.num_parts, meta.num_nodes, meta.num_edges) == (
            method, k, dataset.num_nodes, dataset.graph.num_edges)
        assert meta.stats.to_dict() == summary.stats.to_dict() and meta.config["num_parts"] == k
        parts = [load_partition(out, p) for p in range(k)]
        check_parts(dataset.graph, parts, np.asarray(load_new_to_orig(out)), dataset)
        assert summary.stats.total_halo == sum(p.n_halo for p in parts)
        assert summary.stats.edge_cut == (0.0 if k == 1 else pytest.approx(summary.stats.cut_edges / meta.num_edges))
        assert summary.wall_time_s > 0 and summary.peak_memory_bytes > 0
        assert list(summary.stage_times) == ["partition", "relabel", "halo index", "build + write"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{method}-{k}" for k in (1, 2, 3, 8)]


def test_balance_on_train_nodes_is_recorded(tmp_path, dataset):
    config = PartitionConfig(num_parts=4, method="metis", balance=("nodes", "train"), imbalance=1.1)
    summary = partition_dataset(dataset, config, tmp_path / "out", progress=False)
    assert set(summary.stats.balance) == {"nodes", "edges", "train"}
    assert summary.stats.balance["train"] <= 1.1 + 1e-9
    assert "train" in summary.report() and "peak memory" in summary.report()
    assert load_meta(tmp_path / "out").config["balance"] == ["nodes", "train"]


def test_bad_requests_leave_nothing(tmp_path, dataset):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"num_parts=201 exceeds the graph's 200 nodes"):
        partition_dataset(dataset, PartitionConfig(num_parts=201, method="random"), out, progress=False)
    assert not out.exists()
    out.mkdir()
    with pytest.raises(ConfigError, match=r"out already exists; pass overwrite=True"):
        partition_dataset(dataset, PartitionConfig(num_parts=2), out, progress=False)
    partition_dataset(dataset, PartitionConfig(num_parts=2), out, overwrite=True, progress=False)
    assert load_meta(out).num_parts == 2


def test_read_input_symmetrises_by_default(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("# a directed graph\n0\t1\n1\t2\n2\t2\n0\t1\n")
    directed = read_input(path, symmetrize=False)
    undirected = read_input(path)
    src, dst = directed.graph.edges()
    assert sorted(zip(src.tolist(), dst.tolist())) == [(0, 1), (0, 1), (1, 2), (2, 2)]
    src, dst = undirected.graph.edges()
    assert sorted(zip(src.tolist(), dst.tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 2)]
