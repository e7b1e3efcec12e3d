import numpy as np
import pytest

from haloflow.errors import ConfigError, PlanError
from haloflow.partition.planner.plan_io import load_plan, plan_from_json, plan_to_json, save_plan
from haloflow.partition.planner.validate import validate_plan
from haloflow.partition.planner.types import (
    RankCost,
    Shard,
    ShardingPlan,
    ShardingType,
    Storage,
    TablePlan,
    TableSpec,
    Topology,
    Traffic,
)

SPECS = [TableSpec(name="a", num_rows=10, dim=4), TableSpec(name="b", num_rows=100, dim=8)]


def _plan(b_shards, b_kind=ShardingType.ROW_WISE):
    a = TablePlan("a", 0, ShardingType.DATA_PARALLEL, (Shard(0, 0, 10, 0, 4), Shard(1, 0, 10, 0, 4)))
    return ShardingPlan(2, (a, TablePlan("b", 1, b_kind, b_shards)))


def test_json_round_trip_and_save_load(tmp_path):
    plan = _plan((Shard(1, 0, 60, 0, 8), Shard(0, 60, 40, 0, 8)))
    plan = ShardingPlan(2, plan.tables, (RankCost(0, 1.5e-4, Storage(3200.0), Traffic(1.0, 2.0, 3.0, 4.0)),
                                         RankCost(1, 2.5e-4, Storage(1600.0))))
    again = plan_from_json(plan_to_json(plan))
    assert again == plan
    path = save_plan(plan, tmp_path / "plan.json")
    assert load_plan(path) == plan
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary left behind
    with pytest.raises(FileNotFoundError, match="plan file .*nope.json not found"):
        load_plan(tmp_path / "nope.json")
    assert [(tp.table, s.row_offset) for tp, s in plan.shards_on(0)] == [("a", 0), ("b", 60)]


@pytest.mark.parametrize("shards, kind, match", [
    ((Shard(1, 0, 60, 0, 8), Shard(0, 50, 50, 0, 8)), ShardingType.ROW_WISE, "starts at row 50, expected 60"),
    ((Shard(1, 0, 60, 0, 8), Shard(0, 60, 30, 0, 8)), ShardingType.ROW_WISE, r"cover rows 0\.\.89, expected 0\.\.99"),
    ((Shard(1, 0, 60, 0, 8), Shard(1, 60, 40, 0, 8)), ShardingType.ROW_WISE, "distinct ranks"),
    ((Shard(0, 0, 100, 0, 4), Shard(1, 0, 100, 0, 4)), ShardingType.ROW_WISE, "must hold all 8 columns"),
    ((Shard(0, 0, 100, 0, 4), Shard(1, 0, 100, 4, 4)), ShardingType.COLUMN_WISE, None),
    ((Shard(0, 0, 100, 0, 4), Shard(1, 0, 90, 4, 4)), ShardingType.COLUMN_WISE, "must hold all 100 rows"),
    ((Shard(2, 0, 100, 0, 8),), ShardingType.TABLE_WISE, r"ranks \[2\] outside 0\.\.1"),
    ((Shard(0, 0, 50, 0, 8),), ShardingType.TABLE_WISE, "exactly one full 100 x 8 shard"),
    ((Shard(0, 0, 100, 0, 8),), ShardingType.DATA_PARALLEL, "on every rank 0..1"),
])
def test_validate_names_the_broken_rule(shards, kind, match):
    plan = _plan(shards, kind)
    if match is None:
        validate_plan(plan, SPECS)
    else:
        with pytest.raises(PlanError, match=f"table b \\({kind.value}\\): .*{match}"):
            validate_plan(plan, SPECS)


def test_validate_checks_table_order():
    plan = _plan((Shard(0, 0, 100, 0, 8),), ShardingType.TABLE_WISE)
    with pytest.raises(PlanError, match=r"entry 1 is table 'b' \(index 1\); expected 'c'"):
        validate_plan(plan, [SPECS[0], TableSpec(name="c", num_rows=100, dim=8)])
    with pytest.raises(PlanError, match="2 tables but the model has 1"):
        validate_plan(plan, SPECS[:1])


