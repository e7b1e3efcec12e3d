"""Sharded DLRM tables in row stores (the optimizer fused, hot rows cached): the single process bit for bit on one
rank, the single process to float tolerance on 2 and 4 real gloo ranks."""

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from haloflow.cache import CacheConfig, CachedStore, MemoryStore, make_optimizer
from haloflow.engine.dlrm.shard_stores import ShardStores
from haloflow.engine.dlrm.sharded_embedding import ShardedEmbeddingCollection
from haloflow.engine.dlrm.sharding import build_sharded_dlrm
from haloflow.engine.dlrm.store_tables import StoreTables
from haloflow.errors import ConfigError, PlanError
from haloflow.models.dlrm import DLRM, dlrm_loss
from haloflow.partition.planner.types import Shard, ShardingPlan, ShardingType, TablePlan
from tests.conftest import one_torch_thread, run_torchrun

SCRIPTS = Path(__file__).parents[1] / "scripts"
_spec = importlib.util.spec_from_file_location("dlrm_store_parity", SCRIPTS / "dlrm_store_parity.py")
parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity)  # also puts SCRIPTS on sys.path for its dlrm_common import
common = parity.sys.modules["dlrm_common"]


one_thread = pytest.fixture(autouse=True)(one_torch_thread)


def _stores(name: str, cache: CacheConfig | None = None) -> ShardStores:
    return ShardStores(optimizer=make_optimizer({"name": name, "lr": parity.LR}), cache=cache)


