import importlib.util
import json
from pathlib import Path

import pytest
import torch

from haloflow.engine.dlrm.sharding import shard_dlrm
from haloflow.errors import PlanError
from haloflow.models.dlrm import dlrm_loss
from haloflow.partition.planner.types import Shard, ShardingPlan, ShardingType, TablePlan
from tests.conftest import run_torchrun

SCRIPTS = Path(__file__).parents[1] / "scripts"
_spec = importlib.util.spec_from_file_location("dlrm_common", SCRIPTS / "dlrm_common.py")
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
)
def test_one_process_sharded_model_trains_like_the_model(device):
    ref = common.small_model().to(device)
    sharded = shard_dlrm(common.small_model().to(device), common.mixed_plan(1), None)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
    for dense, sparse, labels in common.global_batches(3, 8, seed=2):
        dense, sparse, labels = dense.to(device), sparse.to(device), labels.to(device)
        for model, o in ((ref, opt_ref), (sharded, opt)):
            o.zero_grad()
            loss = dlrm_loss(model(dense, sparse), labels)
            loss.backward()
            if model is sharded:
                sharded.finish_grad_sync()
            o.step()
    got, want = sharded.to_dlrm().state_dict(), ref.state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k].cpu(), msg=k)
    assert not torch.equal(want["top.0.weight"].cpu(), common.small_model().state_dict()["top.0.weight"])


def test_plan_with_fewer_tables_than_the_model_is_refused():
    plan = ShardingPlan(1, (TablePlan("t0", 0, ShardingType.TABLE_WISE, (Shard(0, 0, 11, 0, 4),)),))
    with pytest.raises(PlanError, match="plan has 1 tables but the model has 6"):
        shard_dlrm(common.small_model(), plan, None)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [4])  # K = 2 on a mixed plan: tests/engine/dlrm/test_train.py, through the CLI
def test_ten_steps_match_the_single_process_dlrm(nproc):
    # Mixed plan (data-parallel, table-, row- and column-wise), global batch 13 split unevenly; the script
    # checks losses, final weights and bytes per step against the single-process run and the prediction.
    proc = run_torchrun(SCRIPTS / "dlrm_parity.py", nproc, ["--steps", "10", "--batch", "13"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PARITY OK"))
    summary = json.loads(line[len("PARITY OK "):])
    assert summary["world_size"] == nproc and len(summary["sparse"]["losses"]) == 10
    assert all(b > 0 for b in summary["sparse"]["bytes_per_step"])


def test_exchanges_overlap_the_bottom_mlp_forward_and_backward(monkeypatch):
    from haloflow.engine.dlrm import embedding_dist

    events = []
    real = embedding_dist.all_to_all

    def logged(*args, kind="all_to_all", **kwargs):
        events.append(kind)
        return real(*args, kind=kind, **kwargs)

    monkeypatch.setattr(embedding_dist, "all_to_all", logged)
    model = shard_dlrm(common.small_model(), common.mixed_plan(1), None)
    model.bottom.register_forward_hook(lambda *_: events.append("bottom forward"))
    model.bottom[0].weight.register_post_accumulate_grad_hook(lambda *_: events.append("bottom backward"))
    dense, sparse, labels = common.global_batches(1, 6)[0]
    dlrm_loss(model(dense, sparse), labels).backward()
    # Forward: both output exchanges are in flight while the bottom MLP runs; backward: their reverse
    # exchanges start before the bottom MLP's gradients are computed.
    assert events.index("pooled") < events.index("bottom forward")
    assert events.index("reduce_scatter") < events.index("bottom forward")
    assert events.index("pooled_grad") < events.index("bottom backward")
    assert events.index("reduce_scatter_grad") < events.index("bottom backward")


@pytest.mark.slow
@pytest.mark.parametrize("k", [4])  # mixed_plan(4): the sharding kinds of K = 2's, and ranks that own no TW/CW shard
def test_shards_are_built_in_place_with_the_single_process_values(tmp_path, k):
    """No rank allocates a table it does not own: its embedding storage is exactly the plan's shards for it, and
    the shards gathered together are the single-process tables bit for bit."""
    proc = run_torchrun(SCRIPTS / "dlrm_init.py", k, [tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(k)]
    whole = 4 * common.DIM * sum(common.ROWS)
    for r in records:
        assert r["allocated"] == r["planned"] < whole
        assert r["tables_equal"] and r["mlps_equal"]
