"""``parallelize_dlrm``: on a group of one the single-device DLRM bit for bit (tables as parameters or in row stores);
on 2 and 4 real gloo ranks the single process's losses, step for step, on the synthetic click log."""

import importlib.util
import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from haloflow.cache import CacheConfig, make_optimizer
from haloflow.engine.dlrm.parallelize import parallelize_dlrm
from haloflow.engine.dlrm.shard_stores import ShardStores
from haloflow.engine.dlrm.store_tables import StoreTables
from haloflow.errors import ConfigError
from haloflow.models.dlrm import DLRM, DLRMConfig, dlrm_loss
from haloflow.partition.planner.planner import table_wise_plan
from tests.conftest import one_torch_thread, run_torchrun

SCRIPTS = Path(__file__).parents[1] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = _load("dlrm_common")
parity = _load("dlrm_synthetic_parity")
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
    with pytest.raises(ConfigError, match="row stores hold float32 rows, but dtype torch.float64 was asked for"):
        parallelize_dlrm(CONFIG, PLAN, None, stores=stores, dtype=torch.float64)


def test_float64_weights_stay_float64_through_a_step():
    net = parallelize_dlrm(CONFIG, PLAN, None, dtype=torch.float64)
    dense, sparse, labels = common.global_batches(1, 5)[0]
    logits = net(dense.double(), sparse)
    dlrm_loss(logits, labels.double()).backward()
    net.finish_step()
    assert logits.dtype == torch.float64 and {p.dtype for p in net.parameters()} == {torch.float64}


@pytest.fixture(scope="module")
def one_process_losses():
    with contextmanager(one_torch_thread)():  # like each rank (the values do not depend on it; the time does)
        return parity.synthetic_losses(STEPS, None)


STEPS = 60  # the 200 steps of the command: tests/engine/dlrm/test_train.py, at K = 1 and 2


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [4])  # K = 2: tests/engine/dlrm/test_train.py, 200 steps through the CLI
def test_the_synthetic_log_matches_the_single_process_at_every_step(nproc, one_process_losses):
    # float64: in float32 the layouts part for good once a ReLU input lies within rounding of zero (step 129
    # on the 2-core CI machine), a property of float32, not of the engine; see engine/dlrm/parallelize.
    proc = run_torchrun(SCRIPTS / "dlrm_synthetic_parity.py", nproc, ["--steps", str(STEPS)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("LOSSES "))
    losses = json.loads(line[len("LOSSES "):])
    assert len(losses) == len(one_process_losses) == STEPS
    worst = max(abs(a - b) for a, b in zip(losses, one_process_losses))
    assert worst <= 1e-5, f"K = {nproc}: max |loss_K - loss_1| = {worst:.3g} over {STEPS} steps"
    assert sum(one_process_losses[-20:]) < sum(one_process_losses[:20])  # it learned: the losses are not constant
