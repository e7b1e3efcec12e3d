import importlib.util
from pathlib import Path

import pytest
import torch

from haloflow.data.jagged import JaggedBatch
from haloflow.engine.dlrm.embedding_layout import EmbeddingLayout, predict_step_bytes
from haloflow.engine.dlrm.sharded_embedding import ShardedEmbeddingCollection
from haloflow.errors import ConfigError, PlanError
from haloflow.partition.planner.types import Shard, ShardingPlan, ShardingType, TablePlan
from tests.conftest import run_torchrun

SCRIPTS = Path(__file__).parents[1] / "scripts"
_spec = importlib.util.spec_from_file_location("dlrm_common", SCRIPTS / "dlrm_common.py")
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)

TW, RW, DP = ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_one_process_mixed_plan_matches_the_single_device_tables(device):
    tables = common.small_model(seed=2).embeddings.to(device)
    coll = ShardedEmbeddingCollection.from_tables(tables, common.mixed_plan(1), group=None)
    _, sparse, _ = common.global_batches(1, 9, seed=4)[0]
    sparse = sparse.to(device)
    weight = torch.randn(9, len(common.ROWS), common.DIM, generator=torch.Generator().manual_seed(0)).to(device)
    ref = tables(sparse)
    out = coll(sparse)
    torch.testing.assert_close(out, ref)
    (ref * weight).sum().backward()
    (out * weight).sum().backward()
    coll.sync_grads()
    L = coll.layout
    grads = {s.table: w.grad for s, w in zip(coll.slots, coll.shards)}
    grads.update({t: w.grad for t, w in zip(L.dp_tables, coll.replicas)})
    for t, bag in enumerate(tables.tables):
        assert grads[t].is_sparse
        torch.testing.assert_close(grads[t].to_dense(), bag.weight.grad.to_dense())
    for got, bag in zip(coll.full_tables(), tables.tables):
        assert torch.equal(got, bag.weight.detach())


def _tiny_plan() -> ShardingPlan:
    # t0 (4 rows) table-wise on rank 1; t1 (6 rows) row-wise, rows 0..2 on rank 0 and 3..5 on rank 1;
    # t2 (5 rows) data-parallel. D = 2.
    return ShardingPlan(2, (
        TablePlan("t0", 0, TW, (Shard(1, 0, 4, 0, 2),)),
        TablePlan("t1", 1, RW, (Shard(0, 0, 3, 0, 2), Shard(1, 3, 3, 0, 2))),
        TablePlan("t2", 2, DP, (Shard(0, 0, 5, 0, 2), Shard(1, 0, 5, 0, 2))),
    ))


def test_predicted_bytes_by_hand():
    layout = EmbeddingLayout.from_plan(_tiny_plan(), [4, 6, 5], 2)
    batch = JaggedBatch.from_lists([
        [[1], [2, 3], []],  # t0
        [[0, 5], [4], [2]],  # t1
        [[1, 1], [0], [4]],  # t2
    ])
    got = predict_step_bytes(layout, batch, [2, 1], dense_buckets=[10])
    # rank 0 (samples 0, 1) sends rank 1 the lengths of its 2 slots (2 x 2 x 8 B) and ids 1, 2, 3 (t0) and
    # 5, 4 (t1 rows 3..5); its row-wise partial sums for sample 2 (1 x 2 floats); gradients of its 2 samples
    # to rank 1's table-wise and row-wise shards (2 x 2 floats each); 2 unique rows of t2; 5 + 5 MLP floats (reduce-scatter and all-gather of a 10-float bucket).
    assert got[0] == {"dense_grad": 40, "dp_grad_counts": 8, "dp_grad_indices": 16, "dp_grad_values": 16,
                      "input_lengths": 32, "input_values": 40, "pooled_grad": 16, "reduce_scatter": 8,
                      "reduce_scatter_grad": 16}
    # rank 1 (sample 2) sends rank 0 one length and id 2 (t1 rows 0..2); pooled t0 rows and row-wise partial
    # sums for samples 0, 1 (2 x 2 floats each); one gradient row to rank 0's row-wise shard; 1 unique t2 row.
    assert got[1] == {"dense_grad": 40, "dp_grad_counts": 8, "dp_grad_indices": 8, "dp_grad_values": 8,
                      "input_lengths": 8, "input_values": 8, "pooled": 16, "reduce_scatter": 16,
                      "reduce_scatter_grad": 8}


def test_a_plan_for_v_logical_ranks_is_hosted_by_k_ranks_row_shards_in_logical_order():
    """The plan for 2 logical ranks on one process: every shard on rank 0, a row-wise table's shards in
    logical-rank order (the order its partial sums are added in at K = 2); 3 ranks cannot host 2."""
    weights = [torch.zeros(4, 2), torch.zeros(6, 2), torch.zeros(5, 2)]
    one = ShardedEmbeddingCollection.from_weights(_tiny_plan(), weights, group=None)
    two = EmbeddingLayout.from_plan(_tiny_plan(), [4, 6, 5], 2)
    assert one.layout.world_size == 1 and [(s.table, s.row_offset) for s in one.slots] == [(0, 0), (1, 0), (1, 3)]
    assert {(s.table, s.row_offset, s.num_rows) for r in two.slots for s in r} == {
        (s.table, s.row_offset, s.num_rows) for s in one.slots}
    assert one.layout.row_bounds(1) == two.row_bounds(1)
    with pytest.raises(PlanError, match="plan is for 2 logical ranks, which 3 ranks cannot host"):
        EmbeddingLayout.from_plan(_tiny_plan(), [4, 6, 5], 2, ranks=3)


def test_row_ranges_with_a_gap_are_refused():
    plan = ShardingPlan(2, (TablePlan("t0", 0, RW, (Shard(0, 0, 2, 0, 2), Shard(1, 3, 3, 0, 2))),))
    with pytest.raises(PlanError, match="t0.*starts at row 3, expected 2"):
        EmbeddingLayout.from_plan(plan, [6], 2)


def test_out_of_range_id_names_the_feature():
    plan = ShardingPlan(1, (TablePlan("t0", 0, TW, (Shard(0, 0, 4, 0, 2),)),
                            TablePlan("t1", 1, RW, (Shard(0, 0, 6, 0, 2),))))
    coll = ShardedEmbeddingCollection.from_weights(plan, [torch.zeros(4, 2), torch.zeros(6, 2)], group=None)
    with pytest.raises(ConfigError, match=r"sparse feature 1: id 7 outside table 1's rows 0\.\.5"):
        coll(JaggedBatch.from_lists([[[1], [2]], [[0], [7]]]))


@pytest.mark.slow
def test_collection_on_three_ranks_matches_single_device_lookup_and_gradients():
    proc = run_torchrun(SCRIPTS / "dlrm_collection.py", 3, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "COLLECTION OK" in proc.stdout
