"""Checkpoints across sizes and faults, as a user runs them (``haloflow train ... --nproc K``, real gloo ranks):

* elastic resume: TGN 2 -> 1 mid-epoch, weights and memory bit for bit (every family's resume at another K of
  the same V, 2 -> 1, 1 -> 4, 4 -> 2: tests/engine/{gcn,dlrm,tgn}/test_exact*.py, test_k_invariance.py);
* kill and restart: ``--fail-at`` kills a rank with SIGKILL, ``--max-restarts 1`` restarts every rank from the
  last checkpoint, and the final weights equal the fault-free run's bit for bit;
* a killed rank without restarts ends the job with exit 1 and a line naming the rank, within the timeout.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from haloflow.engine.checkpoint import open_checkpoint
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.conftest import REPO
from tests.engine.scripts.common import small_dataset

pytestmark = pytest.mark.slow

QUIET = ["--no-progress", "--log-every", "1000"]
GCN = ["train", "gcn", "--lr", "0.05", "--hidden", "8", *QUIET]
DLRM = ["train", "dlrm", "--synthetic", "--synthetic-max-rows", "50", "--synthetic-train", "640",
        "--synthetic-val", "64", "--batch-size", "32", "--embedding-dim", "4", "--bottom-mlp", "8", "--top-mlp", "8",
        "--max-eval-batches", "1", "--epochs", "3", "--max-steps", "40", *QUIET]  # --max-steps stops it


def haloflow(*argv, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "haloflow", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("parts")
    data = small_dataset(num_nodes=150, num_edges=700, feat_dim=8, num_classes=3, seed=5)
    out = {}
    for k in (1, 2, 4):
        partition_dataset(data, PartitionConfig(num_parts=k, method="random", seed=1), root / f"k{k}", progress=False)
        out[k] = root / f"k{k}"
    return out


def gcn_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def dlrm_weights(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    loaded = open_checkpoint(ckpt_dir)
    ident = loaded.manifest["identity"]
    tables = {f"table{t}": loaded.rows(t, (0, n), (0, ident["embedding_dim"]), "weight")
              for t, n in enumerate(ident["table_sizes"])}
    return {**loaded.state["dense"]["weights"], **tables}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_gcn_recovers_from_a_killed_rank_bit_for_bit(tmp_path, parts):
    # the uninterrupted run at K = 2 (resuming at another K: tests/engine/gcn/test_exact_at_any_k.py, bitwise)
    ok(haloflow(*GCN, "--partitions", parts[2], "--nproc", 2, "--epochs", 10, "--save", tmp_path / "full2.pt"))
    # kill rank 1 at epoch 7, restart from the checkpoint of epoch 6: the fault-free K=2 run, bit for bit
    out = ok(haloflow(*GCN, "--partitions", parts[2], "--nproc", 2, "--epochs", 10, "--checkpoint-dir",
                      tmp_path / "c", "--checkpoint-every", 3, "--max-restarts", 1, "--fail-at", 7,
                      "--fail-rank", 1, "--save", tmp_path / "c.pt"))
    assert "--fail-at 7: killing this rank" in out.stderr and re.search(r"resumed after epoch\s+6\b", out.stdout)
    assert_same(gcn_weights(tmp_path / "full2.pt"), gcn_weights(tmp_path / "c.pt"))


def test_dlrm_recovers_from_a_killed_rank_bit_for_bit(tmp_path):
    # the uninterrupted run (40 steps) at K = 2 (resuming at another K: tests/engine/dlrm/test_exact.py, bitwise)
    ok(haloflow(*DLRM, "--nproc", 2, "--checkpoint-dir", tmp_path / "full2", "--checkpoint-every", 25))
    # rank 0 killed at step 25, everyone restarted from step 20: the fault-free K=2 run, bit for bit
    out = ok(haloflow(*DLRM, "--nproc", 2, "--checkpoint-dir", tmp_path / "c", "--checkpoint-every", 10,
                      "--max-restarts", 1, "--fail-at", 25, "--fail-rank", 0))
    assert "--fail-at 25: killing this rank" in out.stderr and re.search(r"resumed after step\s+20\b", out.stdout)
    assert_same(dlrm_weights(tmp_path / "full2"), dlrm_weights(tmp_path / "c"))


def test_a_killed_rank_without_restarts_ends_the_job_naming_it(tmp_path, parts):
    t0 = time.perf_counter()
    proc = haloflow(*GCN, "--partitions", parts[2], "--nproc", 2, "--epochs", 50, "--timeout", 10,
                    "--fail-at", 3, "--fail-rank", 1)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("haloflow: error: rank 1 (pid ") and "of 2 died without a message" in last, last
    assert time.perf_counter() - t0 < 90


def test_restarts_need_a_checkpoint_dir_and_nproc(cli_fails, parts):
    cli_fails([*GCN, "--partitions", parts[2], "--nproc", 2, "--max-restarts", 1], "--max-restarts needs "
              "--checkpoint-dir")
    cli_fails([*GCN, "--partitions", parts[1], "--max-restarts", 1, "--checkpoint-dir", "x"],
              "--max-restarts restarts the ranks --nproc starts")


TGN = ["train", "tgn", "--batch-size", "64", "--memory-dim", "16", "--time-dim", "8", "--embedding-dim", "16",
       "--neighbors", "5", "--lr", "0.001", "--max-batches", "10", "--epochs", "2", "--no-eval", *QUIET]


def tgn_state(ckpt_dir: Path) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The weights and every node's memory row (by global id) of a TGN checkpoint, whatever K wrote it."""
    loaded = open_checkpoint(ckpt_dir)
    n = loaded.manifest["identity"]["nodes"]
    return loaded.state["model"], loaded.rows_at(0, torch.arange(n), "memory")


def test_tgn_resumes_mid_epoch_at_another_size(tmp_path):
    from tests.engine.scripts.tgn_parity import stream

    ev = stream(num_events=2000)
    lines = ["u,i,ts,label,f0,f1,f2"] + [f"{u},{v},{t},0,{','.join(f'{x:.6f}' for x in f)}"
                                         for u, v, t, f in zip(ev.src, ev.dst, ev.t, ev.edge_feat)]
    events = tmp_path / "events.csv"
    events.write_text("\n".join(lines) + "\n")
    # 20 batches (2 epochs of 10): uninterrupted at K = 1, and at K = 2 with a checkpoint inside epoch 0
    ok(haloflow(*TGN, "--events", events, "--checkpoint-dir", tmp_path / "full1"))
    ok(haloflow(*TGN, "--events", events, "--nproc", 2, "--checkpoint-dir", tmp_path / "two",
                "--checkpoint-every", 7, "--checkpoint-keep", 3))
    out = ok(haloflow(*TGN, "--events", events, "--resume", tmp_path / "two" / "step-00000007",
                      "--checkpoint-dir", tmp_path / "a1"))
    assert re.search(r"resumed after batch\s+7\b", out.stdout), out.stdout  # not trained again from scratch
    (w_full, mem_full), (w_res, mem_res) = tgn_state(tmp_path / "full1"), tgn_state(tmp_path / "a1")
    # V = 4 logical workers at K = 2 for 7 batches, then at K = 1: the same bits (issue 33)
    assert_same(w_full, w_res)
    assert torch.equal(mem_res, mem_full)
