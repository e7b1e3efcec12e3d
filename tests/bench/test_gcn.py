"""bench gcn's DGL rows: without the peer the table says how to build it; a peer that fails leaves no process or
temporary data behind; with the peer (scripts/setup_peers.sh dgl) a tiny run measures both DGL rows and finds
DGL's first loss equal to haloflow's. No timings are asserted."""

import json
import sys
import tempfile

import pytest

from haloflow.bench.gcn import main
from haloflow.bench.peer import PeerError, default_peer_python

TINY = ["--nodes", "200", "--entries", "2000", "--in-dim", "8", "--hidden", "8", "--out-dim", "4", "--epochs", "1",
        "--warmup", "1", "--spmm-repeats", "1", "--widths", "8", "--skip", "pyg-edge_index"]


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """tempfile's folders go under tmp_path, so a test can see that none is left behind."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_without_the_peer_the_table_says_how_to_build_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HALOFLOW_PEERS", str(tmp_path / "no-peers"))
    out = tmp_path / "gcn.json"
    assert main([*TINY, "--out", str(out)]) == 0
    assert "dgl: not installed (bash scripts/setup_peers.sh dgl)" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["dgl"] == "not installed" and report["dgl_loss_equal"] is None
    assert not {"dgl", "dgl-nodropout"} & report["epochs"].keys()


def test_a_missing_peer_python_names_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--dgl-python .*no-python: no such file; .*setup_peers.sh dgl"):
        main([*TINY, "--dgl-python", str(tmp_path / "no-python"), "--out", str(tmp_path / "gcn.json")])


def test_a_failing_peer_raises_its_message_and_leaves_nothing_behind(tmp_path, own_tmp):
    # our own Python has no dgl: the peer starts, answers its setup with an error and exits
    with pytest.raises(PeerError, match="dgl does not import"):
        main([*TINY, "--dgl-python", sys.executable, "--out", str(tmp_path / "gcn.json")])
    # the graph's .npz went with its folder; PyG renders GCNConv's propagate into a module file of its own the first
    # time a process builds one (whether that is this test depends on what ran before in this worker): not ours
    assert not [p for p in own_tmp.iterdir() if not p.name.startswith("torch_geometric.")]


@pytest.mark.skipif(default_peer_python("dgl") is None,
                    reason="no DGL peer (build it with `bash scripts/setup_peers.sh dgl`)")
def test_the_dgl_peer_runs_both_rows_and_computes_haloflows_first_loss(tmp_path, own_tmp, capsys):
    out = tmp_path / "gcn.json"
    assert main([*TINY, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {"dgl", "dgl-nodropout"} <= report["epochs"].keys() and report["dgl"] == "measured"
    assert report["dgl_peer"]["dgl"].startswith("2.1")
    assert report["dgl_loss_equal"] is True, report["first_loss"]
    assert report["ratios_vs_dgl"]["haloflow-nodropout"] > 0 and report["target_ratio_vs_dgl"] == 0.65
    text = capsys.readouterr().out
    assert "same math: first-epoch loss" in text and ": equal (rel" in text
    assert not list(own_tmp.iterdir())
