"""Checkpoints in one process: the folder format, every damaged or foreign checkpoint a clear error, pieces re-cut
for another plan, and GCN / DLRM runs resumed halfway that equal the uninterrupted run bit for bit."""

import json
from pathlib import Path

import pytest
import torch

from haloflow.engine.checkpoint import CheckpointConfig, Checkpointer, Piece, open_checkpoint
from haloflow.engine.dlrm.train import DLRMTrainConfig, train_dlrm
from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
from haloflow.engine.runtime import ParallelLayout, RuntimeConfig
from haloflow.errors import CheckpointError, ConfigError
from tests.engine.scripts.common import small_dataset

ONE = ParallelLayout(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def _writer(root: Path, **kw) -> Checkpointer:
    return Checkpointer(CheckpointConfig(dir=root, **kw), ONE, "toy", {"width": 3})


def _state(step: int) -> dict:
    return {"w": torch.full((3,), float(step)), "history": [1.5, float("nan")], "step": step}


def test_save_keeps_the_newest_and_leaves_no_temporary_folder(tmp_path):
    ck = _writer(tmp_path / "ck", every=2, keep=2)
    assert [s for s in range(1, 8) if ck.due(s, 7)] == [2, 4, 6, 7]
    for step in (2, 4, 6, 7):
        ck.save(step, _state(step))
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000006", "step-00000007"]
    loaded = open_checkpoint(tmp_path / "ck")
    assert loaded.step == 7 and torch.equal(loaded.state["w"], torch.full((3,), 7.0))
    manifest = json.loads((loaded.path / "manifest.json").read_text())
    assert manifest["kind"] == "toy" and manifest["world_size"] == 1 and set(manifest["files"]) == {"state.pt"}


def test_a_run_does_not_write_over_another_runs_checkpoints(tmp_path):
    _writer(tmp_path).save(3, _state(3))
    with pytest.raises(CheckpointError, match="already holds checkpoints .*step-00000003.*--resume"):
        _writer(tmp_path)
    again = Checkpointer(CheckpointConfig(dir=tmp_path, resume=tmp_path), ONE, "toy", {"width": 3})
    assert again.load().step == 3


@pytest.mark.parametrize("damage, message", [
    ("flip", "CRC-32"), ("truncate", "bytes, the manifest says"), ("delete", "missing"),
    ("manifest", "unreadable"), ("no_manifest", "no manifest.json"),
])
def test_a_damaged_checkpoint_is_an_error_naming_the_file(tmp_path, damage, message):
    path = _writer(tmp_path).save(1, _state(1))
    state = path / "state.pt"
    if damage == "flip":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
    elif damage == "truncate":
        state.write_bytes(state.read_bytes()[:-10])
    elif damage == "delete":
        state.unlink()
    elif damage == "manifest":
        (path / "manifest.json").write_text("{not json")
    else:
        (path / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=message):
        open_checkpoint(tmp_path)


def test_a_checkpoint_of_another_model_names_what_differs(tmp_path):
    _writer(tmp_path).save(1, _state(1))
    other_kind = Checkpointer(CheckpointConfig(resume=tmp_path), ONE, "dlrm", {"width": 3})
    with pytest.raises(CheckpointError, match="a checkpoint of a toy run, but this run trains dlrm"):
        other_kind.load()
    other_width = Checkpointer(CheckpointConfig(resume=tmp_path), ONE, "toy", {"width": 4})
    with pytest.raises(CheckpointError, match="width differs: the checkpoint has 3, this run has 4"):
        other_width.load()


def test_bad_settings_name_their_flag(tmp_path):
    (tmp_path / "file").write_text("x")
    for kwargs, field in [({"every": -1}, "every"), ({"keep": 0}, "keep"),
                          ({"every": 2}, "dir"), ({"dir": tmp_path / "file"}, "dir"),
                          ({"resume": tmp_path / "nothing"}, "resume"), ({"fail_at": 0}, "fail_at")]:
        with pytest.raises(ConfigError) as err:
            CheckpointConfig(**kwargs)
        assert err.value.field == field
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        Checkpointer(CheckpointConfig(resume=tmp_path), ONE, "toy", {})
    with pytest.raises(ConfigError, match="fail rank 2 is not one of the 1 ranks"):
        Checkpointer(CheckpointConfig(fail_at=1, fail_rank=2), ONE, "toy", {})


def test_pieces_of_one_cut_are_re_cut_for_another(tmp_path):
    table = torch.arange(40, dtype=torch.float32).view(10, 4)
    state = torch.arange(10, dtype=torch.float32)  # a per-row array (row-wise Adagrad)
    # written as a row-wise cut (rows 0-6, 6-10) of which the first is column-wise (columns 0-1, 1-4)
    cuts = [((0, 6), (0, 1)), ((0, 6), (1, 4)), ((6, 10), (0, 4))]
    pieces = [Piece(0, r, c, {"weight": table[r[0]:r[1], c[0]:c[1]], "row_sum": state[r[0]:r[1]]}) for r, c in cuts]
    _writer(tmp_path).save(1, _state(1), pieces)
    loaded = open_checkpoint(tmp_path)
    assert torch.equal(loaded.rows(0, (0, 10), (0, 4), "weight"), table)
    assert torch.equal(loaded.rows(0, (3, 8), (1, 3), "weight"), table[3:8, 1:3])
    assert torch.equal(loaded.rows(0, (5, 9), (2, 4), "row_sum"), state[5:9])
    with pytest.raises(CheckpointError, match="holds no 'weight' rows of table 1"):
        loaded.rows(1, (0, 2), (0, 4), "weight")
    with pytest.raises(CheckpointError, match="do not cover rows 0..10 x columns 0..5"):
        loaded.rows(0, (0, 10), (0, 5), "weight")


def test_scattered_rows_saved_by_id_are_read_back_for_other_owners(tmp_path):
    memory = torch.arange(20, dtype=torch.float32).view(10, 2)  # node v's row is [2v, 2v+1]
    owners = [torch.tensor([7, 1, 4, 0, 9]), torch.tensor([2, 3, 5, 6, 8])]  # two ranks' nodes, scattered
    pieces = [Piece(0, (0, 10), (0, 2), {"memory": memory[ids]}, ids=ids) for ids in owners]
    _writer(tmp_path).save(1, _state(1), pieces)
    loaded = open_checkpoint(tmp_path)
    for ids in (torch.tensor([3, 9, 0]), torch.arange(10)):  # another partition's nodes, in its row order
        assert torch.equal(loaded.rows_at(0, ids, "memory"), memory[ids])
    with pytest.raises(CheckpointError, match=r"no 'memory' row of table 0 for ids \[12\]"):
        loaded.rows_at(0, torch.tensor([12]), "memory")


def test_a_piece_cut_from_a_big_table_is_saved_alone(tmp_path):
    big = torch.zeros(100_000, 4)  # 1.6 MB; the piece is 10 rows of it (a view into its storage)
    path = _writer(tmp_path).save(1, _state(1), [Piece(0, (0, 10), (0, 4), {"weight": big[:10]})])
    assert (path / "rows-rank0.pt").stat().st_size < big.numel() * 4 // 100


# ------------------------------------------------------------------------------------------------ trainers
def _gcn(tmp_path: Path, epochs: int, **ckpt) -> GCNTrainConfig:
    return GCNTrainConfig(dataset="in-memory", epochs=epochs, lr=0.05,
                          runtime=RuntimeConfig(progress=False, checkpoint=CheckpointConfig(**ckpt)))


def test_gcn_resumed_halfway_equals_the_uninterrupted_run(tmp_path):
    data = small_dataset(num_nodes=120, num_edges=500, feat_dim=8, num_classes=3, seed=4)
    full = train_gcn(_gcn(tmp_path, 8), dataset=data)
    train_gcn(_gcn(tmp_path, 5, dir=tmp_path / "ck", every=2), dataset=data)  # saves 2, 4, 5
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000004", "step-00000005"]
    resumed = train_gcn(_gcn(tmp_path, 8, resume=tmp_path / "ck" / "step-00000004"), dataset=data)
    assert resumed.resumed_at == 4 and [h.epoch for h in resumed.history] == list(range(8))
    for name, w in full.state_dict.items():
        assert torch.equal(w, resumed.state_dict[name]), name
    assert [h.loss for h in full.history] == [h.loss for h in resumed.history]
    with pytest.raises(ConfigError, match="at epoch 5, and this run stops at epoch 5: nothing left to train; give more --epochs"):
        train_gcn(_gcn(tmp_path, 5, resume=tmp_path / "ck"), dataset=data)
    with pytest.raises(CheckpointError, match="hidden_dim"):
        train_gcn(GCNTrainConfig(dataset="in-memory", epochs=8, hidden_dim=8, runtime=RuntimeConfig(
            progress=False, checkpoint=CheckpointConfig(resume=tmp_path / "ck"))), dataset=data)


def _dlrm(steps: int, **kw) -> DLRMTrainConfig:
    ckpt = {k: kw.pop(k) for k in list(kw) if k in ("dir", "every", "resume")}
    return DLRMTrainConfig(synthetic=True, synthetic_max_rows=60, synthetic_train=640, synthetic_val=64,
                           batch_size=32, embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,), max_steps=steps, epochs=2,
                           max_eval_batches=1, runtime=RuntimeConfig(progress=False,
                                                                     checkpoint=CheckpointConfig(**ckpt)), **kw)


