import itertools

import numpy as np
import pytest

from haloflow.errors import PlanError
from haloflow.partition.planner.cost_model import EmbeddingCostModel
from haloflow.partition.planner.enumerators import ShardingOptionEnumerator
from haloflow.partition.planner.planner import EmbeddingShardingPlanner, lower_bound, plan_tables
from haloflow.partition.planner.plan_io import load_plan, save_plan
from haloflow.partition.planner.validate import validate_plan
from haloflow.partition.planner.types import (
    CostModel,
    Shard,
    ShardingPlan,
    ShardingType,
    Storage,
    TablePlan,
    TableSpec,
    Topology,
)

DP, TW, RW = ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.ROW_WISE
MiB = 2**20


def synthetic(n: int, seed: int) -> list[TableSpec]:
    rng = np.random.default_rng(seed)
    rows = (10 ** rng.uniform(1, 6.5, n)).astype(int) + 1
    dims = rng.choice([8, 16, 32], n)
    pool = 1 + np.round(rng.pareto(1.5, n), 1)
    return [TableSpec(name=f"t{i}", num_rows=int(r), dim=int(d), pooling_factor=float(p))
            for i, (r, d, p) in enumerate(zip(rows, dims, pool))]


def test_tiny_tables_on_a_slow_network_are_replicated():
    specs = [TableSpec(name="a", num_rows=8, dim=16), TableSpec(name="b", num_rows=5, dim=16)]
    topo = Topology(world_size=2, memory_per_rank=MiB, a2a_bandwidth=1e6, allreduce_bandwidth=1e6)
    plan = plan_tables(specs, topo)
    assert plan.tables == (
        TablePlan("a", 0, DP, (Shard(0, 0, 8, 0, 16), Shard(1, 0, 8, 0, 16))),
        TablePlan("b", 1, DP, (Shard(0, 0, 5, 0, 16), Shard(1, 0, 5, 0, 16))),
    )


def test_a_table_too_big_for_any_rank_is_cut_into_row_blocks():
    # 1,000,000 x 8 fp32 = 30.5 MiB; 10 MiB per rank: only 4 row blocks of 7.6 MiB fit (2 column blocks of
    # 4 columns would need 15.3 MiB each)
    specs = [TableSpec(name="big", num_rows=1_000_000, dim=8, pooling_factor=20.0)]
    plan = plan_tables(specs, Topology(world_size=4, memory_per_rank=10 * MiB))
    assert plan.tables == (TablePlan("big", 0, RW, tuple(Shard(s, 250_000 * s, 250_000, 0, 8) for s in range(4))),)
    assert [c.memory.device for c in plan.per_rank] == [250_000 * 8 * 4] * 4


def test_equal_tables_go_one_per_rank():
    # replicas would need 4 x 61 MiB on every rank; the budget allows 1.5 tables
    specs = [TableSpec(name=f"e{i}", num_rows=1_000_000, dim=16) for i in range(4)]
    topo = Topology(world_size=4, memory_per_rank=92 * MiB)
    plan = plan_tables(specs, topo)
    assert plan.tables == tuple(TablePlan(f"e{i}", i, TW, (Shard(i, 0, 1_000_000, 0, 16),)) for i in range(4))
    assert len({round(c.cost, 15) for c in plan.per_rank}) == 1  # perfectly balanced


def test_infeasible_budget_says_how_much_is_missing_where():
    specs = [TableSpec(name="t7", num_rows=10_131_227, dim=16), TableSpec(name="t8", num_rows=1000, dim=16)]
    planner = EmbeddingShardingPlanner(Topology(world_size=2, memory_per_rank=0.5 * 2**30),
                                       cost_model=EmbeddingCostModel(optimizer_slots=1.0))
    with pytest.raises(PlanError, match=r"^table t7 \(10,131,227 x 16 fp32 \+ optimizer state = 1\.21 GiB\) does not "
                                        r"fit.*: largest free budget 0\.50 GiB on rank 0; total needed 1\.21 GiB > "
                                        r"total budget 1\.00 GiB$"):
        planner.plan(specs)


def test_plan_round_trips_through_json_and_validates(tmp_path):
    specs = synthetic(30, seed=1)
    plan = plan_tables(specs, Topology(world_size=3, memory_per_rank=2**30))
    validate_plan(plan, specs)
    assert load_plan(save_plan(plan, tmp_path / "plan.json")) == plan


@pytest.mark.parametrize("k", [2, 4])
def test_slowest_rank_within_ten_percent_of_the_lower_bound(k):
    specs = synthetic(120, seed=k)
    topo = Topology(world_size=k, memory_per_rank=2**30)
    plan = plan_tables(specs, topo)
    bound = lower_bound(ShardingOptionEnumerator().enumerate(tuple(specs), topo))
    assert bound <= plan.max_cost <= 1.10 * bound


