"""train_gcn: K = 2 and 4 real gloo processes equal the single-process run; Cora accuracy; config checks."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.engine.gcn.cost_model import PartLoad, halo_bytes_per_epoch
from haloflow.engine.gcn.parallelize import HaloConfig
from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
from haloflow.engine.runtime import RuntimeConfig
from haloflow.errors import ConfigError
from haloflow.partition.api import PartitionConfig
from haloflow.partition.format import load_partition
from haloflow.partition.pipeline import partition_dataset
from tests.conftest import run_torchrun
from tests.engine.scripts.common import small_dataset

SCRIPTS = Path(__file__).parents[1] / "scripts"
QUIET = RuntimeConfig(progress=False)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def parity_dataset():
    return small_dataset(num_nodes=200, num_edges=900, feat_dim=12, num_classes=4, seed=2)


def test_config_names_the_problem():
    with pytest.raises(ConfigError, match="exactly one input"):
        GCNTrainConfig()
    with pytest.raises(ConfigError, match="optimizer must be one of .*got 'rmsprop'"):
        GCNTrainConfig(dataset="x", optimizer="rmsprop")
    with pytest.raises(ConfigError, match="staleness must be 0"):
        GCNTrainConfig(dataset="x", halo=HaloConfig(staleness=3))
    with pytest.raises(ConfigError, match="device must be one of .*got 'tpu'") as err:
        GCNTrainConfig(dataset="x", runtime=RuntimeConfig(device="tpu"))
    assert err.value.field == "device"


def test_single_process_run_learns(tmp_path):
    dataset = parity_dataset()
    result = train_gcn(GCNTrainConfig(dataset="in-memory", epochs=30, lr=0.05, runtime=QUIET), dataset=dataset)
    losses = [e.loss for e in result.history]
    assert losses[-1] < 0.8 * losses[0]
    assert result.logits.shape == (200, 4) and torch.equal(result.node_ids, torch.arange(200))
    assert all(e.halo_bytes == 0 and e.grad_bytes == 0 for e in result.history)


@pytest.mark.parametrize("device", DEVICES)
def test_every_tensor_of_a_run_lives_on_the_configured_device(device):
    result = train_gcn(GCNTrainConfig(dataset="in-memory", epochs=2, runtime=RuntimeConfig(device=device,
                                                                                        progress=False)),
                       dataset=parity_dataset())
    assert result.layout.device.type == device
    # one process runs the distributed path on a group of one: its (empty) halo exchange has buffers too
    assert set(result.devices) == {"model", "features", "labels", "masks", "node_ids", "logits", "halo_buffers",
                                   "send_ids"}
    assert all(found == {device} for found in result.devices.values()), result.devices


@pytest.mark.slow
@pytest.mark.parametrize("k, method, conv", [(2, "metis", "gcn"), (4, "random", "sage")])
def test_distributed_run_equals_single_process(tmp_path, k, method, conv):
    dataset = parity_dataset()
    parts_dir = tmp_path / "parts"
    partition_dataset(dataset, PartitionConfig(num_parts=k, method=method, seed=1), parts_dir, progress=False)
    proc = run_torchrun(SCRIPTS / "train_parity.py", k, [parts_dir, tmp_path, conv], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sys.path.insert(0, str(SCRIPTS))
    from train_parity import config

    ref = train_gcn(config({"dataset": "in-memory"}, conv), dataset=dataset)
    res = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(k)]
    ids = np.concatenate([r["node_ids"] for r in res])
    assert np.array_equal(np.sort(ids), np.arange(dataset.num_nodes))  # every node trained exactly once
    logits = torch.from_numpy(np.concatenate([r["logits"] for r in res]))
    torch.testing.assert_close(logits, ref.logits[torch.from_numpy(ids)])
    ref_loss = torch.tensor([e.loss for e in ref.history])
    ref_acc = torch.tensor([[e.train_acc, e.val_acc, e.test_acc] for e in ref.history])
    loads = [PartLoad.from_part(load_partition(parts_dir, r)) for r in range(k)]
    predicted = halo_bytes_per_epoch(loads, config({"dataset": "-"}, conv).model_config(12, 4))
    params = sum(w.numel() for w in ref.state_dict.values())
    for r in res:
        assert list(r["halo_bytes"]) == [predicted] * len(r["halo_bytes"])  # the engine sends what the model says
        # gradient sync: 2 P (K-1) floats in all per step (reduce-scatter + all-gather), summed over the ranks
        assert list(r["grad_bytes"]) == [2 * params * (k - 1) * 4] * len(r["grad_bytes"])
        assert min(r["buckets_in_backward"]) >= 2  # buckets launch while backward still runs
        torch.testing.assert_close(torch.from_numpy(r["loss"]), ref_loss, check_dtype=False)
        torch.testing.assert_close(torch.from_numpy(r["acc"]), ref_acc, check_dtype=False)
        for name, w in ref.state_dict.items():
            torch.testing.assert_close(torch.from_numpy(r[f"w_{name}"]), w, msg=name)
    # the approximate modes ran all their epochs with finite losses and moved halo data
    for mode in ("stale", "sampled"):
        loss = res[0][f"{mode}_loss"]
        assert loss.shape == (3,) and np.all(np.isfinite(loss)), mode
        assert res[0][f"{mode}_halo_bytes"][-1] > 0
    # sampling keeps about half of the halo rows
    assert res[0]["sampled_halo_bytes"][-1] < 0.8 * res[0]["halo_bytes"][-1]


@pytest.mark.slow
def test_cora_accuracy_is_the_same_on_one_and_two_ranks(shared_data, tmp_path):
    from haloflow.partition.pipeline import read_input

    cora = read_input(shared_data / "planetoid")
    single = train_gcn(GCNTrainConfig(dataset=str(shared_data / "planetoid"), runtime=QUIET), dataset=cora)
    parts = tmp_path / "parts"
    partition_dataset(cora, PartitionConfig(num_parts=2, method="metis"), parts, progress=False)
    proc = run_torchrun(SCRIPTS / "cora.py", 2, [parts, tmp_path], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    two = json.loads((tmp_path / "cora.json").read_text())
    print(f"Cora test accuracy: K=1 {single.final.test_acc:.3f}, K=2 " +
          ", ".join(f"{mode} {r['test_acc']:.3f}" for mode, r in two.items()))
    assert single.final.test_acc >= 0.80  # Kipf & Welling report 81.5%
    assert two["exact"]["test_acc"] == single.final.test_acc
    for mode in ("stale", "sampled"):
        assert abs(two[mode]["test_acc"] - two["exact"]["test_acc"]) <= 0.02, (mode, two)
