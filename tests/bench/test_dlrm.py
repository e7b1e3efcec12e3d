"""bench dlrm's TorchRec peer: what it says where TorchRec does not import (our own Python), the benchmark without
it, and, where ``scripts/setup_peers.sh torchrec`` has built it, a tiny race whose warm-up losses must agree (no
timings are asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from haloflow.bench import peer
from haloflow.bench.dlrm import NOT_INSTALLED, main
from haloflow.bench.peer import PEERS_DIR_ENV, PeerError, PeerProcess, default_peer_python

SCRIPT = Path(peer.__file__).with_name("peers") / "torchrec_dlrm.py"
TINY = ["--max-rows", "1000", "--steps", "4", "--warmup", "2", "--rounds", "2", "--ranks"]


def _setup(folder):
    return {"folder": str(folder), "table_sizes": [10, 20], "dim": 4, "dense_in": 13, "bottom": [8, 4],
            "top": [8, 1], "lr": 0.1, "threads": 1}


def test_without_torchrec_the_peer_answers_one_error_line_and_exits_non_zero(tmp_path):
    # our own .venv has no torchrec: the script still speaks the protocol
    proc = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps({"setup": _setup(tmp_path)}) + "\n",
                          capture_output=True, text=True, timeout=120)
    (line,) = proc.stdout.splitlines()
    assert "torchrec does not import" in json.loads(line)["error"]
    assert "setup_peers.sh torchrec" in json.loads(line)["error"]
    assert proc.returncode != 0


def test_without_torchrec_peer_process_raises_the_peers_message(tmp_path):
    with pytest.raises(PeerError, match="peer torchrec_dlrm: .*torchrec does not import"):
        PeerProcess(sys.executable, "torchrec_dlrm", _setup(tmp_path), threads=1)


def test_without_the_peer_the_benchmark_runs_and_says_how_to_build_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(PEERS_DIR_ENV, str(tmp_path / "no-peers"))
    out = tmp_path / "dlrm.json"
    assert main([*TINY, "--out", str(out)]) == 0
    assert NOT_INSTALLED in capsys.readouterr().out
    single = json.loads(out.read_text())["single_process"]
    assert single["torchrec_samples_per_s"] is None and single["torchrec_losses_equal"] is None
    assert single["warmup_losses_equal"] and "torchrec" not in single["warmup_losses"]


def test_a_missing_torchrec_python_names_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--torchrec-python .*no such file"):
        main([*TINY, "--torchrec-python", str(tmp_path / "python"), "--out", str(tmp_path / "dlrm.json")])


def test_a_tiny_race_with_torchrec_agrees_on_every_warmup_loss(tmp_path, capsys):
    if default_peer_python("torchrec") is None:
        pytest.skip("the TorchRec peer is not built (bash scripts/setup_peers.sh torchrec)")
    out = tmp_path / "dlrm.json"
    assert main([*TINY, "--out", str(out)]) == 0
    assert "TorchRec DMP (K=1)" in capsys.readouterr().out
    single = json.loads(out.read_text())["single_process"]
    assert single["torchrec_losses_equal"] is True
    assert len(single["warmup_losses"]["torchrec"]) == 2
    assert single["torchrec_samples_per_s"] > 0 and single["ratio_vs_torchrec"] > 0
    assert single["dense_floor_samples_per_s"] > 0 and single["dense_floor_ratio_vs_torchrec"] > 0  # the bound
    info = single["torchrec_info"]
    assert info["torchrec"].startswith("1.9") and sum(len(t) for t in info["sharding"].values()) == 26