def test_matches_brute_force_on_three_tables():
    # Every option of every table on every placement (distinct ranks per table), within memory.
    specs = [TableSpec(name="x", num_rows=400_000, dim=16, pooling_factor=4.0),
             TableSpec(name="y", num_rows=90_000, dim=16, pooling_factor=1.0),
             TableSpec(name="z", num_rows=3_000, dim=8, pooling_factor=9.0)]
    topo = Topology(world_size=3, memory_per_rank=20 * MiB)
    options = ShardingOptionEnumerator().enumerate(tuple(specs), topo)
    budget = np.array(topo.memory_per_rank)
    best = np.inf
    for combo in itertools.product(*options.options):
        placements = [[tuple(range(3))] if o.fixed_ranks else list(itertools.permutations(range(3), o.num_shards))
                      for o in combo]
        for ranks in itertools.product(*placements):
            load, mem = np.full(3, sum(o.base_cost for o in combo)), np.zeros(3)
            for o, r in zip(combo, ranks):
                np.add.at(load, list(r), o.shard_cost)
                np.add.at(mem, list(r), o.shard_memory)
            if np.all(mem <= budget):
                best = min(best, load.max())
    plan = plan_tables(specs, topo)
    assert lower_bound(options) <= best * (1 + 1e-12)
    assert best * (1 - 1e-12) <= plan.max_cost <= 1.10 * best


def test_reservation_takes_its_share_of_every_budget():
    from haloflow.partition.planner.storage_reservations import FixedFractionReservation

    specs = [TableSpec(name="big", num_rows=1_000_000, dim=8)]  # 30.5 MiB
    topo = Topology(world_size=1, memory_per_rank=40 * MiB)
    assert plan_tables(specs, topo).per_rank[0].memory.device == 8_000_000 * 4
    with pytest.raises(PlanError, match=r"^table big \(1,000,000 x 8 fp32 = 0\.03 GiB\) does not fit: largest free "
                                        r"budget 0\.02 GiB on rank 0; total needed 0\.03 GiB > total budget 0\.02 GiB$"):
        plan_tables(specs, topo, reservation=FixedFractionReservation(fraction=0.5))


def _cached_planner(topo, **cm):
    kinds = (DP, TW, RW, ShardingType.COLUMN_WISE, ShardingType.CACHED)
    return EmbeddingShardingPlanner(topo, enumerator=ShardingOptionEnumerator(
        cost_model=EmbeddingCostModel(**cm), sharding_types=kinds))


def test_a_table_larger_than_the_budget_gets_the_largest_cache_on_its_curve_that_fits():
    # 1,000 x 4 fp32 = 16,000 B on one rank with 8,000 B: table-wise does not fit. The curve's sizes need
    # 1,600 / 6,400 / 7,984 / 9,600 B; the largest that fits (499 rows) is the cheapest (fewest misses).
    spec = TableSpec(name="t", num_rows=1000, dim=4, cache_curve=[(100, 0.5), (400, 0.8), (499, 0.85), (600, 0.9)])
    topo = Topology(world_size=1, memory_per_rank=8000)
    with pytest.raises(PlanError, match="does not fit"):
        plan_tables([spec], topo)  # not without the cached kind
    plan = _cached_planner(topo).plan([spec])
    assert plan.tables[0] == TablePlan("t", 0, ShardingType.CACHED, (Shard(0, 0, 1000, 0, 4),), cache_rows=499)
    assert plan.per_rank[0].memory == Storage(device=499 * 16, host=1000 * 16 + 16 * (1000 + 499))
    # a table that fits stays whole on the device: caching only adds misses
    small = TableSpec(name="t", num_rows=400, dim=4, cache_curve=[(100, 0.5)])
    assert _cached_planner(topo).plan([small]).tables[0].sharding is TW


def test_the_kaggle_tables_fit_one_gib_on_one_rank_only_cached():
    from haloflow.partition.planner.specs import kaggle_tables

    specs = kaggle_tables()  # 2.16 GB at D = 16
    topo = Topology(world_size=1, memory_per_rank=2**30)
    with pytest.raises(PlanError, match="does not fit"):
        plan_tables(specs, topo)
    plan = _cached_planner(topo).plan(specs)
    validate_plan(plan, specs)
    cached = [tp for tp in plan.tables if tp.sharding is ShardingType.CACHED]
    assert plan.per_rank[0].memory.device <= 2**30
    assert {"C3", "C12"} <= {tp.table for tp in cached}  # the two largest tables
    assert plan.per_rank[0].memory.device + plan.per_rank[0].memory.host >= 4 * sum(s.num_rows for s in specs) * 16
    assert plan.per_rank[0].traffic.host > 0


def _forwarding(inner: CostModel) -> tuple[CostModel, list[str]]:
    """A cost model with the interface's methods only, each forwarded to ``inner``; and the names it was asked."""
    calls = []

    def forward(name):
        def method(self, *args, **kwargs):
            calls.append(name)
            return getattr(inner, name)(*args, **kwargs)
        return method

    cls = type("Forwarding", (CostModel,), {name: forward(name) for name in CostModel.__abstractmethods__})
    return cls(), calls


def test_the_planner_asks_its_cost_model_only_through_the_interface():
    specs = synthetic(20, seed=5) + [TableSpec(name="hot", num_rows=5000, dim=8, id_frequencies=np.arange(1.0, 51))]
    topo = Topology(world_size=2, memory_per_rank=2**30)
    inner = EmbeddingCostModel(optimizer_slots=1.0)
    model, calls = _forwarding(inner)
    kinds = tuple(ShardingType)

    def plan(cm, topology=topo):
        return EmbeddingShardingPlanner(topology, enumerator=ShardingOptionEnumerator(
            cost_model=cm, sharding_types=kinds)).plan(specs)

    assert plan(model) == plan(inner)
    messages = []
    for cm in (inner, model):  # the table that does not fit is described by the cost model
        with pytest.raises(PlanError, match="does not fit") as err:
            plan(cm, Topology(world_size=2, memory_per_rank=64))
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert set(calls) == set(CostModel.__abstractmethods__)  # every method the stages need, none beyond
