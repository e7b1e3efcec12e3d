"""``parallelize_dlrm``: on a group of one the single-device DLRM bit for bit (tables as parameters or in row stores);
on K real ranks the same floats as one process: tests/engine/dlrm/test_exact.py (K = 1, 2, 4, bitwise)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from haloflow.cache import CacheConfig, make_optimizer
from haloflow.engine.dlrm.parallelize import parallelize_dlrm
from haloflow.engine.dlrm.shard_stores import ShardStores
from haloflow.engine.dlrm.store_tables import StoreTables
from haloflow.errors import ConfigError
from haloflow.models.dlrm import DLRM, dlrm_loss
from haloflow.partition.planner.planner import table_wise_plan

SCRIPTS = Path(__file__).parents[1] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = _load("dlrm_common")
CONFIG = common.small_model().config
PLAN = table_wise_plan(CONFIG.table_sizes, CONFIG.embedding_dim, 1)  # what training uses at K = 1


def _train(model, after_backward, steps=6):
    """SGD on the MLPs (and on the tables when they are parameters), ``after_backward()`` before its step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for dense, sparse, labels in common.global_batches(steps, 9, seed=3):
        opt.zero_grad(set_to_none=True)
        loss = dlrm_loss(model(dense, sparse), labels)
        loss.backward()
        after_backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def test_a_group_of_one_trains_bit_for_bit_what_the_single_device_model_trains():
    ref = DLRM(CONFIG)
    net = parallelize_dlrm(CONFIG, PLAN, None)
    want, got = _train(ref, lambda: None), _train(net, net.finish_step)
    assert torch.equal(got, want)
    full = net.to_dlrm().state_dict()
    for key, value in ref.state_dict().items():
        assert torch.equal(full[key], value), key
    assert not torch.equal(full["embeddings.tables.0.weight"], common.small_model().embeddings.tables[0].weight)


def test_sgd_fused_into_the_shards_trains_bit_for_bit_what_their_sparse_gradients_train():
    # the trainer's SGD path: the shards' rows updated inside the backward, the torch optimizer stepping the rest
    ref = DLRM(CONFIG)
    net = parallelize_dlrm(CONFIG, PLAN, None, fused_sgd_lr=0.1)
    want, got = _train(ref, lambda: None), _train(net, net.finish_step)
    assert torch.equal(got, want)
    assert all(p.grad is None for p in net.embeddings.shards)  # no sparse gradient was built for them
    full = net.to_dlrm().state_dict()
    for key, value in ref.state_dict().items():
        assert torch.equal(full[key], value), key
    with pytest.raises(ConfigError, match="fused_sgd_lr 0.1: expected .* not row stores"):
        parallelize_dlrm(CONFIG, PLAN, None, fused_sgd_lr=0.1, stores=ShardStores(optimizer=make_optimizer(
            {"name": "sgd", "lr": 0.1})))


@pytest.mark.parametrize("name, cache", [("sgd", None), ("adagrad", CacheConfig(ratio=0.3)),
                                         ("rowwise_adagrad", CacheConfig(num_slots=1))])
def test_a_group_of_one_in_row_stores_trains_bit_for_bit_what_store_tables_train(name, cache):
    # finish_step() applies the stores' fused update: without it the tables would stay where they started.
    optimizer = make_optimizer({"name": name, "lr": 0.1})
    ref = DLRM(CONFIG, embeddings=StoreTables.build(CONFIG, optimizer, cache=cache))
    net = parallelize_dlrm(CONFIG, PLAN, None, stores=ShardStores(optimizer=optimizer, cache=cache))
    want, got = _train(ref, ref.embeddings.step), _train(net, net.finish_step)
    assert torch.equal(got, want)
    rows = ref.embeddings.state_dict_rows()
    for key in rows[0]:  # the weights and the optimizer's state
        for t, table in enumerate(net.embeddings.full_tables(key)):
            assert torch.equal(table, rows[t][key]), f"{key} of table {t}"
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):  # the MLPs only
        assert torch.equal(a, b)
    assert not torch.equal(rows[0]["weight"], common.small_model().embeddings.tables[0].weight)


def test_row_stores_refuse_weights_of_another_type():
    stores = ShardStores(optimizer=make_optimizer({"name": "sgd", "lr": 0.1}))
    with pytest.raises(ConfigError, match="row stores hold torch.float32 rows, but dtype torch.float64 was asked for"):
        parallelize_dlrm(CONFIG, PLAN, None, stores=stores, dtype=torch.float64)


def test_float64_row_stores_train_in_float64():
    stores = ShardStores(optimizer=make_optimizer({"name": "adagrad", "lr": 0.1}), dtype=torch.float64)
    net = parallelize_dlrm(CONFIG, PLAN, None, stores=stores, dtype=torch.float64)
    dense, sparse, labels = common.global_batches(1, 5)[0]
    before = [s.state_dict()["weight"].clone() for s in net.embeddings.slot_stores()]
    dlrm_loss(net(dense.double(), sparse), labels.double()).backward()
    net.finish_step()
    after = [s.state_dict()["weight"] for s in net.embeddings.slot_stores()]
    assert {w.dtype for w in after} == {torch.float64}
    assert any(not torch.equal(a, b) for a, b in zip(before, after))  # the step reached the tables


def test_float64_weights_stay_float64_through_a_step():
    net = parallelize_dlrm(CONFIG, PLAN, None, dtype=torch.float64)
    dense, sparse, labels = common.global_batches(1, 5)[0]
    logits = net(dense.double(), sparse)
    dlrm_loss(logits, labels.double()).backward()
    net.finish_step()
    assert logits.dtype == torch.float64 and {p.dtype for p in net.parameters()} == {torch.float64}
