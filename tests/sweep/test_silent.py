"""SILENT: exit 0 on a bad input or a failed run (issue 37). Each case now ends with one line and a non-zero
status, or (a valid input) succeeds and says what it skipped instead of printing NaN."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.sweep.cases import DLRM, GCN, TGN, Case, run_case

pytestmark = pytest.mark.timeout(300)


def _checkpoints_with_a_newer_step_without_manifest(tmp: Path) -> None:
    """Checkpoints at epochs 1 and 2; then epoch 2's manifest lost (a copy cut short)."""
    from haloflow.cli import main

    assert main([*_gcn_in(), "--checkpoint-dir", str(tmp / "ck"), "--checkpoint-every", "1"]) == 0
    (tmp / "ck" / "step-00000002" / "manifest.json").unlink()


_INPUTS: list[Path] = []


def _gcn_in() -> list[str]:
    return [a.replace("{in}", str(_INPUTS[0])) for a in GCN]


_ONE = ("train", "gcn", "--epochs", "1", "--no-progress", "--device", "cpu")
_PART = ("partition", "{in}/g.txt", "--parts", "2", "--out", "{tmp}/parts")
_PLAN = ("plan-tables", "--tables", "{in}/tables.json", "--world-size", "2", "--memory-per-rank", "1GiB")

