"""The sweep over checkpoints: a valid GCN and a valid DLRM checkpoint (the latter with table rows in pieces), one
file broken per example -- its bytes (truncated, flipped, emptied, replaced), or the manifest's JSON values -- and
then resumed by the real trainer for one more epoch or step. Every outcome is a resumed run or a
``CheckpointError`` / ``ConfigError`` of one line naming the checkpoint, never another exception."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from haloflow.engine.checkpoint import CheckpointConfig
from haloflow.engine.dlrm.train import DLRMTrainConfig, train_dlrm
from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
from haloflow.engine.runtime import RuntimeConfig
from tests.engine.scripts.common import small_dataset
from tests.sweep.mutate import SWEEP, check_clean, mutate, mutate_json

pytestmark = pytest.mark.timeout(300)

DATA = small_dataset(num_nodes=30, num_edges=90, feat_dim=3, num_classes=2, seed=3)


def _gcn(epochs: int, **ckpt) -> GCNTrainConfig:
    return GCNTrainConfig(dataset="in-memory", epochs=epochs, hidden_dim=4,
                          runtime=RuntimeConfig(progress=False, checkpoint=CheckpointConfig(**ckpt)))


def _dlrm(steps: int, **ckpt) -> DLRMTrainConfig:
    return DLRMTrainConfig(synthetic=True, synthetic_max_rows=20, synthetic_train=128, synthetic_val=32,
                           batch_size=32, embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), max_steps=steps,
                           optimizer="adagrad", max_eval_batches=1,
                           runtime=RuntimeConfig(progress=False, checkpoint=CheckpointConfig(**ckpt)))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt_seeds")
    train_gcn(_gcn(2, dir=root / "gcn"), dataset=DATA)
    train_dlrm(_dlrm(2, dir=root / "dlrm"))
    return root


def _break(data: st.DataObject, folder: Path) -> None:
    """One file of the newest checkpoint in ``folder``: its bytes, or (the manifest) its JSON values."""
    step = sorted(folder.iterdir())[-1]
    files = sorted(p for p in step.iterdir() if p.is_file())
    target = data.draw(st.sampled_from(files))
    how = data.draw(st.sampled_from(["bytes", "json"] if target.name == "manifest.json" else ["bytes", "delete"]))
    if how == "delete":
        target.unlink()
    elif how == "json":
        target.write_text(json.dumps(mutate_json(data, json.loads(target.read_text()))))
    else:
        target.write_bytes(mutate(data, target.read_bytes(), compress=False))


@settings(max_examples=40, **SWEEP)
@given(st.data())
def test_gcn_checkpoints(seeds, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "gcn"
        shutil.copytree(seeds / "gcn", folder)
        _break(data, folder)
        check_clean("checkpoint (train gcn --resume)", lambda: train_gcn(_gcn(3, resume=folder), dataset=DATA),
                    folder)


@settings(max_examples=40, **SWEEP)
@given(st.data())
def test_dlrm_checkpoints(seeds, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "dlrm"
        shutil.copytree(seeds / "dlrm", folder)
        _break(data, folder)
        check_clean("checkpoint (train dlrm --resume)", lambda: train_dlrm(_dlrm(3, resume=folder)), folder)
