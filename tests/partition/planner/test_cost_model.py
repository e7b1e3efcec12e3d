import numpy as np
import pytest

from haloflow.data.jagged import JaggedBatch
from haloflow.engine.dlrm.embedding_layout import EmbeddingLayout, predict_step_bytes
from haloflow.errors import ConfigError
from haloflow.partition.planner.cost_model import EmbeddingCostModel
from haloflow.partition.planner.types import Shard, ShardingPlan, ShardingType, TablePlan, TableSpec, Topology

DP, TW, RW, CW = ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE


def test_hand_computed_costs_of_a_table_wise_and_a_replicated_table():
    # K = 2, B = 4 (b = 2 per rank), fp32, int64 ids, 2 ids per sample, tables 10 x 4.
    specs = [TableSpec(name="tw", num_rows=10, dim=4, pooling_factor=2.0),
             TableSpec(name="dp", num_rows=10, dim=4, pooling_factor=2.0)]
    plan = ShardingPlan(2, (TablePlan("tw", 0, TW, (Shard(0, 0, 10, 0, 4),)),
                            TablePlan("dp", 1, DP, (Shard(0, 0, 10, 0, 4), Shard(1, 0, 10, 0, 4)))))
    topo = Topology(world_size=2, memory_per_rank=1e6, lookup_bandwidth=1.0, a2a_bandwidth=1.0,
                    allreduce_bandwidth=1.0)
    dense, sparse = (EmbeddingCostModel(batch_size=4, optimizer_slots=1.0, dp_grad=g) for g in ("dense", "sparse"))
    c0, c1 = dense.rank_costs(plan, specs, topo)
    # tw on rank 0: ids+lengths from rank 1 = 2 samples * (2 + 1) * 8 = 48 B; pooled out 2 * 4 * 4 = 32 B, its
    # gradient back 32 B; lookups 3 passes * 4 samples * 2 ids * 4 cols * 4 B = 384 B.
    # dp on both: lookups 3 * 2 * 2 * 4 * 4 = 192 B; ring all-reduce 2 * (2-1)/2 * 10 * 4 * 4 = 160 B sent.
    assert (c0.traffic.lookup, c0.traffic.a2a_in, c0.traffic.a2a_out, c0.traffic.allreduce) == (576, 80, 32, 160)
    assert (c1.traffic.lookup, c1.traffic.a2a_in, c1.traffic.a2a_out, c1.traffic.allreduce) == (192, 32, 80, 160)
    assert c0.cost == pytest.approx(576 + 80 + 32 + 160)
    # memory: weights + one optimizer slot = 2 * 10 * 4 * 4 = 320 B per full table
    assert (c0.memory.device, c1.memory.device) == (640, 320)
    # sparse: all-gather of the distinct rows among 4 uniform draws from 10: u = 10 * (1 - 0.9^4) = 3.439,
    # each sent as an int64 id and 4 fp32 values, plus one count: 8 + 3.439 * 24 B to the one peer
    s0, s1 = sparse.rank_costs(plan, specs, topo)
    assert s0.traffic.allreduce == pytest.approx(8 + 3.439 * 24) == s1.traffic.allreduce


def test_bytes_sent_match_the_sharded_engines_accounting():
    # K = 3, D = 8, B = 6 (2 per rank), 2 ids per sample; the row-wise table gets exactly half of every
    # rank's ids in each row half, which is its expected share under uniform ids.
    specs = [TableSpec(name=f"t{i}", num_rows=100, dim=8, pooling_factor=2.0) for i in range(3)]
    plan = ShardingPlan(3, (
        TablePlan("t0", 0, TW, (Shard(1, 0, 100, 0, 8),)),
        TablePlan("t1", 1, RW, (Shard(2, 0, 50, 0, 8), Shard(0, 50, 50, 0, 8))),
        TablePlan("t2", 2, CW, (Shard(0, 0, 100, 0, 4), Shard(1, 0, 100, 4, 4))),
    ))
    rng = np.random.default_rng(0)
    bags = [[sorted(rng.integers(0, 100, 2).tolist()) for _ in range(6)] for _ in range(3)]
    bags[1] = [[int(rng.integers(0, 50)), int(rng.integers(50, 100))] for _ in range(6)]
    batch = JaggedBatch.from_lists(bags)
    engine = predict_step_bytes(EmbeddingLayout.from_plan(plan, [100] * 3, 8), batch, [2, 2, 2])
    topo = Topology(world_size=3, memory_per_rank=1e9)
    costs = EmbeddingCostModel(batch_size=6).rank_costs(plan, specs, topo)
    assert [c.traffic.a2a_out for c in costs] == pytest.approx([sum(e.values()) for e in engine])
    # what is sent is received
    assert sum(c.traffic.a2a_in for c in costs) == pytest.approx(sum(c.traffic.a2a_out for c in costs))


