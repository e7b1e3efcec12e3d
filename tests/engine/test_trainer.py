"""engine/trainer.run, once for every family: a toy family (tests/engine/toy_family.py, no code outside its own
file) resumes to the uninterrupted run, fails and saves where told, and ends with the one summary schema; the
three real families end with that schema too."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from haloflow.engine.checkpoint import CheckpointConfig
from haloflow.engine.trainer import SUMMARY_KEYS
from haloflow.errors import ConfigError
from tests.engine.toy_family import train_toy

TOY = Path(__file__).with_name("toy_family.py")
ENGINE = Path(__file__).parents[2] / "haloflow" / "engine"


def _steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))


def test_resume_equals_the_uninterrupted_run(tmp_path):
    full = train_toy(10)
    train_toy(4, checkpoint=CheckpointConfig(dir=tmp_path / "a"))
    resumed = train_toy(10, checkpoint=CheckpointConfig(resume=tmp_path / "a"))
    assert resumed.resumed_at == 4
    assert resumed.losses == full.losses  # the 4 saved and the 6 trained after the resume
    assert torch.equal(resumed.state_dict["w"], full.state_dict["w"])  # bit for bit: weights, momentum and RNG


def test_a_resume_that_skipped_the_rng_would_differ(tmp_path):
    """The control for the test above: the noise matters, so the bit-for-bit equality can fail."""
    full = train_toy(10)
    train_toy(4, checkpoint=CheckpointConfig(dir=tmp_path / "a"))
    torch.manual_seed(999)
    from haloflow.engine.runtime import RuntimeConfig
    from haloflow.engine.trainer import run
    from tests.engine.toy_family import ToyFamily

    class NoRng(ToyFamily):
        def restore(self, loaded):
            super().restore(loaded)
            loaded.state["rng"] = torch.get_rng_state()  # what the loop restores next: today's state instead

    other = run(NoRng(10), RuntimeConfig(device="cpu", progress=False,
                                         checkpoint=CheckpointConfig(resume=tmp_path / "a")))
    assert not torch.equal(other.state_dict["w"], full.state_dict["w"])


def test_save_points_every_n_and_at_the_end(tmp_path):
    train_toy(7, checkpoint=CheckpointConfig(dir=tmp_path, every=3, keep=5))
    assert _steps(tmp_path) == ["step-00000003", "step-00000006", "step-00000007"]
    manifest = json.loads((tmp_path / "step-00000006" / "manifest.json").read_text())
    assert manifest["kind"] == "toy" and manifest["step"] == 6 and manifest["identity"] == {"width": 4}


def test_ctrl_c_after_a_checkpoint_is_renamed_into_place_still_names_it(tmp_path, monkeypatch):
    """Ctrl-C can land in a save's last collective, after rank 0 renamed the folder (the save's commit point) but
    before ``save`` returns: the run's one line must name that checkpoint (seen once in CI as "interrupted at epoch
    20" with no checkpoint, although step 20 was on disk)."""
    from haloflow.engine.checkpoint import Checkpointer
    from haloflow.engine.trainer import Interrupted

    agree = Checkpointer._agree

    def ctrl_c_after_the_rename(self, error, tmp, what):
        agree(self, error, tmp, what)
        if what.startswith("checkpoint 6:") and "renaming" in what:
            raise KeyboardInterrupt  # where SIGINT's handler would raise it

    monkeypatch.setattr(Checkpointer, "_agree", ctrl_c_after_the_rename)
    with pytest.raises(Interrupted) as stop:
        train_toy(10, checkpoint=CheckpointConfig(dir=tmp_path, every=3, keep=5))
    assert stop.value.at == 6 and stop.value.checkpoint == tmp_path / "step-00000006"
    assert (tmp_path / "step-00000006" / "manifest.json").is_file()


