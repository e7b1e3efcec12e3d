"""NodeOwners.from_partition: the owners and rows the parts hold, read from meta.json and the id map (no part)."""

import json

import numpy as np
import pytest

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.engine.tgn.memory import NodeOwners
from haloflow.errors import ConfigError, PartitionFormatError
from haloflow.partition.api import PartitionConfig
from haloflow.partition.format import PartitionMeta, load_partition, part_loads, reset_part_loads, save_partitioned
from haloflow.partition.halo import build_parts
from haloflow.partition.pipeline import partition_dataset
from haloflow.partition.stats import partition_stats
from tests.partition.part_oracle import relabelling_from_parts


def _folder(path, src, dst, parts, num_parts):
    """A partition folder of the graph ``src -> dst`` cut by the hand-made assignment ``parts``."""
    graph = CSRGraph.from_edges(np.asarray(src), np.asarray(dst), len(parts), symmetrize=True)
    rel = relabelling_from_parts(parts, num_parts)
    meta = PartitionMeta(method="hand-made", seed=0, num_parts=num_parts, num_nodes=graph.num_nodes,
                         num_edges=graph.num_edges, bounds=tuple(rel.book.bounds.tolist()),
                         stats=partition_stats(graph, rel))
    save_partitioned(path, build_parts(graph, rel), meta, new_to_orig=rel.new_to_orig)
    return path


def _owners_by_loading_every_part(folder, num_nodes):
    """The brute-force oracle: load all K parts and read who holds each original id, at which row."""
    owner, row, counts = np.full(num_nodes, -1), np.zeros(num_nodes, dtype=np.int64), []
    k = 0
    while (folder / f"part-{k}").is_dir():
        ids = np.asarray(load_partition(folder, k).orig_ids)
        owner[ids], row[ids] = k, np.arange(ids.size)
        counts.append(ids.size)
        k += 1
    return owner, row, tuple(counts)


def test_owners_of_a_hand_made_partition(tmp_path):
    # parts [0, 1, 0, 1, 0]: new ids 0 1 2 | 3 4 are the original nodes 0 2 4 | 1 3
    folder = _folder(tmp_path / "p", [0, 1, 2, 3], [1, 2, 3, 4], [0, 1, 0, 1, 0], 2)
    owners = NodeOwners.from_partition(folder, 5)
    assert owners.owner.tolist() == [0, 1, 0, 1, 0]
    assert owners.row.tolist() == [0, 0, 1, 1, 2]
    assert owners.counts == (3, 2) and owners.num_parts == 2


@pytest.mark.parametrize("k", [1, 3, 4])
def test_owners_equal_what_the_parts_hold_and_no_part_is_loaded(tmp_path, k):
    rng = np.random.default_rng(k)
    n = 90
    src, dst = rng.integers(0, n, 300), rng.integers(0, n, 300)
    folder = tmp_path / "p"
    partition_dataset(GraphDataset(CSRGraph.from_edges(src, dst, n, symmetrize=True)),
                      PartitionConfig(num_parts=k, method="random", seed=k), folder, progress=False)
    reset_part_loads()
    owners = NodeOwners.from_partition(folder, n)
    assert part_loads(folder) == {}  # meta.json and new_to_orig.npy only
    owner, row, counts = _owners_by_loading_every_part(folder, n)
    assert np.array_equal(owners.owner, owner) and np.array_equal(owners.row, row) and owners.counts == counts


def test_a_folder_of_another_stream_is_refused(tmp_path):
    folder = _folder(tmp_path / "p", [0, 1, 2, 3], [1, 2, 3, 4], [0, 1, 0, 1, 0], 2)
    with pytest.raises(ConfigError, match="part 0 holds node 4 but the event stream has 4 nodes"):
        NodeOwners.from_partition(folder, 4)
    with pytest.raises(ConfigError, match=r"no part holds node 5 \(2 nodes of the stream are missing\)"):
        NodeOwners.from_partition(folder, 7)


def test_a_folder_without_the_id_map_says_to_partition_again(tmp_path):
    folder = _folder(tmp_path / "p", [0, 1, 2, 3], [1, 2, 3, 4], [0, 1, 0, 1, 0], 2)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["files"]["new_to_orig.npy"]
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "new_to_orig.npy").unlink()
    with pytest.raises(PartitionFormatError, match=r"meta.json lists no new_to_orig.npy .*`haloflow partition`"):
        NodeOwners.from_partition(folder, 5)


def test_v_parts_hosted_on_k_ranks_keep_each_part_s_rows_together():
    parts = NodeOwners(np.array([0, 1, 2, 3, 0, 1, 2, 3, 0, 2]), np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2]),
                       (3, 2, 3, 2))
    two = parts.hosted(2)  # rank 0: parts 0, 1 (rows 0-2, then 3-4); rank 1: parts 2, 3 (rows 0-2, then 3-4)
    assert two.counts == (5, 5)
    assert two.owner.tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 0, 1]
    assert two.row.tolist() == [0, 3, 0, 3, 1, 4, 1, 4, 2, 2]
    one = parts.hosted(4)
    assert one.counts == (10,) and sorted(one.row.tolist()) == list(range(10))
    assert parts.hosted(1) is parts
    with pytest.raises(ConfigError, match="4 parts cannot be hosted 3 per rank"):
        parts.hosted(3)
