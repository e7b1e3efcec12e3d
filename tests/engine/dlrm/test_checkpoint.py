"""engine/dlrm/checkpoint: DLRM tables and MLP state through a real ``Checkpointer`` save and ``open_checkpoint``:
every kind of table module saved and read back (into the same kind and into another), the row optimizers'
state and flushed caches, the MLP optimizers' state resumed exactly, and each mismatch a clear error."""

from pathlib import Path

import pytest
import torch
from torch import nn

from haloflow.cache import CacheConfig, make_optimizer
from haloflow.engine.checkpoint import CheckpointConfig, Checkpointer, LoadedCheckpoint, open_checkpoint
from haloflow.engine.dlrm.checkpoint import dense_state, load_dense_state, load_tables, table_pieces
from haloflow.engine.dlrm.shard_stores import ShardStores
from haloflow.engine.dlrm.sharding import build_sharded_dlrm
from haloflow.engine.dlrm.store_tables import StoreTables
from haloflow.engine.runtime import ParallelLayout
from haloflow.errors import CheckpointError
from haloflow.models.dlrm import DLRM, DLRMConfig, dlrm_loss
from tests.conftest import one_torch_thread, run_torchrun
from tests.engine.scripts import dlrm_common as common

ONE = ParallelLayout(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
CONFIG = common.small_model().config  # 6 tables of (11, 7, 13, 6, 9, 10) rows, D = 4
OTHER = DLRMConfig(**{**CONFIG.__dict__, "seed": 1})  # same shapes, other initial weights

one_thread = pytest.fixture(autouse=True)(one_torch_thread)  # tiny tables: threads only wait on each other


def _round_trip(root: Path, pieces=(), state: dict | None = None) -> LoadedCheckpoint:
    """Save through a real Checkpointer (one process) and read the folder back."""
    path = Checkpointer(CheckpointConfig(dir=root), ONE, "dlrm", {}).save(1, state or {}, pieces)
    return open_checkpoint(path)


def _plain_tables(model: DLRM) -> list[torch.Tensor]:
    return [bag.weight.detach().clone() for bag in model.embeddings.tables]


def _store_arrays(tables: StoreTables, name: str) -> list[torch.Tensor]:
    return [bag.store.state_dict()[name].clone() for bag in tables.bags]


def _train(model, steps: int, *, opts=(), stores: bool = False, seed: int = 0) -> None:
    for dense, sparse, labels in common.global_batches(steps, 8, seed=seed):
        for o in opts:
            o.zero_grad()
        dlrm_loss(model(dense, sparse), labels).backward()
        if hasattr(model, "finish_grad_sync"):
            model.finish_grad_sync()
        if stores:
            model.embeddings.step()
        for o in opts:
            o.step()


def _assert_all_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for t, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"table {t}"


# ------------------------------------------------------------------------------------------------ tables
def test_plain_tables_save_every_table_whole_and_load_back(tmp_path):
    model = DLRM(CONFIG)
    _train(model, 2, opts=[torch.optim.SGD(model.parameters(), lr=0.5)])
    pieces = table_pieces(model.embeddings, rank=0)
    assert [(p.table, p.rows, p.cols, sorted(p.arrays)) for p in pieces] == [
        (t, (0, n), (0, 4), ["weight"]) for t, n in enumerate(common.ROWS)]
    other = DLRM(OTHER)
    assert not torch.equal(_plain_tables(other)[0], _plain_tables(model)[0])
    load_tables(other.embeddings, _round_trip(tmp_path, pieces))
    _assert_all_equal(_plain_tables(other), _plain_tables(model))


def test_sharded_tables_of_one_rank_load_into_whole_tables_and_back(tmp_path):
    sharded = build_sharded_dlrm(CONFIG, common.mixed_plan(1), None)  # every sharding type, one rank
    _train(sharded, 2, opts=[torch.optim.SGD(sharded.parameters(), lr=0.5)])
    want = sharded.embeddings.full_tables()
    pieces = table_pieces(sharded.embeddings, rank=0)
    # the slots in table order, then the data-parallel replica (table 1), which rank 0 saves
    assert [(p.table, p.rows, p.cols) for p in pieces] == [
        (0, (0, 11), (0, 4)), (2, (0, 13), (0, 4)), (3, (0, 6), (0, 4)), (4, (0, 9), (0, 4)), (5, (0, 10), (0, 4)),
        (1, (0, 7), (0, 4))]
    assert table_pieces(sharded.embeddings, rank=1)[-1].table == 5  # any other rank: no replica
    loaded = _round_trip(tmp_path / "sharded", pieces)
    plain = DLRM(OTHER)
    load_tables(plain.embeddings, loaded)
    _assert_all_equal(_plain_tables(plain), want)
    again = build_sharded_dlrm(OTHER, common.mixed_plan(1), None)  # and from whole tables into shards
    load_tables(again.embeddings, _round_trip(tmp_path / "plain", table_pieces(plain.embeddings, rank=0)))
    _assert_all_equal(again.embeddings.full_tables(), want)


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad"])
def test_row_stores_save_their_optimizer_state_with_caches_flushed(tmp_path, optimizer):
    opt = make_optimizer({"name": optimizer, "lr": 0.1})
    uncached = DLRM(CONFIG, embeddings=StoreTables.build(CONFIG, opt))
    cached = DLRM(CONFIG, embeddings=StoreTables.build(CONFIG, opt, cache=CacheConfig(ratio=0.3)))
    for model in (uncached, cached):
        _train(model, 3, stores=True)
    pieces = table_pieces(cached.embeddings, rank=0)  # dirty cached rows are written back first
    per_row = optimizer == "rowwise_adagrad"
    assert [tuple(p.arrays["sum"].shape) for p in pieces] == [(n,) if per_row else (n, 4) for n in common.ROWS]
    for name in ("weight", "sum"):
        _assert_all_equal([p.arrays[name] for p in pieces], _store_arrays(uncached.embeddings, name))
    loaded = _round_trip(tmp_path, pieces)
    fresh = DLRM(CONFIG, embeddings=StoreTables.build(OTHER, opt, cache=CacheConfig(ratio=0.3)))
    fresh.load_state_dict(uncached.state_dict())  # the MLPs (the tables are not in the module's state dict)
    load_tables(fresh.embeddings, loaded)
    for model in (uncached, fresh):  # the state is used: one more step from it moves both alike
        _train(model, 1, stores=True, seed=9)
    for name in ("weight", "sum"):
        _assert_all_equal(_store_arrays(fresh.embeddings, name), _store_arrays(uncached.embeddings, name))


def test_sharded_row_stores_load_into_whole_row_stores(tmp_path):
    stores = ShardStores(optimizer={"name": "adagrad", "lr": 0.1})
    sharded = build_sharded_dlrm(CONFIG, common.mixed_plan(1), None, stores=stores)
    _train(sharded, 2, stores=True)
    whole = StoreTables.build(OTHER, make_optimizer({"name": "adagrad", "lr": 0.1}))
    load_tables(whole, _round_trip(tmp_path, table_pieces(sharded.embeddings, rank=0)))
    for name in ("weight", "sum"):
        _assert_all_equal(_store_arrays(whole, name), sharded.embeddings.full_tables(name))


# ------------------------------------------------------------------------------------------------ MLPs
def _mlp_optimizer(kind: str, params) -> torch.optim.Optimizer:
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=0.05)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9 if kind == "sgd_momentum" else 0.0)