def test_expected_unique_limits():
    cm = EmbeddingCostModel()
    assert cm.expected_unique(1e9, 100.0) == pytest.approx(100.0, rel=1e-6)  # few draws: all distinct
    assert cm.expected_unique(10, 1e6) == pytest.approx(10.0)  # many draws: every row
    hot = TableSpec(name="h", num_rows=1000, dim=4, id_frequencies=np.array([1.0] + [0.0] * 9))
    assert cm.table_unique(hot, 1) == pytest.approx(100.0)  # all mass on the first 100 rows


def test_config_errors():
    with pytest.raises(ConfigError, match="dp_grad must be 'sparse' or 'dense', got 'ring'"):
        EmbeddingCostModel(dp_grad="ring")
    with pytest.raises(ConfigError, match="batch_size must be an integer >= 1, got 0"):
        EmbeddingCostModel(batch_size=0)


def test_hand_computed_costs_of_a_cached_table():
    # K = 2, B = 4, 2 ids per sample, a 10 x 4 table cached on rank 1 with 4 of its rows on the device, Adagrad
    # (one optimizer float per weight). Uniform ids: u = 10 (1 - 0.9^8) = 5.6953 distinct ids per global batch,
    # hit rate 4 / 10, so 0.6 u misses, each moving a row and its state in and a victim out: 2 x 32 B.
    spec = TableSpec(name="c", num_rows=10, dim=4, pooling_factor=2.0)
    plan = ShardingPlan(2, (TablePlan("c", 0, ShardingType.CACHED, (Shard(1, 0, 10, 0, 4),), cache_rows=4),))
    topo = Topology(world_size=2, memory_per_rank=1e6, lookup_bandwidth=1.0, a2a_bandwidth=1.0,
                    allreduce_bandwidth=1.0, host_bandwidth=2.0)
    cm = EmbeddingCostModel(batch_size=4, optimizer_slots=1.0)
    c0, c1 = cm.rank_costs(plan, [spec], topo)
    u = 10 * (1 - 0.9**8)
    assert c1.traffic.host == pytest.approx(2 * 0.6 * u * 32) and c0.traffic.host == 0
    tw = cm.rank_costs(ShardingPlan(2, (TablePlan("c", 0, TW, (Shard(1, 0, 10, 0, 4),)),)), [spec], topo)
    assert c1.cost == pytest.approx(tw[1].cost + c1.traffic.host / 2.0) and c0.cost == pytest.approx(tw[0].cost)
    # device: the 4 slots with their state; host: the whole table with its state, and the cache's int64 maps
    # (row -> slot and the policy's score per row, slot -> row and the free list per slot)
    assert (c1.memory.device, c1.memory.host) == (4 * 32, 10 * 32 + 16 * (10 + 4))
    assert (c0.memory.device, c0.memory.host) == (0, 0)


def test_hit_rates_from_a_curve_a_histogram_or_uniform_ids():
    cm = EmbeddingCostModel(batch_size=4)
    curve = TableSpec(name="c", num_rows=100, dim=4, cache_curve=[(10, 0.5), (30, 0.7)])
    np.testing.assert_allclose(cm.hit_rate(curve, [5, 10, 20, 30, 90]), [0.25, 0.5, 0.6, 0.7, 0.7])
    uniform = TableSpec(name="u", num_rows=100, dim=4)
    np.testing.assert_allclose(cm.hit_rate(uniform, [25, 100]), [0.25, 1.0])
    # two bins of 50 rows; bin 1 draws 3/4 of the ids. Per row: p = 0.015 (hot) and 0.005 (cold); 4 draws see a
    # hot row with 1 - 0.985^4, a cold one with 1 - 0.995^4. A cache of the 50 hottest rows serves their share.
    hist = TableSpec(name="h", num_rows=100, dim=4, id_frequencies=np.array([1.0, 3.0]))
    hot, cold = 50 * (1 - 0.985**4), 50 * (1 - 0.995**4)
    np.testing.assert_allclose(cm.hit_rate(hist, [50, 25, 100]), [hot / (hot + cold), hot / 2 / (hot + cold), 1.0])


def test_rowwise_adagrad_state_is_one_weight_per_row_of_every_shard():
    """Row-wise Adagrad keeps one sum of squares per row (``RowWiseAdagrad.state_spec``): a 10 x 4 table holds
    10 x (4 + 1) floats, and each of its two column-wise halves 10 x (2 + 1); per-weight slots would say 10 x 4."""
    from haloflow.cache.optim import RowWiseAdagrad

    per_row = sum(int(np.prod(shape)) if shape else 1 for shape, _ in RowWiseAdagrad().state_spec(4).values())
    model = EmbeddingCostModel(batch_size=4, row_slots=float(per_row))
    assert per_row == 1
    assert model.shard_memory(10, 4) == 10 * (4 + 1) * 4
    assert model.shard_memory(10, 2) * 2 == 10 * (4 + 2) * 4  # two column shards: a sum per row each
    assert EmbeddingCostModel(batch_size=4).shard_memory(10, 4) == 10 * 4 * 4  # the control: SGD, no state
    spec = TableSpec(name="t", num_rows=10, dim=4, pooling_factor=2.0)
    assert "optimizer state" in model.describe(spec)
    with pytest.raises(ConfigError, match="row_slots must be >= 0"):
        EmbeddingCostModel(row_slots=-1.0)
