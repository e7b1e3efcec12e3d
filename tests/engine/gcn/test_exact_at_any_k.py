"""V = a partition folder's parts, trained at K = 1, 2 and 4 ranks (real gloo processes through the CLI): the same
model bit for bit. Default settings (float32, Adam, dropout 0.5), 100 epochs, on Cora and on a generated graph of
20,000 nodes; every logged loss ``==``, and the SHA-256 of the final weights and optimizer state equal.

Resume at another K from the epoch-50 checkpoint (what an interruption there leaves): 2 -> 1, 1 -> 4, 4 -> 2, the
same SHA-256 as the uninterrupted run. The control: the folder's own K = V, i.e. the old one-process run on a
folder of one part (one product over all of a process's rows), gives other floats than V = 4, so the comparison can
fail.

Each (data set, K) is launched once, shared by the assertions (module fixtures); K = 1 runs in this process.
"""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO

pytestmark = pytest.mark.slow

EPOCHS = 100
RESUMES = ((2, 1), (1, 4), (4, 2))  # (K of the interrupted run, K of the resumed one)


def haloflow(*argv, cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "haloflow", *map(str, argv)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


def train(cwd: Path, parts: str, k: int, name: str, resume: Path | None = None) -> None:
    """K ranks through the CLI (torchrun, gloo); K = 1 in this process (the same trainer, without the start-up)."""
    if k == 1:
        from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
        from haloflow.engine.run_config import CheckpointConfig, RuntimeConfig

        train_gcn(GCNTrainConfig(partitions=str(cwd / parts), epochs=EPOCHS, runtime=RuntimeConfig(
            progress=False, log_jsonl=cwd / f"{name}.jsonl",
            checkpoint=CheckpointConfig(dir=cwd / f"{name}-ck", every=50, resume=resume))))
        return
    haloflow("train", "gcn", "--partitions", parts, "--nproc", k, "--epochs", EPOCHS, "--no-progress",
             "--log-jsonl", f"{name}.jsonl", "--checkpoint-dir", f"{name}-ck", "--checkpoint-every", 50,
             *(["--resume", resume] if resume is not None else []), cwd=cwd)


def losses(path: Path) -> dict[int, float]:
    return {r["epoch"]: r["loss"] for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "epoch"}


def state_sha(folder: Path) -> str:
    """SHA-256 of the final checkpoint's weights and optimizer state (every tensor's bytes, in key order)."""
    state = torch.load(folder / f"step-{EPOCHS:08d}" / "state.pt", weights_only=True)
    h = hashlib.sha256()
    for name in sorted(state["model"]):
        h.update(name.encode() + state["model"][name].numpy().tobytes())
    opt = state["optimizer"]
    for i in sorted(opt["state"]):
        for name in sorted(opt["state"][i]):
            h.update(f"{i}.{name}".encode() + torch.as_tensor(opt["state"][i][name]).numpy().tobytes())
    return h.hexdigest()


def run_all(root: Path, folder: str, with_resumes: bool) -> dict:
    out = {"losses": {}, "sha": {}}
    for k in (1, 2, 4):
        train(root, folder, k, f"k{k}")
        out["losses"][k], out["sha"][k] = losses(root / f"k{k}.jsonl"), state_sha(root / f"k{k}-ck")
    if with_resumes:
        for a, b in RESUMES:
            name = f"r{a}{b}"
            train(root, folder, b, name, resume=root / f"k{a}-ck" / "step-00000050")
            out["losses"][name], out["sha"][name] = losses(root / f"{name}.jsonl"), state_sha(root / f"{name}-ck")
    return out


@pytest.fixture(scope="module")
def cora(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("cora")
    haloflow("partition", shared_data / "planetoid", "--parts", 4, "--out", "parts4", cwd=root)
    haloflow("partition", shared_data / "planetoid", "--parts", 1, "--out", "parts1", cwd=root)
    out = run_all(root, "parts4", with_resumes=True)
    train(root, "parts1", 1, "v1")  # the control: V = K = 1
    out["losses"]["v1"], out["sha"]["v1"] = losses(root / "v1.jsonl"), state_sha(root / "v1-ck")
    return out


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from haloflow.data.generators import sbm_dataset
    from haloflow.partition.pipeline import PartitionConfig, partition_dataset

    root = tmp_path_factory.mktemp("sbm")
    data = sbm_dataset(num_nodes=20_000, seed=3)
    data = dataclasses.replace(data, features=np.abs(data.features))  # bag-of-words-like: the default row norm
    partition_dataset(data, PartitionConfig(num_parts=4), root / "parts4", progress=False)
    return run_all(root, "parts4", with_resumes=False)


def assert_same_run(runs: dict) -> None:
    ref = runs["losses"][1]
    assert sorted(ref) == list(range(EPOCHS))
    for k in (2, 4):
        assert runs["losses"][k] == ref, f"K = {k}: a logged loss differs from K = 1"
        assert runs["sha"][k] == runs["sha"][1], f"K = {k}: the final state differs from K = 1"


def test_cora_trains_the_same_bits_at_one_two_and_four_ranks(cora):
    assert_same_run(cora)


def test_a_generated_graph_of_20000_nodes_trains_the_same_bits_at_one_two_and_four_ranks(generated):
    assert_same_run(generated)


@pytest.mark.parametrize("a, b", RESUMES)
def test_resuming_at_another_k_continues_bitwise(cora, a, b):
    resumed = cora["losses"][f"r{a}{b}"]
    assert sorted(resumed) == list(range(50, EPOCHS))
    assert resumed == {e: cora["losses"][1][e] for e in resumed}
    assert cora["sha"][f"r{a}{b}"] == cora["sha"][1]


def test_control_the_folders_own_k_differs(cora):
    """The old path (one part per process, here one process and one part: one product over all its rows) gives
    other floats than V = 4: the comparisons above can fail."""
    assert cora["losses"]["v1"] != cora["losses"][1]
    assert cora["sha"]["v1"] != cora["sha"][1]
