"""The out-of-core pipeline against the in-memory one: the same folder, file for file, with a budget that forces
many buckets, blocks and chunks; its errors; and that a failed or interrupted run leaves nothing behind."""

import hashlib
import json
import logging

import numpy as np
import pytest

from haloflow.data.binary_edges import NpyEdges
from haloflow.data.streamed import PaceEdges, SnapEdges
from haloflow.data.generators import RMATConfig, rmat_chunks, sbm_dataset
from haloflow.data.graph_folder import GraphFolder, write_graph_folder
from haloflow.data.metis_graph import MetisEdges
from haloflow.errors import ConfigError
from haloflow.partition.api import PartitionConfig
from haloflow.partition.format import load_meta, verify_partition
from haloflow.partition.ooc import OutOfCoreConfig, partition_out_of_core
from haloflow.partition.pipeline import partition_dataset, read_input

# A budget for the pipeline's own arrays and chunks (baseline 0: the test process's torch does not count), far
# below what these graphs take in memory: the edges alone are 8 x 2 x E bytes as int64 pairs, before any CSR.
TINY = OutOfCoreConfig(memory_budget=800_000, baseline=0)


def _digest(folder):
    """{relative path: sha256} of every file of a partition folder."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _in_memory(tmp_path, path, config, name="mem", **read):
    out = tmp_path / name
    partition_dataset(read_input(path, **read), config, out, progress=False)
    return out


@pytest.fixture(scope="module")
def rmat_folder(tmp_path_factory):
    """R-MAT scale 13 (8,192 nodes, 131,072 directed edges with repeats and self-loops) plus node data."""
    folder = tmp_path_factory.mktemp("rmat") / "rmat13"
    cfg = RMATConfig(scale=13, edge_factor=16, seed=5, chunk_size=10_000)
    rng = np.random.default_rng(0)
    n = cfg.num_nodes
    train = rng.random(n) < 0.3
    labels = np.where(~train & (rng.random(n) < 0.2), -1, rng.integers(0, 6, n))  # some unlabelled, none in train
    write_graph_folder(folder, edges=rmat_chunks(cfg), num_edges=cfg.total_edges, node_data={
        "features": rng.standard_normal((n, 5)).astype(np.float32), "labels": labels,
        "train_mask": train, "val_mask": ~train & (rng.random(n) < 0.5), "test_mask": np.zeros(n, bool)})
    return folder


@pytest.mark.parametrize("method, k, passes, balance", [
    ("fennel", 4, 2, ("nodes",)), ("fennel", 7, 1, ("nodes",)), ("random", 3, 1, ("nodes",)),
    ("fennel", 4, 3, ("nodes", "edges")), ("fennel", 6, 2, ("edges", "nodes", "train")),
])
def test_rmat_folder_equals_the_in_memory_folder(tmp_path, rmat_folder, method, k, passes, balance):
    # with several weights, both streams score every weight: the out-of-core one gets the in-degrees from its
    # degree pass and the training mask from the node files before its first pass
    config = PartitionConfig(num_parts=k, method=method, seed=11, passes=passes, fennel_start="stream",
                             fennel_order="natural", balance=balance)
    mem = _in_memory(tmp_path, rmat_folder, config)
    opened = GraphFolder(rmat_folder)
    summary = partition_out_of_core(opened.edges, config, TINY, tmp_path / "ooc", nodes=opened.nodes, progress=False)
    assert summary.num_buckets >= 8  # the budget forced an external sort of many runs
    assert _digest(tmp_path / "ooc") == _digest(mem)  # assignment (new_to_orig), every array, meta.json
    assert summary.stats.to_dict() == load_meta(mem).stats.to_dict()
    verify_partition(tmp_path / "ooc")
    assert not list(tmp_path.glob(".haloflow-ooc-*")) and summary.temp_peak_bytes > 0


def test_auto_choices_resolve_to_the_streamed_fennel_and_are_recorded(tmp_path, rmat_folder):
    opened = GraphFolder(rmat_folder)
    partition_out_of_core(opened.edges, PartitionConfig(num_parts=4, method="fennel"), TINY, tmp_path / "ooc",
                          nodes=opened.nodes, progress=False)
    config = load_meta(tmp_path / "ooc").config
    assert (config["fennel_start"], config["fennel_order"], config["passes"]) == ("stream", "natural", 4)
    mem = _in_memory(tmp_path, rmat_folder, PartitionConfig(num_parts=4, method="fennel", fennel_start="stream",
                                                            fennel_order="natural"))
    assert _digest(tmp_path / "ooc") == _digest(mem)


def test_two_weights_stream_within_the_caps_without_reading_the_csr_again(tmp_path, rmat_folder, caplog):
    # the weighted stream ends within every cap, so the balance step moves nothing and never maps the CSR
    config = PartitionConfig(num_parts=4, method="fennel", balance=("nodes", "edges"), passes=3)
    opened = GraphFolder(rmat_folder)
    with caplog.at_level(logging.INFO, logger="haloflow.partition.ooc.stream"):
        summary = partition_out_of_core(opened.edges, config, TINY, tmp_path / "ooc", nodes=opened.nodes,
                                        progress=False)
    assert not [r for r in caplog.records if "rebalancing reads the CSR" in r.getMessage()]
    balance = summary.stats.balance
    assert balance["nodes"] <= 1.05 and balance["edges"] <= 1.05, balance


def test_directed_graph_keeps_repeats_and_balances_train_nodes(tmp_path, rmat_folder):
    # --no-symmetrize: rows hold the in-edges as given, repeats included; a second balanced weight may make
    # the balance step move vertices (it then reads the on-disk CSR through a memory map)
    config = PartitionConfig(num_parts=5, method="fennel", balance=("nodes", "train"), seed=2, passes=2,
                             fennel_start="stream", fennel_order="natural")
    mem = _in_memory(tmp_path, rmat_folder, config, symmetrize=False)
    opened = GraphFolder(rmat_folder)
    partition_out_of_core(opened.edges, config, TINY, tmp_path / "ooc", nodes=opened.nodes, symmetrize=False,
                          progress=False)
    assert _digest(tmp_path / "ooc") == _digest(mem)


def test_text_and_metis_inputs(tmp_path):
    data = sbm_dataset(num_nodes=2000, seed=9)
    src, dst = data.graph.edges()
    keep = src < dst  # each undirected edge once, shuffled, as a SNAP file holds it
    order = np.random.default_rng(1).permutation(int(keep.sum()))
    pairs = np.stack([src[keep], dst[keep]], 1)[order]
    snap = tmp_path / "g.txt"
    snap.write_text("# an undirected graph\n" + "".join(f"{s}\t{d}\n" for s, d in pairs))
    metis = tmp_path / "g.graph"
    g = data.graph
    metis.write_text(f"{g.num_nodes} {g.num_edges // 2}\n" + "".join(
        " ".join(str(u + 1) for u in g.indices[g.indptr[v]:g.indptr[v + 1]]) + "\n" for v in range(g.num_nodes)))
    pace = tmp_path / "g.gr"  # each edge once, 1-based, with comments between the lines
    pace.write_text(f"c a road-like file\np tw {g.num_nodes} {len(pairs)}\n" + "".join(
        f"{s + 1} {d + 1}\n" + ("c a comment\n" if i % 97 == 0 else "") for i, (s, d) in enumerate(pairs)))
    config = PartitionConfig(num_parts=3, method="fennel", seed=4, fennel_start="stream", fennel_order="natural")
    for path, source in ((snap, SnapEdges(snap, progress=False)), (metis, MetisEdges(metis, progress=False)),
                         (pace, PaceEdges(pace, progress=False))):
        mem = _in_memory(tmp_path, path, config, name=f"mem-{path.suffix}")
        out = tmp_path / f"ooc-{path.suffix}"
        partition_out_of_core(source, config, TINY, out, progress=False)
        assert _digest(out) == _digest(mem), path


@pytest.mark.parametrize("balance", [("nodes",), ("nodes", "edges")])
def test_multilevel_out_of_core_equals_the_in_memory_multilevel(tmp_path, balance):
    """The out-of-core multilevel start (level 0 read from the on-disk CSR) writes the in-memory run's folder; a
    budget that cannot hold level 1 says so in one line."""
    from tests.partition.test_fennel import grid

    g = grid(150, 150)
    src, dst = g.edges()
    keep = src < dst
    path = tmp_path / "mesh.txt"
    path.write_text("".join(f"{s} {d}\n" for s, d in zip(src[keep], dst[keep])))
    config = PartitionConfig(num_parts=4, method="fennel", seed=3, fennel_start="multilevel", fennel_order="natural",
                             balance=balance)
    mem = _in_memory(tmp_path, path, config)
    out = tmp_path / "ooc"
    budget = OutOfCoreConfig(memory_budget=8_000_000, baseline=0)  # level 1 fits (blocks: test_multilevel.py)
    summary = partition_out_of_core(SnapEdges(path, progress=False), config, budget, out, progress=False)
    assert _digest(out) == _digest(mem)
    assert load_meta(out).edge_cut < 0.02  # a mesh cut along a few lines (streaming Fennel: ~0.1 in id order)
    assert any(name.startswith("multilevel cluster sweep") for name in summary.stage_times), summary.stage_times
    with pytest.raises(ConfigError, match="the graph's first coarse level does not fit in what --memory-budget"):
        partition_out_of_core(SnapEdges(path, progress=False), config, OutOfCoreConfig(memory_budget=3_000_000,
                              baseline=0), tmp_path / "small", progress=False)
    assert not (tmp_path / "small").exists()


def test_a_pace_file_streamed_is_checked_as_read_pace_checks_it(tmp_path):
    """The streamed reader shares read_pace's checks: the line of a bad edge, the header's m and n."""
    from haloflow.data.readers import read_pace
    from haloflow.errors import InputFormatError

    cases = {"bad.gr": ("p tw 3 2\n1 2\n2 x\n", "bad.gr:3: "), "m.gr": ("p tw 3 3\n1 2\n2 3\n", "m = 3 edges"),
             "range.gr": ("p tw 3 2\n1 2\n2 4\n", "range.gr:3: "), "nohead.gr": ("c only\n1 2\n", "missing header")}
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(InputFormatError) as in_memory:
            read_pace(path)
        with pytest.raises(InputFormatError) as streamed:
            source = PaceEdges(path, progress=False)
            edges = sum(len(s) for s, _ in source.chunks(1 << 10))
            source.finish(edges, -1)
        assert message in str(in_memory.value) and str(streamed.value) == str(in_memory.value), name


def test_one_part(tmp_path, rmat_folder):
    config = PartitionConfig(num_parts=1, method="fennel")
    opened = GraphFolder(rmat_folder)
    partition_out_of_core(opened.edges, config, TINY, tmp_path / "ooc", nodes=opened.nodes, progress=False)
    mem = _in_memory(tmp_path, rmat_folder, PartitionConfig(num_parts=1, method="fennel", fennel_start="stream",
                                                            fennel_order="natural"))
    assert _digest(tmp_path / "ooc") == _digest(mem)


def test_trains_a_gcn_to_the_same_losses(tmp_path):
    torch = pytest.importorskip("torch")
    from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
    from haloflow.engine.runtime import RuntimeConfig

    folder = write_graph_folder(tmp_path / "sbm", sbm_dataset(num_nodes=1500, seed=3))
    config = PartitionConfig(num_parts=1, method="random")
    mem = _in_memory(tmp_path, folder, config)
    opened = GraphFolder(folder)
    partition_out_of_core(opened.edges, config, TINY, tmp_path / "ooc", nodes=opened.nodes, progress=False)
    losses = []
    for out in (mem, tmp_path / "ooc"):
        torch.manual_seed(0)
        result = train_gcn(GCNTrainConfig(partitions=out, epochs=3, runtime=RuntimeConfig(progress=False)))
        losses.append([h.loss for h in result.history])
    assert losses[0] == losses[1] and len(losses[0]) == 3


def test_a_budget_too_small_for_the_node_arrays_fails_at_once(tmp_path, rmat_folder):
    opened = GraphFolder(rmat_folder)
    with pytest.raises(ConfigError) as err:
        partition_out_of_core(opened.edges, PartitionConfig(num_parts=4, method="fennel"),
                              OutOfCoreConfig(memory_budget=200_000, baseline=0), tmp_path / "ooc",
                              nodes=opened.nodes, progress=False)
    line = str(err.value)
    assert "\n" not in line and "its 8,192 nodes need 25 bytes per node" in line
    assert "expected --memory-budget >=" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_unknown_node_count_is_checked_as_it_grows(tmp_path):
    np.save(tmp_path / "e.npy", np.array([[0, 1], [5, 100_000], [7, 8]]))
    with pytest.raises(ConfigError, match=r"its at least 100,001 nodes need 25 bytes per node"):
        partition_out_of_core(NpyEdges(tmp_path / "e.npy"), PartitionConfig(num_parts=2, method="random"),
                              OutOfCoreConfig(memory_budget=1_500_000, baseline=0), tmp_path / "ooc", progress=False)


@pytest.mark.parametrize("config, message", [
    (PartitionConfig(num_parts=2, method="metis"), r"method 'metis' needs it whole in memory: expected --method fen"),
    (PartitionConfig(num_parts=2, method="fennel", fennel_start="bisect"), r"fennel_start='bisect' needs the whole"),
    (PartitionConfig(num_parts=2, method="fennel", fennel_order="bfs"), r"fennel_order='bfs' visits rows in random"),
])
def test_methods_that_cannot_stream_are_refused(tmp_path, rmat_folder, config, message):
    with pytest.raises(ConfigError, match=message):
        partition_out_of_core(GraphFolder(rmat_folder).edges, config, TINY, tmp_path / "ooc", progress=False)


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
def test_a_failed_or_interrupted_run_leaves_nothing(tmp_path, rmat_folder, monkeypatch, error):
    import haloflow.partition.ooc.build as build

    real = build._local_csr

    def fail_in_part_2(buckets, k, *args):
        if k == 2:
            raise error("stopped")
        return real(buckets, k, *args)

    monkeypatch.setattr(build, "_local_csr", fail_in_part_2)
    work = tmp_path / "work"
    opened = GraphFolder(rmat_folder)
    with pytest.raises(error):
        partition_out_of_core(opened.edges, PartitionConfig(num_parts=4, method="fennel"),
                              OutOfCoreConfig(memory_budget=800_000, baseline=0, tmp_dir=work), tmp_path / "ooc",
                              nodes=opened.nodes, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"] and list(work.iterdir()) == []


def test_report_names_the_budget_and_the_temporary_files(tmp_path, rmat_folder, caplog):
    opened = GraphFolder(rmat_folder)
    with caplog.at_level(logging.INFO):
        summary = partition_out_of_core(opened.edges, PartitionConfig(num_parts=2, method="random"), TINY,
                                        tmp_path / "ooc", nodes=opened.nodes, progress=False)
    text = summary.report()
    assert "memory budget: 781.2 KiB" in text and "temporary files:" in text and "removed" in text
    assert list(summary.stage_times) == ["count", "bucket sort", "partition", "relabel + route", "halo",
                                         "build + write"]
    summary = partition_out_of_core(opened.edges, PartitionConfig(num_parts=2, method="fennel", passes=2), TINY,
                                    tmp_path / "ooc2", nodes=opened.nodes, progress=False)
    assert list(summary.stage_times)[2:5] == ["fennel pass 1", "fennel pass 2", "balance"]
    assert json.loads((tmp_path / "ooc" / "meta.json").read_text())["num_nodes"] == 8192