CASES = [
    # inputs that were read as something else
    Case("planetoid-test-index-out-of-range", (*_ONE, "--dataset", "{in}/planetoid-bad"), 2,
         "ind.cora.test.index:2: test id 999999 is out of range"),
    Case("planetoid-test-index-partition", ("partition", "{in}/planetoid-bad", "--parts", "2", "--out",
                                            "{tmp}/parts"), 2, "test.index:2", absent=("{tmp}/parts",)),
    Case("overlapping-splits", (*_ONE, "--dataset", "{in}/overlap"), 2, "expected disjoint train, val and test"),
    Case("overlapping-splits-partition", ("partition", "{in}/overlap", "--parts", "2", "--out", "{tmp}/parts"), 2,
         "val_mask.npy", absent=("{tmp}/parts",)),
    Case("nul-in-edge-list-partition", (*_PART[:1], "{in}/nul.txt", *_PART[2:]), 2, "nul.txt:3: a NUL byte",
         absent=("{tmp}/parts",)),
    Case("nul-in-edge-list-train", (*_ONE, "--dataset", "{in}/nul.txt"), 2, "nul.txt:3"),
    Case("nul-in-edge-list-ooc", (*_PART[:1], "{in}/nul.txt", *_PART[2:], "--method", "random", "--memory-budget",
                                  "4GiB"), 2, "NUL byte", absent=("{tmp}/parts",)),
    # a failed run fails
    Case("gcn-nan-loss", (*GCN[:5], "4", *GCN[6:], "--lr", "1e30"), 1, "gcn: the loss at epoch"),
    Case("dlrm-nan-loss", (*DLRM, "--lr", "1e30"), 1, "dlrm: the loss at step"),
    Case("tgn-nan-loss", (*TGN, "--lr", "1e30"), 1, "a smaller --lr"),
    Case("gcn-nan-loss-names-the-checkpoint", (*GCN[:5], "4", *GCN[6:], "--lr", "1e30", "--checkpoint-dir",
                                               "{tmp}/ck", "--checkpoint-every", "1"), 1,
         "the last good checkpoint is {tmp}/ck/step-00000001"),
    Case("gcn-nan-loss-allowed", (*GCN, "--lr", "1e30", "--allow-nonfinite"), 0, "test acc"),
    # DLRM reads its losses back once per --log-every steps: a checkpoint due before that reads them first
    Case("dlrm-nan-loss-writes-no-checkpoint", (*DLRM, "--lr", "1e30", "--checkpoint-dir", "{tmp}/ck",
                                                "--checkpoint-every", "2"), 1,
         "the run stopped before writing a checkpoint of it"),
    Case("gcn-zero-val-nodes", (*_ONE, "--dataset", "{in}/noval"), 0, "skipped (no val nodes)"),
    Case("dlrm-zero-val-rows", (*DLRM[:8], "0", *DLRM[9:]), 0, "skipped (no validation rows)"),
    Case("newest-checkpoint-without-manifest", (*GCN[:5], "4", *GCN[6:], "--resume", "{tmp}/ck"), 2,
         "step-00000002: no manifest.json", setup=_checkpoints_with_a_newer_step_without_manifest),
    # flags that do not apply are errors naming the flag that makes them apply
    Case("staleness-with-dataset", (*_ONE, "--dataset", "{in}/planetoid", "--staleness", "1"), 2,
         "--staleness applies only to --partitions"),
    Case("halo-keep-with-dataset", (*_ONE, "--dataset", "{in}/planetoid", "--halo-keep", "0.5"), 2,
         "--halo-keep applies only to --partitions"),
    Case("directed-with-partitions", (*GCN, "--directed"), 2, "--directed applies only to --dataset"),
    Case("num-nodes-with-partitions", (*GCN, "--num-nodes", "60"), 2, "--num-nodes applies only to --dataset"),
    Case("one-based-with-partitions", (*GCN, "--one-based"), 2, "--one-based applies only to --dataset"),
    Case("passes-with-metis", (*_PART, "--method", "metis", "--passes", "3"), 2,
         "--passes applies only to --method fennel", absent=("{tmp}/parts",)),
    Case("passes-with-default-method", (*_PART, "--passes", "3"), 2, "--passes applies only to --method fennel"),
    Case("fennel-start-with-random", (*_PART, "--method", "random", "--fennel-start", "stream"), 2,
         "--fennel-start applies only to --method fennel"),
    Case("fennel-order-with-random", (*_PART, "--method", "random", "--fennel-order", "natural"), 2,
         "--fennel-order applies only"),
    Case("passes-with-random-ooc", (*_PART, "--method", "random", "--passes", "2", "--memory-budget", "4GiB"), 2,
         "--passes applies only"),
    Case("cache-curves-without-cached", (*_PLAN, "--cache-curves", "5"), 2, "--cache-curves applies only"),
    Case("cache-policy-without-cached", (*_PLAN, "--cache-policy", "lfu"), 2, "--cache-policy applies only"),
    Case("bench-gcn-entries-past-nodes", ("bench", "gcn", "--nodes", "10", "--entries", "10000", "--epochs", "1",
                                          "--out", "{tmp}/r.json"), 2, "do not fit in a graph of 10 nodes",
         absent=("{tmp}/r.json",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_silent(case_inputs, tmp_path, case):
    _INPUTS[:] = [case_inputs]
    says = case.says.replace("{tmp}", str(tmp_path))
    run_case(Case(case.id, case.argv, case.code, says, case.keep, case.absent, case.gone, case.setup),
             case_inputs, tmp_path, "SILENT")
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.slow
def test_a_nan_loss_under_nproc_2_ends_the_job_with_one_line_and_exit_1(tmp_path):
    """Every rank sees the same global loss, so every rank stops at the same epoch; the launcher says it once."""
    import subprocess
    import sys

    from haloflow.partition.api import PartitionConfig
    from haloflow.partition.pipeline import partition_dataset
    from tests.engine.scripts.common import small_dataset

    partition_dataset(small_dataset(num_nodes=60, num_edges=200, feat_dim=4, num_classes=3, seed=2),
                      PartitionConfig(num_parts=2, method="random"), tmp_path / "k2", progress=False)
    argv = ["train", "gcn", "--partitions", str(tmp_path / "k2"), "--nproc", "2", "--epochs", "4", "--lr", "1e30",
            "--no-progress", "--device", "cpu"]
    proc = subprocess.run([sys.executable, "-m", "haloflow", *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("haloflow: error: gcn: the loss at epoch 2 is nan")
