import numpy as np
import pytest

from haloflow.errors import ConfigError
from haloflow.partition.planner.cost_model import EmbeddingCostModel
from haloflow.partition.planner.enumerators import ShardingOptionEnumerator
from haloflow.partition.planner.types import Shard, ShardingPlan, ShardingType, TablePlan, TableSpec, Topology

SPECS = (
    TableSpec(name="wide", num_rows=1000, dim=32, pooling_factor=3.0),
    TableSpec(name="hot", num_rows=500, dim=8, pooling_factor=2.0,
              id_frequencies=np.array([50.0, 10.0, 5.0, 1.0, 1.0])),
    TableSpec(name="tiny", num_rows=3, dim=4),
)


def test_options_per_table():
    options = ShardingOptionEnumerator().enumerate(SPECS, Topology(world_size=4, memory_per_rank=1e9))
    kinds = [sorted((o.sharding.value, o.num_shards) for o in opts) for opts in options.options]
    # wide: rows and columns cut in 2 and 4; hot: 8 columns give 2 column blocks of >= 4, row blocks come both
    # even and frequency-balanced; tiny: 3 rows allow 2 row blocks (not 4), 4 columns no column blocks
    assert kinds[0] == [("column_wise", 2), ("column_wise", 4), ("data_parallel", 4), ("row_wise", 2),
                        ("row_wise", 4), ("table_wise", 1)]
    assert kinds[1] == [("column_wise", 2), ("data_parallel", 4), ("row_wise", 2), ("row_wise", 2),
                        ("row_wise", 4), ("row_wise", 4), ("table_wise", 1)]
    assert kinds[2] == [("data_parallel", 4), ("row_wise", 2), ("table_wise", 1)]
    for opts in options.options:
        assert [o.total_cost for o in opts] == sorted(o.total_cost for o in opts)
        for o in opts:  # shards tile the table
            if o.sharding is ShardingType.ROW_WISE:
                assert o.row_offsets[0] == 0 and np.all(o.row_offsets[1:] == np.cumsum(o.rows)[:-1])
                assert o.rows.sum() == SPECS[o.table_index].num_rows and np.all(o.rows >= 1)


def test_frequency_balanced_row_blocks_share_lookups_evenly():
    options = ShardingOptionEnumerator().enumerate(SPECS, Topology(world_size=2, memory_per_rank=1e9))
    rw = [o for o in options.options[1] if o.sharding is ShardingType.ROW_WISE]
    shares = [SPECS[1].lookup_share(np.append(o.row_offsets, 500)) for o in rw]
    even = [s for o, s in zip(rw, shares) if o.rows[0] == 250]
    balanced = [s for o, s in zip(rw, shares) if o.rows[0] != 250]
    assert len(even) == len(balanced) == 1
    np.testing.assert_allclose(balanced[0], [0.5, 0.5], atol=1 / 500)  # to the row
    assert even[0][0] > 0.8  # the hot first rows


@pytest.mark.parametrize("k", [1, 3])
def test_option_costs_add_up_to_the_cost_models_per_rank_costs(k):
    # base cost on every rank + shard cost on its holder == rank_costs recomputed from the plan
    topo = Topology(world_size=k, memory_per_rank=1e9)
    cm = EmbeddingCostModel(batch_size=96)
    options = ShardingOptionEnumerator(cost_model=cm).enumerate(SPECS, topo)
    rng = np.random.default_rng(k)
    for trial in range(6):
        load = np.zeros(k)
        tables = []
        for t, opts in enumerate(options.options):
            o = opts[rng.integers(len(opts))]
            ranks = np.arange(k) if o.fixed_ranks else rng.permutation(k)[: o.num_shards]
            load += o.base_cost
            np.add.at(load, ranks, o.shard_cost)
            tables.append(TablePlan(SPECS[t].name, t, o.sharding, tuple(
                Shard(int(r), int(a), int(b), int(c), int(d))
                for r, a, b, c, d in zip(ranks, o.row_offsets, o.rows, o.col_offsets, o.cols))))
        costs = cm.rank_costs(ShardingPlan(k, tuple(tables)), SPECS, topo)
        np.testing.assert_allclose([c.cost for c in costs], load, rtol=1e-12)


def test_errors():
    with pytest.raises(ConfigError, match=r"duplicates \['a'\]"):
        ShardingOptionEnumerator().enumerate((TableSpec(name="a", num_rows=2, dim=4),) * 2,
                                             Topology(world_size=2, memory_per_rank=1e9))
    with pytest.raises(ValueError, match="'sharded_somehow' is not a valid ShardingType"):
        ShardingOptionEnumerator(sharding_types=("sharded_somehow",))
