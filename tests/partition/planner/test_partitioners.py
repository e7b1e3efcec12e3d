import numpy as np
import pytest

from haloflow.errors import PlanError
from haloflow.partition.planner.cost_model import EmbeddingCostModel
from haloflow.partition.planner.partitioners import GreedyCostPartitioner
from haloflow.partition.planner.types import OptionSet, ShardingOption, ShardingType, TableSpec, Topology


def _options(items, k, memory, base=0.0):
    """One option per table: ``items[t]`` = (sharding, shard costs, shard bytes)."""
    specs, opts = [], []
    for t, (kind, cost, size) in enumerate(items):
        s = len(cost)
        specs.append(TableSpec(name=f"t{t}", num_rows=1000, dim=4 * s))
        z = np.zeros(s, np.int64)
        opts.append((ShardingOption(table_index=t, sharding=kind, world_size=k, row_offsets=z,
                                    rows=np.full(s, 1000), col_offsets=4 * np.arange(s), cols=np.full(s, 4),
                                    base_cost=base, shard_cost=np.array(cost, float),
                                    shard_memory=np.array(size, float)),))
    return OptionSet(tables=tuple(specs), options=tuple(opts),
                     topology=Topology(world_size=k, memory_per_rank=memory), cost_model=EmbeddingCostModel())


TW, CW, DP = ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.DATA_PARALLEL


def test_greedy_then_swap_reaches_the_optimum():
    # LPT puts 5,4 then 3,3,3 -> loads 8 | 10; swapping the 4 with a 3 gives the optimum 9 | 9
    options = _options([(TW, [c], [1]) for c in (5, 4, 3, 3, 3)], k=2, memory=100)
    choice = np.zeros(5, np.int64)
    greedy = GreedyCostPartitioner(improve=False).partition(options, choice)
    assert sorted(greedy.load) == [8, 10]
    best = GreedyCostPartitioner().partition(options, choice)
    assert sorted(best.load) == [9, 9]
    assert sorted(int(r[0]) for r in best.ranks) == [0, 0, 1, 1, 1]


def test_memory_and_distinct_ranks_are_respected():
    # rank budgets 10 | 3 | 10: the 6-byte table cannot go to rank 1 even though rank 1 is idle;
    # the 3-shard table needs one shard on each rank; replicas cost every rank 1 byte and 0.5 s
    items = [(TW, [1.0], [6]), (CW, [2.0, 2.0, 2.0], [2, 2, 2]), (DP, [0.5, 0.5, 0.5], [1, 1, 1])]
    options = _options(items, k=3, memory=(10, 3, 10), base=0.25)
    p = GreedyCostPartitioner().partition(options, np.zeros(3, np.int64))
    assert int(p.ranks[0][0]) != 1
    assert sorted(p.ranks[1].tolist()) == [0, 1, 2]
    assert p.ranks[2].tolist() == [0, 1, 2]
    assert np.all(p.memory <= np.array([10, 3, 10]))
    np.testing.assert_allclose(sorted(p.load), [0.75 + 0.5 + 2, 0.75 + 0.5 + 2, 0.75 + 0.5 + 3])


def test_a_shard_that_fits_nowhere_is_reported_with_the_numbers():
    items = [(TW, [1.0], [600 * 2**20]), (TW, [1.0], [300 * 2**20])]
    options = _options(items, k=2, memory=512 * 2**20)
    with pytest.raises(PlanError, match=r"table t0 \(1,000 x 4 fp32 = 15\.62 KiB\) does not fit: largest free "
                                        r"budget 0\.50 GiB on rank 0; total needed 0\.88 GiB <= total budget 1\.00 GiB"):
        GreedyCostPartitioner().partition(options, np.zeros(2, np.int64))
