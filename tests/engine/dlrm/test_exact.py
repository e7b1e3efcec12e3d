"""K ranks train the floats one process trains: DLRM on V = 4 logical workers at --nproc 1, 2 and 4.

Each run is the command a user types (``haloflow train dlrm --synthetic``, 200 steps, float32) with one plan for 4
logical ranks that holds every kind of table (table-, row- and column-wise, data-parallel, cached). Compared:
every logged loss with ``==``, the validation metrics, and the SHA-256 of the final checkpoint's state in global
terms (MLP weights and optimizer state, every table row and its optimizer state). A resume at another K continues
bitwise; the control (``--no-k-invariance``, V = K) differs, so the comparison can fail.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.engine.checkpoint import newest, open_checkpoint
from haloflow.partition.planner.plan_io import save_plan
from haloflow.partition.planner.types import Shard, ShardingPlan, ShardingType, TablePlan

pytestmark = pytest.mark.slow

DP, TW, RW, CW, CACHED = (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.ROW_WISE,
                          ShardingType.COLUMN_WISE, ShardingType.CACHED)
V, D, STEPS = 4, 16, 200


def mixed_plan_for_v() -> ShardingPlan:
    """The synthetic log's 26 tables on 4 logical ranks: two row-wise (one with its shards' ranks out of order),
    one column-wise, one cached, the one-row tables data-parallel, the rest table-wise round the ranks."""
    sizes = ClickLogGenerator(ClickLogConfig(scale=1e-3)).sizes
    tables = []
    for t, n in enumerate(sizes):
        if t == 2:  # 10,131 rows in four row ranges
            q = n // 4
            kind, shards, cache = RW, tuple(Shard(r, r * q, q if r < 3 else n - 3 * q, 0, D) for r in range(4)), None
        elif t == 15:  # 5,461 rows on ranks 3 and 1
            kind, shards, cache = RW, (Shard(3, 0, n // 2, 0, D), Shard(1, n // 2, n - n // 2, 0, D)), None
        elif t == 3:
            kind, shards, cache = CW, (Shard(1, 0, n, 0, 4), Shard(2, 0, n, 4, 12)), None
        elif t == 11:
            kind, shards, cache = CACHED, (Shard(2, 0, n, 0, D),), n // 20
        elif n == 1:
            kind, shards, cache = DP, tuple(Shard(r, 0, n, 0, D) for r in range(4)), None
        else:
            kind, shards, cache = TW, (Shard(t % 4, 0, n, 0, D),), None
        tables.append(TablePlan(f"t{t}", t, kind, shards, cache))
    return ShardingPlan(V, tuple(tables))


def _train(tmp, name: str, k: int, *args: str, steps: int = STEPS) -> dict:
    """One ``haloflow train dlrm`` at --nproc k: its train losses, summary and final checkpoint's digest."""
    out = tmp / name
    cmd = [sys.executable, "-m", "haloflow", "train", "dlrm", "--synthetic", "--max-steps", str(steps),
           "--log-every", "1", "--max-eval-batches", "4", "--nproc", str(k), "--log-jsonl", str(out / "log.jsonl"),
           "--checkpoint-dir", str(out / "ck"), "--checkpoint-every", str(STEPS // 2), "--device", "cpu", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    summary = records[-1]
    return {"losses": [r["loss"] for r in records if r.get("kind") == "train"], "summary": summary,
            "digest": open_checkpoint(newest(out / "ck")).digest(), "ck": out / "ck"}


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    return save_plan(mixed_plan_for_v(), tmp_path_factory.mktemp("plan") / "plan.json")


@pytest.fixture(scope="module", params=["sgd", "adagrad"])
def runs(request, plan_file, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"dlrm-{request.param}")
    args = ("--plan", str(plan_file), "--optimizer", request.param)
    return {k: _train(tmp, f"k{k}", k, *args) for k in (1, 2, 4)} | {"tmp": tmp, "args": args}


def test_every_loss_and_the_final_state_are_equal_at_k_1_2_4(runs):
    one = runs[1]
    assert len(one["losses"]) == STEPS
    for k in (2, 4):
        assert runs[k]["losses"] == one["losses"], f"K = {k}: first differing step " + str(
            next(i for i, (a, b) in enumerate(zip(runs[k]["losses"], one["losses"])) if a != b) + 1)
        assert runs[k]["summary"]["metrics"]["val_logloss"] == one["summary"]["metrics"]["val_logloss"]
        assert runs[k]["summary"]["metrics"]["val_auc"] == one["summary"]["metrics"]["val_auc"]
        assert runs[k]["digest"] == one["digest"], f"K = {k}: final state differs"
        assert (runs[k]["summary"]["world_size"], runs[k]["summary"]["logical_workers"]) == (k, V)


def test_resume_at_another_k_continues_bitwise(runs):
    """Step 100 of the run at one K, the rest at another (2 -> 1, 1 -> 4, 4 -> 2): the uninterrupted run's state."""
    tmp, args = runs["tmp"], runs["args"]
    if args[-1] != "sgd":
        pytest.skip("the resume path is the optimizer's own state either way: one optimizer is enough")
    half = f"step-{STEPS // 2:08d}"
    for first, then in ((2, 1), (1, 4), (4, 2)):
        name = f"resume-{first}-{then}"
        shutil.copytree(runs[first]["ck"] / half, tmp / name / "from" / half)  # the mid-run checkpoint alone
        resumed = _train(tmp, name, then, "--resume", str(tmp / name / "from"), *args)
        assert resumed["digest"] == runs[1]["digest"], f"{first} -> {then}"
        assert resumed["losses"] == runs[1]["losses"][STEPS // 2:], f"{first} -> {then}"


def test_control_without_k_invariance_the_runs_part(runs, tmp_path):
    """The same comparison with V = K (each rank one product over its samples) fails: the test can fail."""
    if runs["args"][-1] != "sgd":
        pytest.skip("one control is enough")
    one = _train(tmp_path, "c1", 1, "--no-k-invariance", steps=STEPS // 4)  # they part within a few steps
    two = _train(tmp_path, "c2", 2, "--no-k-invariance", steps=STEPS // 4)
    assert one["losses"] != two["losses"] and one["digest"] != two["digest"]
