"""`export_model` / `load_model`: a checkpoint becomes the single-device model's own state dict, the same in a
file, in a memory-mapped folder and read from the checkpoint directly."""

import numpy as np
import pytest
import torch

from haloflow.engine.export import ExportConfig, export_model, load_model
from haloflow.engine.run_config import CheckpointConfig, RuntimeConfig
from haloflow.errors import CheckpointError, ConfigError


@pytest.fixture(scope="module")
def dlrm_run(tmp_path_factory):
    from haloflow.engine.dlrm.config import DLRMTrainConfig
    from haloflow.engine.dlrm.train import train_dlrm

    root = tmp_path_factory.mktemp("dlrm")
    result = train_dlrm(DLRMTrainConfig(synthetic=True, synthetic_max_rows=40, synthetic_train=128, synthetic_val=32,
                                        batch_size=32, embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,), max_steps=3,
                                        runtime=RuntimeConfig(progress=False, log_every=1000,
                                                              checkpoint=CheckpointConfig(dir=root / "ck"))))
    return root, result


def test_a_dlrm_export_is_the_single_device_models_state_dict(dlrm_run, tmp_path):
    root, result = dlrm_run
    export_model(ExportConfig(checkpoint=root / "ck", out=tmp_path / "m.pt"))
    model = load_model(tmp_path / "m.pt")
    assert model.family == "dlrm" and model.step == 3 and model.world_size == 1
    assert set(model.tensors) == set(result.state_dict)  # the names of haloflow.models.DLRM's state dict
    for name, value in result.state_dict.items():
        assert torch.equal(model.tensors[name], value), name


def test_file_folder_and_checkpoint_hold_the_same_tensors(dlrm_run, tmp_path):
    root, _ = dlrm_run
    export_model(ExportConfig(checkpoint=root / "ck", out=tmp_path / "m.pt", layout="file"))
    export_model(ExportConfig(checkpoint=root / "ck", out=tmp_path / "folder", layout="folder"))
    a, b, c = (load_model(p) for p in (tmp_path / "m.pt", tmp_path / "folder", root / "ck"))
    assert (tmp_path / "folder" / "model.json").is_file()
    assert isinstance(np.load(tmp_path / "folder" / "tensor-0000.npy", mmap_mode="r"), np.memmap)
    assert a.config == b.config == c.config and set(a.tensors) == set(b.tensors) == set(c.tensors)
    for name in a.tensors:
        assert torch.equal(a.tensors[name], b.tensors[name]) and torch.equal(a.tensors[name], c.tensors[name])


def test_an_export_is_read_without_running_code(dlrm_run, tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    bad = tmp_path / "bad.pt"
    bad.write_bytes(pickle.dumps({"format": Evil()}, protocol=2))
    with pytest.raises(CheckpointError, match="not a haloflow model"):
        load_model(bad)


def test_export_refuses_to_overwrite(dlrm_run, tmp_path):
    root, _ = dlrm_run
    (tmp_path / "m.pt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        ExportConfig(checkpoint=root / "ck", out=tmp_path / "m.pt")
    assert (tmp_path / "m.pt").read_text() == "mine"
