"""`haloflow train gcn`: single process on a one-part folder, torchrun launched by --nproc, and user errors."""

import json
import subprocess
import sys

import pytest
import torch

from haloflow.cli import main
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.conftest import REPO
from tests.engine.scripts.common import small_dataset


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_cli")
    dataset = small_dataset(num_nodes=120, num_edges=500, feat_dim=8, num_classes=3, seed=4)
    for k in (1, 2):
        partition_dataset(dataset, PartitionConfig(num_parts=k, method="random"), root / f"k{k}", progress=False)
    return root


def test_one_part_folder_trains_in_one_process(folders, tmp_path, capsys):
    log, save = tmp_path / "log.jsonl", tmp_path / "model.pt"
    rc = main(["train", "gcn", "--partitions", str(folders / "k1"), "--epochs", "3", "--hidden", "8",
               "--log-jsonl", str(log), "--save", str(save), "--no-progress"])
    assert rc == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["kind"] for e in lines] == ["epoch"] * 3 + ["summary"]
    assert lines[-1]["world_size"] == 1 and lines[-1]["startup_s"] > 0
    lines = lines[:-1]
    assert [e["epoch"] for e in lines] == [0, 1, 2]
    assert {"loss", "train_acc", "val_acc", "test_acc", "epoch_s", "halo_bytes", "blocked_s"} <= set(lines[0])
    saved = torch.load(save)
    assert saved["model_config"]["hidden_dim"] == 8 and saved["state_dict"]["weights.0"].shape == (8, 8)
    out = capsys.readouterr().out
    assert f"{lines[-1]['test_acc']:.4f}" in out and "test accuracy" in out and "start-up s" in out
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "x.txt", "--nproc", "2"], "--nproc needs --partitions DIR"),
    (["--partitions", "{k2}", "--halo-keep", "0.5"], "need one part per rank, but V = 2 logical workers on K = 1"),
    (["--partitions", "{k2}", "--nproc", "3"], "has 2 parts, which 3 processes cannot host: each hosts V / K parts, "
     "a power of two (for V = 2: --nproc in [1, 2])"),
    (["--partitions", "{k1}", "--device", "cuda"] if not torch.cuda.is_available() else ["--nproc", "0"],
     "--device" if not torch.cuda.is_available() else "--nproc"),
    (["--partitions", "{k1}", "--staleness", "2"], "staleness must be 0 (exact) or 1"),
    (["--partitions", "{missing}"], "does not exist"),
])
def test_user_errors_are_one_line(folders, capsys, argv, message):
    argv = [a.format(k1=folders / "k1", k2=folders / "k2", missing=folders / "nope") for a in argv]
    assert main(["train", "gcn", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_train_without_a_model_prints_help(capsys):
    assert main(["train"]) == 2
    assert "gcn" in capsys.readouterr().out


@pytest.mark.slow
def test_nproc_launches_torchrun(folders, tmp_path):
    log = tmp_path / "log.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "haloflow", "train", "gcn", "--partitions", str(folders / "k2"), "--nproc", "2",
         "--epochs", "2", "--log-jsonl", str(log), "--no-progress"],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 x 1" in proc.stdout  # ranks x threads, in the summary
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 3 and lines[0]["halo_bytes"] > 0  # written once, by rank 0: 2 epochs and the summary
    assert lines[-1]["world_size"] == 2 and lines[-1]["threads_per_rank"] >= 1
