"""After training, as a user runs it: train at K = 2 with checkpoints, ``haloflow export`` the newest checkpoint,
``haloflow predict`` at K = 1 from the export and at K = 2 from the checkpoint itself (real gloo ranks).

The printed metrics equal the trainer's own evaluation of the same split at the same step (its JSON log), digit
for digit, and the two predictions write the same rows bit for bit. GCN's K = 1 prediction reads the partition
folder too (one process hosting both parts): a run is defined by the folder's parts, and the whole data set as one
part would sum each aggregation row in another order.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

QUIET = ["--no-progress"]
DLRM_DATA = ["--synthetic", "--synthetic-max-rows", "50", "--synthetic-train", "640", "--synthetic-val", "96"]
DLRM = ["train", "dlrm", *DLRM_DATA, "--batch-size", "32", "--embedding-dim", "4", "--bottom-mlp", "8",
        "--top-mlp", "8", "--max-eval-batches", "3", "--max-steps", "15", *QUIET]
TGN = ["train", "tgn", "--batch-size", "64", "--memory-dim", "16", "--time-dim", "8", "--embedding-dim", "16",
       "--neighbors", "5", "--lr", "0.001", "--max-batches", "5", *QUIET]


def haloflow(*argv, cwd: Path, timeout: float = 240) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "haloflow", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**env, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def printed_metrics(stdout: str) -> dict[str, float]:
    """``  val_acc    0.61`` lines of `haloflow predict`'s summary."""
    out = {}
    for line in stdout.splitlines():
        words = line.split()
        if line.startswith("  ") and len(words) == 2 and not words[0] == "wrote":
            out[words[0]] = float(words[1])
    return out


def log_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_table(path: Path):
    return pq.read_table(path) if path.suffix == ".parquet" else pcsv.read_csv(path)


def train_export_predict(tmp_path: Path, train: list, predict: list, k2_input: list = (), k1_input: list = ()):
    """Train at K = 2 with checkpoints, export, predict at 1 (export) and 2 (checkpoint); returns the log, both
    printed metrics and both tables."""
    haloflow(*train, *k2_input, "--nproc", 2, "--checkpoint-dir", "ck", "--log-jsonl", "log.jsonl", cwd=tmp_path)
    haloflow("export", "ck", "--out", "model.pt", cwd=tmp_path)
    one = haloflow(*predict, *k1_input, "--model", "model.pt", "--out", "one.parquet", cwd=tmp_path)
    two = haloflow(*predict, *k2_input, "--model", "ck", "--nproc", 2, "--out", "two.csv", cwd=tmp_path)
    return (log_records(tmp_path / "log.jsonl"), printed_metrics(one), printed_metrics(two),
            read_table(tmp_path / "one.parquet"), read_table(tmp_path / "two.csv"))


def assert_same_rows(a, b) -> None:
    assert a.column_names == b.column_names and a.num_rows == b.num_rows > 0
    for name in a.column_names:
        x, y = a[name].to_numpy(zero_copy_only=False), b[name].to_numpy(zero_copy_only=False)
        assert (x == y.astype(x.dtype)).all(), name


def test_gcn_predicts_what_its_trainer_evaluated(tmp_path, shared_data):
    cora = shared_data / "planetoid"
    haloflow("partition", cora, "--parts", 2, "--out", "parts2", cwd=tmp_path)
    log, one, two, a, b = train_export_predict(
        tmp_path, ["train", "gcn", "--epochs", 15, *QUIET], ["predict", "gcn"],
        k2_input=["--partitions", "parts2"], k1_input=["--partitions", "parts2"])
    last = [r for r in log if r["kind"] == "epoch"][-1]
    assert last["epoch"] == 14
    for name in ("train_acc", "val_acc", "test_acc"):
        assert one[name] == two[name] == last[name], name
    assert len([n for n in a.column_names if n.startswith("prob_")]) == 7 and a.num_rows == 2708
    assert_same_rows(a, b)


def test_dlrm_predicts_what_its_trainer_evaluated(tmp_path):
    log, one, two, a, b = train_export_predict(
        tmp_path, DLRM, ["predict", "dlrm", *DLRM_DATA, "--max-batches", 3])
    final = log[-1]["metrics"]
    for name in ("val_logloss", "val_auc"):
        assert one[name] == two[name] == final[name], name
    assert a.num_rows == 96 and a["row"].to_pylist() == list(range(96))
    assert_same_rows(a, b)


def test_tgn_predicts_what_its_trainer_evaluated(tmp_path):
    from tests.engine.scripts.tgn_parity import stream

    ev = stream(num_events=1500)
    lines = ["u,i,ts,label,f0,f1,f2"] + [f"{u},{v},{t},0,{','.join(f'{x:.6f}' for x in f)}"
                                         for u, v, t, f in zip(ev.src, ev.dst, ev.t, ev.edge_feat)]
    (tmp_path / "events.csv").write_text("\n".join(lines) + "\n")
    log, one, two, a, b = train_export_predict(tmp_path, [*TGN, "--events", "events.csv"],
                                               ["predict", "tgn", "--events", "events.csv"])
    final = log[-1]["metrics"]
    for name in ("val_ap", "val_auc", "test_ap", "test_auc", "test_inductive_ap"):
        assert one[name] == two[name] == final[name], name
    assert set(a["split"].to_pylist()) == {"val", "test"}
    assert_same_rows(a, b)