@pytest.mark.parametrize("text, match", [
    ("{", r"<plan>:1: not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"format": "x", "version": 1}', "'format' is 'x'"),
    ('{"format": "haloflow.sharding_plan", "version": 1, "world_size": 2, "tables": [{"table": "a"}], '
     '"per_rank": []}', r"tables\[0\]: missing field 'shards'"),
    ('{"format": "haloflow.sharding_plan", "version": 1, "world_size": "2", "tables": [], "per_rank": []}',
     "field 'world_size' is '2', expected int"),
])
def test_from_json_errors_name_the_field(text, match):
    with pytest.raises(PlanError, match=match):
        plan_from_json(text)


def test_table_spec_rejects_bad_fields():
    with pytest.raises(ConfigError, match="num_rows must be an integer >= 1, got 0"):
        TableSpec(name="t", num_rows=0, dim=4)
    with pytest.raises(ConfigError, match="pooling_factor"):
        TableSpec(name="t", num_rows=4, dim=4, pooling_factor=0.0)
    with pytest.raises(ConfigError, match="1..num_rows=4 bins"):
        TableSpec(name="t", num_rows=4, dim=4, id_frequencies=np.ones(5))


def test_lookup_share_uniform_and_from_histogram():
    uniform = TableSpec(name="u", num_rows=100, dim=4)
    np.testing.assert_allclose(uniform.lookup_share(np.array([0, 25, 100])), [0.25, 0.75])
    # 4 bins of 25 rows with counts 1, 1, 2, 4: rows 0..49 get 2/8; a cut at row 60 splits bin 2 at 10/25
    hist = TableSpec(name="h", num_rows=100, dim=4, id_frequencies=np.array([1.0, 1.0, 2.0, 4.0]))
    np.testing.assert_allclose(hist.lookup_share(np.array([0, 50, 60, 100])), [2 / 8, 2 * 0.4 / 8, 1 - 2.8 / 8])


def test_storage_and_traffic_arithmetic():
    assert Storage(3, 1) + Storage(2, 2) == Storage(5, 3)
    assert (Storage(3, 1) - Storage(1, 1)) * 2 == Storage(4, 0)
    assert Storage(4, 0).fits_in(Storage(4, 0)) and not Storage(4, 1).fits_in(Storage(5, 0))
    assert Traffic(1, 2, 3, 4) + Traffic(1, 1, 1, 1) * 2 == Traffic(3, 4, 5, 6)
    topo = Topology(world_size=2, memory_per_rank=8, lookup_bandwidth=10.0, a2a_bandwidth=2.0,
                    allreduce_bandwidth=4.0)
    assert topo.seconds(Traffic(lookup=10, a2a_in=1, a2a_out=3, allreduce=8)) == pytest.approx(1 + 2 + 2)
    assert topo.memory_per_rank == (8.0, 8.0)
    with pytest.raises(ConfigError, match="memory_per_rank has 3 entries but world_size is 2"):
        Topology(world_size=2, memory_per_rank=(1, 2, 3))
    with pytest.raises(ConfigError, match="world_size must be an integer >= 1, got 0"):
        Topology(world_size=0, memory_per_rank=1)


def test_a_cached_table_records_its_cache_rows_and_round_trips():
    plan = _plan((Shard(1, 0, 100, 0, 8),), ShardingType.TABLE_WISE)
    with pytest.raises(ConfigError, match="a cached table needs cache_rows, an integer >= 1"):
        TablePlan("b", 1, ShardingType.CACHED, (Shard(1, 0, 100, 0, 8),))
    with pytest.raises(ConfigError, match="cache_rows 5 is only for sharding 'cached', not 'table_wise'"):
        TablePlan("b", 1, ShardingType.TABLE_WISE, (Shard(1, 0, 100, 0, 8),), cache_rows=5)
    cached = TablePlan("b", 1, ShardingType.CACHED, (Shard(1, 0, 100, 0, 8),), cache_rows=7)
    plan = ShardingPlan(2, (plan.tables[0], cached))
    validate_plan(plan, SPECS)
    text = plan_to_json(plan)
    assert '"cache_rows": 7' in text and text.count("cache_rows") == 1  # only the cached table carries it
    assert plan_from_json(text) == plan
    too_many = ShardingPlan(2, (plan.tables[0], TablePlan("b", 1, ShardingType.CACHED, cached.shards, cache_rows=101)))
    with pytest.raises(PlanError, match=r"table b \(cached\): cache_rows 101 outside 1\.\.100"):
        validate_plan(too_many, SPECS)
    with pytest.raises(PlanError, match="exactly one full 100 x 8 shard"):
        validate_plan(ShardingPlan(2, (plan.tables[0], TablePlan("b", 1, ShardingType.CACHED, (
            Shard(0, 0, 50, 0, 8), Shard(1, 50, 50, 0, 8)), cache_rows=5))), SPECS)
    with pytest.raises(PlanError, match=r"tables\[1\]: field 'cache_rows' is '7', expected int"):
        plan_from_json(text.replace('"cache_rows": 7', '"cache_rows": "7"'))
    with pytest.raises(PlanError, match=r"tables\[1\]: field 'sharding' is 'cachd', expected one of"):
        plan_from_json(text.replace('"cached"', '"cachd"'))


def test_table_spec_checks_its_cache_curve():
    spec = TableSpec(name="t", num_rows=100, dim=4, cache_curve=[(1, 0.1), (50, 0.9)])
    assert spec.cache_curve == ((1, 0.1), (50, 0.9))
    with pytest.raises(ConfigError, match=r"slots must ascend, without repeats, within 1\.\.100; got \[50, 1\]"):
        TableSpec(name="t", num_rows=100, dim=4, cache_curve=[(50, 0.9), (1, 0.1)])
    with pytest.raises(ConfigError, match=r"hit rates must be in \[0, 1\]"):
        TableSpec(name="t", num_rows=100, dim=4, cache_curve=[(1, 1.5)])
    assert Traffic(host=2.0) * 3 == Traffic(host=6.0)
    topo = Topology(world_size=1, memory_per_rank=8, host_bandwidth=4.0)
    assert topo.seconds(Traffic(host=8)) == pytest.approx(2.0)