@pytest.mark.parametrize("kind", ["sgd", "sgd_momentum", "adagrad"])
def test_dense_state_resumes_the_mlps_and_their_optimizer_exactly(tmp_path, kind):
    model = DLRM(CONFIG)
    mlp_opt = _mlp_optimizer(kind, model.dense_parameters())
    table_opt = torch.optim.SGD(model.embeddings.parameters(), lr=0.5)
    _train(model, 2, opts=[mlp_opt, table_opt])
    state = dense_state(model, mlp_opt)
    names = [f"{prefix}.{n}" for prefix in ("bottom", "top") for n, _ in getattr(model, prefix).named_parameters()]
    assert list(state["weights"]) == names
    assert set(state["optimizer"]) == (set() if kind == "sgd" else set(names))
    if kind == "adagrad":
        assert set(state["optimizer"]["top.0.weight"]) == {"step", "sum"}
    before = state["weights"]["top.0.weight"].clone()
    _train(model, 1, opts=[mlp_opt, table_opt], seed=5)
    assert torch.equal(state["weights"]["top.0.weight"], before)  # a snapshot, not the live tensors

    # the same, through a checkpoint: a fresh model resumed from step 2 takes step 3 exactly as the original
    model = DLRM(CONFIG)
    mlp_opt = _mlp_optimizer(kind, model.dense_parameters())
    table_opt = torch.optim.SGD(model.embeddings.parameters(), lr=0.5)
    _train(model, 2, opts=[mlp_opt, table_opt])
    loaded = _round_trip(tmp_path, table_pieces(model.embeddings, 0), {"dense": dense_state(model, mlp_opt)})
    resumed = DLRM(OTHER)
    resumed_opt = _mlp_optimizer(kind, resumed.dense_parameters())
    load_dense_state(resumed, resumed_opt, loaded.state["dense"], loaded.path)
    load_tables(resumed.embeddings, loaded)
    resumed_tables = torch.optim.SGD(resumed.embeddings.parameters(), lr=0.5)
    for m, opts in ((model, [mlp_opt, table_opt]), (resumed, [resumed_opt, resumed_tables])):
        _train(m, 1, opts=opts, seed=5)
    want = model.state_dict()
    for key, value in resumed.state_dict().items():
        assert torch.equal(value, want[key]), key


