import numpy as np
import pytest

from haloflow.data.generators import sbm_dataset
from haloflow.errors import ConfigError
from haloflow.partition.api import PartitionConfig, partition_graph
from haloflow.partition.balance import balance_caps, balance_weights, part_loads


@pytest.fixture(scope="module")
def graph():
    return sbm_dataset(num_nodes=1200, num_classes=4, seed=7).graph


def _cut(g, parts):
    src, dst = g.edges()
    return float((parts[src] != parts[dst]).mean())


@pytest.mark.parametrize("method", ["kahip", "mtkahypar"])
def test_cuts_like_metis_within_the_caps_and_repeats_with_the_seed(graph, method):
    pytest.importorskip(method)
    for balance in (("nodes",), ("nodes", "edges")):
        config = PartitionConfig(num_parts=4, method=method, balance=balance, seed=3)
        parts = partition_graph(graph, config).parts
        weights = balance_weights(graph.in_degree(), balance)
        assert np.all(part_loads(parts, weights, 4).max(0) <= balance_caps(weights, 4, 1.05))
        assert np.array_equal(parts, partition_graph(graph, config).parts)
        metis = partition_graph(graph, PartitionConfig(num_parts=4, method="metis", balance=balance)).parts
        random = partition_graph(graph, PartitionConfig(num_parts=4, method="random", balance=balance)).parts
        assert _cut(graph, parts) <= 1.3 * _cut(graph, metis) < _cut(graph, random)


def test_a_missing_package_is_one_line(graph, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_kahip(name, *args, **kw):
        if name == "kahip":
            raise ImportError("No module named 'kahip'")
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_kahip)
    monkeypatch.delitem(__import__("sys").modules, "kahip", raising=False)
    with pytest.raises(ConfigError, match=r"method 'kahip' needs the kahip package, which is not installed: pip"):
        partition_graph(graph, PartitionConfig(num_parts=2, method="kahip"))