def _tables(path: Path) -> list[torch.Tensor]:
    loaded = open_checkpoint(path)
    D = loaded.manifest["identity"]["embedding_dim"]
    return [loaded.rows(t, (0, n), (0, D), "weight") for t, n in enumerate(loaded.manifest["identity"]["table_sizes"])]


@pytest.mark.parametrize("optimizer, cache", [("sgd", None), ("adagrad", 0.1), ("rowwise_adagrad", None)])
def test_dlrm_resumed_halfway_equals_the_uninterrupted_run(tmp_path, optimizer, cache):
    train_dlrm(_dlrm(30, dir=tmp_path / "full", optimizer=optimizer, cache_ratio=cache))
    train_dlrm(_dlrm(27, dir=tmp_path / "half", every=11, optimizer=optimizer, cache_ratio=cache))  # 11, 22, 27
    resumed = train_dlrm(_dlrm(30, resume=tmp_path / "half" / "step-00000022", dir=tmp_path / "resumed",
                               optimizer=optimizer, cache_ratio=cache))
    assert resumed.resumed_at == 22 and resumed.steps == 30 and len(resumed.losses) == 30
    full, again = open_checkpoint(tmp_path / "full"), open_checkpoint(tmp_path / "resumed")
    assert full.state["losses"] == again.state["losses"]
    for name, w in full.state["dense"]["weights"].items():
        assert torch.equal(w, again.state["dense"]["weights"][name]), name
    for a, b in zip(_tables(tmp_path / "full"), _tables(tmp_path / "resumed")):
        assert torch.equal(a, b)


def test_dlrm_checkpoint_of_another_optimizer_or_batch_is_refused(tmp_path):
    train_dlrm(_dlrm(4, dir=tmp_path / "ck"))
    with pytest.raises(CheckpointError, match="optimizer differs: the checkpoint has 'sgd', this run has 'adagrad'"):
        train_dlrm(_dlrm(8, resume=tmp_path / "ck", optimizer="adagrad"))
    with pytest.raises(CheckpointError, match="batch_size differs"):
        train_dlrm(DLRMTrainConfig(**{**_dlrm(8, resume=tmp_path / "ck").__dict__, "batch_size": 16}))