# ------------------------------------------------------------------------------------------------ mismatches
def test_table_optimizer_state_outside_row_stores_is_refused():
    model = DLRM(CONFIG)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1)  # holds a "sum" for every table, never saved
    with pytest.raises(CheckpointError, match="the tables' torch optimizer holds state that checkpoints do not "
                                              "save; train tables with state through row stores"):
        dense_state(model, opt)


def test_other_mlps_are_named_in_the_error(tmp_path):
    model = DLRM(CONFIG)
    saved = dense_state(model, torch.optim.SGD(model.dense_parameters(), lr=0.1))
    deeper = DLRM(DLRMConfig(**{**CONFIG.__dict__, "bottom_mlp": (8, 8)}))
    with pytest.raises(CheckpointError, match=r"^ck: the MLP parameters differ: the checkpoint has \[.*'bottom\.2\."
                                              r"bias'.*\], this model \[.*'bottom\.4\.bias'"):
        load_dense_state(deeper, torch.optim.SGD(deeper.dense_parameters(), lr=0.1), saved, "ck")


def test_row_optimizer_state_into_plain_tables_is_refused(tmp_path):
    stored = StoreTables.build(CONFIG, make_optimizer({"name": "adagrad", "lr": 0.1}))
    loaded = _round_trip(tmp_path, table_pieces(stored, 0))
    with pytest.raises(CheckpointError, match=f"^{loaded.path}: table 0 carries row-optimizer state, but this "
                                              "run's tables are plain parameters$"):
        load_tables(DLRM(CONFIG).embeddings, loaded)


def test_plain_tables_into_row_stores_name_the_missing_state(tmp_path):
    loaded = _round_trip(tmp_path, table_pieces(DLRM(CONFIG).embeddings, 0))
    stored = StoreTables.build(CONFIG, make_optimizer({"name": "adagrad", "lr": 0.1}))
    with pytest.raises(CheckpointError, match=f"^{loaded.path}: holds no 'sum' rows of table 0$"):
        load_tables(stored, loaded)


def test_tables_of_other_sizes_are_refused(tmp_path):
    loaded = _round_trip(tmp_path, table_pieces(DLRM(CONFIG).embeddings, 0))
    longer = DLRM(DLRMConfig(**{**CONFIG.__dict__, "table_sizes": (12, *common.ROWS[1:])}))
    with pytest.raises(CheckpointError, match=r"do not cover rows 0\.\.12 x columns 0\.\.4 of 'weight'"):
        load_tables(longer.embeddings, loaded)
    more = DLRM(DLRMConfig(**{**CONFIG.__dict__, "table_sizes": (*common.ROWS, 5)}))
    with pytest.raises(CheckpointError, match="holds no 'weight' rows of table 6"):
        load_tables(more.embeddings, loaded)


def test_an_unknown_table_module_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="cannot checkpoint tables of type Linear"):
        table_pieces(nn.Linear(2, 2), 0)


# ------------------------------------------------------------------------------------------------ 2 ranks
@pytest.mark.slow
def test_two_ranks_shards_load_into_one_process(tmp_path):
    proc = run_torchrun(Path(__file__).parents[1] / "scripts" / "dlrm_checkpoint.py", 2, [tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    loaded = open_checkpoint(tmp_path / "ck")
    assert loaded.step == 2 and loaded.manifest["world_size"] == 2
    replica = [p["file"] for p in loaded.manifest["pieces"] if p["table"] == 1 and p["name"] == "weight"]
    assert replica == ["rows-rank0.pt"]  # the data-parallel table, saved once
    opt = make_optimizer({"name": "adagrad", "lr": 0.1})
    stores = StoreTables.build(OTHER, opt)  # whole tables in one process
    load_tables(stores, loaded)
    sharded = build_sharded_dlrm(OTHER, common.mixed_plan(1), None, stores=ShardStores(optimizer=opt))
    load_tables(sharded.embeddings, loaded)  # and the one-rank plan's shards
    for name in ("weight", "sum"):
        assert not torch.equal(whole[name][2], _store_arrays(StoreTables.build(CONFIG, opt), name)[2])  # trained
        _assert_all_equal(_store_arrays(stores, name), whole[name])
        _assert_all_equal(sharded.embeddings.full_tables(name), whole[name])
