"""The DGL peer script under a Python without dgl (ours): one JSON line naming dgl, a non-zero exit, and
`PeerProcess` raising that line as `PeerError`. The real peer is run by tests/bench/test_gcn.py."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import haloflow.bench.peer
from haloflow.bench.peer import PeerError, PeerProcess

SCRIPT = Path(haloflow.bench.peer.__file__).with_name("peers") / "dgl_gcn.py"
SETUP = {"data": "never-read.npz", "dims": [4, 4, 2], "dropout": 0.0, "seed": 0, "threads": 1}

pytestmark = pytest.mark.skipif(importlib.util.find_spec("dgl") is not None,
                                reason="dgl imports in this Python; these tests need one without it")


def test_the_script_answers_the_setup_with_one_line_naming_dgl_and_exits_non_zero():
    proc = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps({"setup": SETUP}) + "\n",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    (line,) = proc.stdout.splitlines()
    error = json.loads(line)["error"]
    assert "dgl does not import" in error and sys.executable in error and "No module named 'dgl'" in error


def test_peer_process_raises_the_peers_message():
    with pytest.raises(PeerError, match=r"peer dgl_gcn: .*dgl does not import .*No module named 'dgl'"):
        PeerProcess(sys.executable, "dgl_gcn", SETUP, threads=1)
