"""`haloflow train MODEL` ends by saying where it wrote: the JSON log, the newest checkpoint, the --save file."""

import pytest

from haloflow.cli import main
from haloflow.cli.outputs_written import outputs_written
from haloflow.engine.checkpoint import CheckpointConfig
from haloflow.engine.dlrm.config import DLRMTrainConfig
from haloflow.engine.runtime import RuntimeConfig
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.engine.scripts.common import small_dataset

TINY_DLRM = ["--synthetic", "--synthetic-max-rows", "40", "--synthetic-train", "96", "--synthetic-val", "0",
             "--batch-size", "32", "--embedding-dim", "4", "--bottom-mlp", "8", "--top-mlp", "8", "--no-progress"]


@pytest.fixture(scope="module")
def part_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs_written")
    dataset = small_dataset(num_nodes=60, num_edges=200, feat_dim=4, num_classes=3, seed=2)
    partition_dataset(dataset, PartitionConfig(num_parts=1, method="random"), root / "k1", progress=False)
    return root / "k1"


def test_gcn_names_its_log_newest_checkpoint_and_saved_model(part_folder, tmp_path, capsys):
    log, ck, save = tmp_path / "m.jsonl", tmp_path / "ck", tmp_path / "model.pt"
    assert main(["train", "gcn", "--partitions", str(part_folder), "--epochs", "4", "--hidden", "4",
                 "--log-jsonl", str(log), "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                 "--save", str(save), "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("wrote")
    assert [line.split() for line in lines[at + 1:]] == [
        ["JSON", "log", str(log)], ["checkpoints", str(ck / "step-00000004"), "(newest)"], ["model", str(save)]]
    assert log.is_file() and save.is_file() and (ck / "step-00000004").is_dir()


def test_dlrm_with_a_log_only_names_the_log_and_without_outputs_says_nothing(tmp_path, capsys):
    log = tmp_path / "m.jsonl"
    assert main(["train", "dlrm", *TINY_DLRM, "--log-jsonl", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"wrote\n  JSON log  {log}")
    assert main(["train", "dlrm", *TINY_DLRM]) == 0
    assert "wrote" not in capsys.readouterr().out


def test_a_checkpoint_folder_without_checkpoints_says_so(tmp_path):
    config = DLRMTrainConfig(synthetic=True, runtime=RuntimeConfig(checkpoint=CheckpointConfig(dir=tmp_path)))
    assert outputs_written(config) == f"wrote\n  checkpoints  {tmp_path} (none written)"
    assert outputs_written(DLRMTrainConfig(synthetic=True)) == ""