def _train(model, steps=8, sharded=False, name="sgd"):
    opt = parity.mlp_optimizer(name, model.parameters())
    for dense, sparse, labels in common.global_batches(steps, 11, seed=5):
        opt.zero_grad()
        dlrm_loss(model(dense, sparse), labels).backward()
        if sharded:
            model.finish_grad_sync()
        model.embeddings.step()
        opt.step()
    return model


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("cache", [None, CacheConfig(ratio=0.3), CacheConfig(num_slots=1)])
def test_one_rank_of_every_kind_trains_bit_for_bit_what_store_tables_train(name, cache):
    # Every sharding kind on one rank (data-parallel, table-, row-, column-wise, cached), stores cached or not:
    # the same rows, the same gradients summed in the same order, so the same floats as the single process.
    config = common.small_model().config
    ref = _train(DLRM(config, embeddings=StoreTables.build(config, _stores(name).optimizer)), name=name)
    plan = parity.store_plan(1, name)
    got = _train(build_sharded_dlrm(config, plan, None, stores=_stores(name, cache)), sharded=True, name=name)
    rows = ref.embeddings.state_dict_rows()
    for key in rows[0]:
        for t, table in enumerate(got.embeddings.full_tables(key)):
            assert torch.equal(table, rows[t][key]), f"{key} of table {t}"
    for a, b in zip(got.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(rows[2]["weight"], common.small_model().embeddings.tables[2].weight)  # it trained


def test_caches_over_memory_mapped_backing_folders_train_the_same(tmp_path):
    config = common.small_model().config
    plan = parity.store_plan(1, "adagrad")
    runs = []
    for backing_dir in (None, tmp_path / "tables"):
        stores = ShardStores(optimizer=make_optimizer({"name": "adagrad", "lr": parity.LR}),
                             cache=CacheConfig(num_slots=2), backing_dir=backing_dir)
        runs.append(_train(build_sharded_dlrm(config, plan, None, stores=stores), sharded=True, name="adagrad"))
    in_memory, mapped = runs
    assert mapped.embeddings.shard_bags[0].store.backing.path == tmp_path / "tables" / "t0"
    for key in ("weight", "sum"):
        for a, b in zip(in_memory.embeddings.full_tables(key), mapped.embeddings.full_tables(key)):
            assert torch.equal(a, b)


def test_which_store_each_shard_gets():
    # t0 cached by the plan (2 of its 11 rows), t1 whole in memory, t2 a data-parallel replica
    plan = ShardingPlan(1, (TablePlan("t0", 0, ShardingType.CACHED, (Shard(0, 0, 11, 0, 4),), cache_rows=2),
                            TablePlan("t1", 1, ShardingType.TABLE_WISE, (Shard(0, 0, 7, 0, 4),)),
                            TablePlan("t2", 2, ShardingType.DATA_PARALLEL, (Shard(0, 0, 13, 0, 4),))))
    coll = ShardedEmbeddingCollection.from_plan(plan, (11, 7, 13), 4, seed=0, group=None, stores=_stores("adagrad"))
    t0, t1 = (bag.store for bag in coll.shard_bags)
    assert isinstance(t0, CachedStore) and t0.num_slots == 2 and isinstance(t1, MemoryStore)
    assert isinstance(coll.replica_bags[0].store, MemoryStore)
    assert list(coll.parameters()) == []  # no torch optimizer sees the tables
    # Adagrad keeps one float of state per weight: device = 2 cached rows x 2 + (7 + 13) rows x 2; host = t0 x 2
    # and the cache's int64 maps (row -> slot, LRU's last use, slot -> row, free list)
    row = 4 * 4
    assert coll.storage().device == row * 2 * (2 + 7 + 13)
    assert coll.storage().host == row * 2 * 11 + 8 * (11 + 11 + 2 + 2)
    with_ratio = ShardedEmbeddingCollection.from_plan(plan, (11, 7, 13), 4, seed=0, group=None,
                                                      stores=_stores("sgd", CacheConfig(ratio=0.5)))
    assert [bag.store.num_slots for bag in with_ratio.shard_bags] == [2, 4]  # the plan's 2; ceil(0.5 x 7)
    assert with_ratio.replica_bags[0].store.num_slots == 7  # ceil(0.5 x 13)


def test_mistakes_name_the_table():
    plan = common.mixed_plan(1)  # table 3 is column-wise
    with pytest.raises(ConfigError, match="table t3 is column-wise, which row-wise Adagrad cannot train exactly"):
        ShardedEmbeddingCollection.from_plan(plan, common.ROWS, common.DIM, seed=0, group=None,
                                             stores=_stores("rowwise_adagrad"))
    cached = ShardingPlan(1, tuple(replace(tp, sharding=ShardingType.CACHED, cache_rows=3) if tp.table_index == 0
                                   else tp for tp in plan.tables))
    with pytest.raises(ConfigError, match="the plan caches table t0: its shard needs a row store"):
        ShardedEmbeddingCollection.from_plan(cached, common.ROWS, common.DIM, seed=0, group=None)
    too_many = ShardingPlan(1, tuple(replace(tp, cache_rows=12) if tp.table_index == 0 else tp
                                     for tp in cached.tables))
    with pytest.raises(PlanError, match=r"table t0 \(cached\): cache_rows 12 outside 1\.\.11"):
        ShardedEmbeddingCollection.from_plan(too_many, common.ROWS, common.DIM, seed=0, group=None,
                                             stores=_stores("sgd"))
    with pytest.raises(ConfigError, match=r"'t0\[rows 0:5\]': 6 cache slots for a shard of 5 rows; expected 1\.\.5"):
        _stores("sgd").make("t0[rows 0:5]", torch.zeros(5, 4), cache_rows=6)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [4])  # 2 ranks: test_train's cached Adagrad run through the CLI
def test_cached_shards_on_real_ranks_train_what_one_process_trains(tmp_path, nproc):
    # SGD, Adagrad, row-wise Adagrad on a mixed plan with a cached table; cached == uncached stores bit for bit,
    # both == one process to float tolerance (tables, optimizer state, MLPs, losses), bytes == prediction.
    proc = run_torchrun(SCRIPTS / "dlrm_store_parity.py", nproc, [tmp_path, "--steps", "10", "--batch", "13"],
                        timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "STORE PARITY OK" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == nproc
    for name in ("sgd", "adagrad", "rowwise_adagrad"):
        assert 0 < summary[name]["cache_hit_rate"] < 1
        assert summary[name]["max_abs_weight_diff"] < 1e-5