def test_nothing_left_to_train_names_the_familys_flag(tmp_path):
    train_toy(4, checkpoint=CheckpointConfig(dir=tmp_path))
    with pytest.raises(ConfigError, match="at step 4, and this run stops at step 4: nothing left to train; give "
                                          "more --units"):
        train_toy(4, checkpoint=CheckpointConfig(resume=tmp_path))


def test_fail_point_kills_the_process_and_its_checkpoint_resumes(tmp_path):
    proc = subprocess.run([sys.executable, str(TOY), str(tmp_path), "9", "6"], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[2])
    assert proc.returncode == -9, proc.stderr[-2000:]  # SIGKILL, as kill -9 would
    assert "--fail-at 6" in proc.stderr
    assert _steps(tmp_path) == ["step-00000002", "step-00000004"]  # unit 6 never finished
    resumed = train_toy(9, checkpoint=CheckpointConfig(resume=tmp_path))
    full = train_toy(9)
    assert resumed.resumed_at == 4 and torch.equal(resumed.state_dict["w"], full.state_dict["w"])


def test_summary_schema_and_unit_records(tmp_path):
    log = tmp_path / "toy.jsonl"
    train_toy(3, checkpoint=CheckpointConfig(dir=tmp_path / "c"))
    result = train_toy(5, checkpoint=CheckpointConfig(resume=tmp_path / "c"), log_jsonl=log)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["step", "step", "summary"]  # units 4 and 5, then the summary
    summary = lines[-1]
    assert tuple(summary) == SUMMARY_KEYS
    assert (summary["family"], summary["unit"], summary["units"], summary["units_trained"],
            summary["resumed_at"]) == ("toy", "step", 5, 2, 3)
    assert summary["world_size"] == 1 and summary["device"] == "cpu"
    assert summary["metrics"] == {"final_loss": pytest.approx(result.losses[-1], rel=0.5)}  # the family's own
    assert summary == result.records[-1]


def _last_record(tmp_path, name: str) -> dict:
    from haloflow.engine.runtime import RuntimeConfig

    log = tmp_path / f"{name}.jsonl"
    runtime = RuntimeConfig(device="cpu", progress=False, log_jsonl=log)
    if name == "gcn":
        from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
        from tests.engine.scripts.common import small_dataset

        train_gcn(GCNTrainConfig(dataset="in-memory", epochs=2, runtime=runtime),
                  dataset=small_dataset(num_nodes=60, num_edges=200, feat_dim=5, num_classes=3, seed=0))
    elif name == "dlrm":
        from haloflow.engine.dlrm.train import DLRMTrainConfig, train_dlrm

        train_dlrm(DLRMTrainConfig(synthetic=True, synthetic_train=256, synthetic_val=128, batch_size=64,
                                   bottom_mlp=(8, 4), top_mlp=(8,), embedding_dim=4, synthetic_max_rows=100,
                                   runtime=runtime))
    else:
        from haloflow.engine.tgn.train import TGNTrainConfig, train_tgn
        from tests.engine.scripts.tgn_parity import stream

        train_tgn(TGNTrainConfig(events="generated", batch_size=64, memory_dim=8, time_dim=4, embedding_dim=8,
                                 num_neighbors=3, max_train_batches=2, eval=False, runtime=runtime),
                  events=stream(num_events=1000))
    return json.loads(log.read_text().splitlines()[-1])


def test_every_family_ends_with_the_same_summary_schema(tmp_path):
    records = {name: _last_record(tmp_path, name) for name in ("gcn", "dlrm", "tgn")}
    for name, record in records.items():
        assert tuple(record) == SUMMARY_KEYS, name
        assert record["kind"] == "summary" and record["family"] == name and record["units_trained"] >= 1
    assert {r["unit"] for r in records.values()} == {"epoch", "step", "batch"}
    assert "val_auc" in records["dlrm"]["metrics"] and "test_acc" in records["gcn"]["metrics"]


def test_no_function_in_the_engine_is_longer_than_80_lines():
    long = []
    for path in ENGINE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{path.relative_to(ENGINE)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
