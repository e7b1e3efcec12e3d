"""Logs a person and a program can follow: `haloflow plot` draws a run's curves; a restarted run's JSON log holds
every epoch once, with the attempt that trained it; ``progress=False`` prints nothing per unit."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from haloflow.cli import main
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.conftest import REPO
from tests.engine.scripts.common import small_dataset


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("parts")
    data = small_dataset(num_nodes=150, num_edges=700, feat_dim=8, num_classes=3, seed=5)
    for k in (1, 2):
        partition_dataset(data, PartitionConfig(num_parts=k, method="random", seed=1), root / f"k{k}", progress=False)
    return {k: root / f"k{k}" for k in (1, 2)}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_plot_draws_a_gcn_runs_loss_and_accuracy(parts, tmp_path, capsys):
    import matplotlib.image

    log = tmp_path / "gcn.jsonl"
    assert main(["train", "gcn", "--partitions", str(parts[1]), "--epochs", "6", "--log-jsonl", str(log),
                 "--no-progress"]) == 0
    assert main(["plot", str(log), "--out", str(tmp_path / "gcn.png"), "--width", "8", "--height", "3"]) == 0
    image = matplotlib.image.imread(tmp_path / "gcn.png")  # read back by the library that wrote it
    assert image.shape[:2] == (300, 800)
    assert (image[..., :3] < 0.9).any(axis=-1).mean() > 0.01  # lines and text drawn, not a blank canvas
    assert main(["plot", str(log)]) == 0 and (tmp_path / "gcn.png").is_file()  # the default name


def test_plot_refuses_what_is_not_a_training_log(cli_fails, tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"kind": "summary"}\n')
    cli_fails(["plot", bad, "--out", tmp_path / "x.png"], "no epoch or train record with a loss")
    bad.write_text("not json\n")
    cli_fails(["plot", bad], "x.jsonl:1: not a JSON line")
    cli_fails(["plot", tmp_path / "none.jsonl"], "none.jsonl does not exist")
    assert not (tmp_path / "x.png").exists()


def test_no_progress_prints_only_the_summary(parts, capsys):
    from haloflow.engine.gcn.config import GCNTrainConfig
    from haloflow.engine.gcn.train import train_gcn
    from haloflow.engine.run_config import RuntimeConfig

    train_gcn(GCNTrainConfig(partitions=str(parts[1]), epochs=4, runtime=RuntimeConfig(progress=False)))
    quiet = capsys.readouterr()
    train_gcn(GCNTrainConfig(partitions=str(parts[1]), epochs=4, runtime=RuntimeConfig(log_every=1)))
    talkative = capsys.readouterr()
    assert quiet.out == "" and "epoch" not in quiet.err
    assert talkative.out.count("train gcn (K=1): epoch") == 4  # the control: lines without a terminal


@pytest.mark.slow
def test_a_restarted_run_logs_every_epoch_once_with_its_attempt(parts, tmp_path):
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "haloflow", "train", "gcn", "--partitions", str(parts[2]),
                           "--nproc", "2", "--epochs", "10", "--checkpoint-dir", str(tmp_path / "ck"),
                           "--checkpoint-every", "3", "--max-restarts", "1", "--fail-at", "8", "--fail-rank", "1",
                           "--log-jsonl", str(log), "--no-progress"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "restart 1: every rank restarted; continuing from epoch 6" in proc.stderr
    got = records(log)
    epochs = [r for r in got if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == list(range(10))  # each once, in order
    assert [r["attempt"] for r in epochs] == [0] * 6 + [1] * 4  # epochs 7 and 8 of attempt 0 were dropped
    assert [r["kind"] for r in got].count("restart") == 1 and got[-1]["kind"] == "summary"
    restart = next(r for r in got if r["kind"] == "restart")
    assert (restart["attempt"], restart["units_done"]) == (1, 6)
    assert np.isfinite([r["loss"] for r in epochs]).all()
