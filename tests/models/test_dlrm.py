import math
import subprocess
import sys

import pytest
import torch

from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.data.jagged import JaggedBatch
from haloflow.errors import ConfigError
from haloflow.models.dlrm import KAGGLE_TABLE_SIZES, DLRM, DLRMConfig, EmbeddingTables, dlrm_loss, interaction
from tests.conftest import REPO


@pytest.fixture
def one_thread():
    """The training test is tiny; a single thread avoids spin-waiting on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_interaction_by_hand():
    z = torch.tensor([[1.0, 2.0]])  # (B=1, D=2)
    pooled = torch.tensor([[[3.0, 4.0], [5.0, 6.0]]])  # (B=1, T=2, D=2)
    # vectors v0 = z = (1, 2), v1 = (3, 4), v2 = (5, 6); pairs (1,0), (2,0), (2,1)
    expected = [1.0, 2.0, 1 * 3 + 2 * 4, 1 * 5 + 2 * 6, 3 * 5 + 4 * 6]
    assert interaction(z, pooled).tolist() == [expected]


def test_interaction_width_of_kaggle_config():
    cfg = DLRMConfig.kaggle()
    assert cfg.interaction_dim == 367  # 16 + 27 * 26 / 2, FACTS.md
    assert sum(cfg.table_sizes) == 33_762_577
    out = interaction(torch.randn(4, 16), torch.randn(4, 26, 16))
    assert out.shape == (4, 367)


def test_embedding_tables_sum_bags_and_empty_bags_are_zero():
    tables = EmbeddingTables((5, 4), dim=3, seed=1)
    sparse = JaggedBatch.from_lists([[[0, 2], [], [4]], [[1], [3, 3], [0]]])
    pooled = tables(sparse)  # (B=3, T=2, D=3)
    w0, w1 = tables.tables[0].weight, tables.tables[1].weight
    expected = torch.stack(
        [
            torch.stack([w0[0] + w0[2], w1[1]]),
            torch.stack([torch.zeros(3), w1[3] + w1[3]]),
            torch.stack([w0[4], w1[0]]),
        ]
    )
    torch.testing.assert_close(pooled, expected, rtol=0, atol=0)
    assert tables.start(sparse).wait().shape == (3, 2, 3)
    with pytest.raises(ConfigError, match="3 features but the model has 2 tables"):
        tables(JaggedBatch.from_dense(torch.zeros(2, 3, dtype=torch.int64)))


def test_forward_matches_a_hand_written_pipeline():
    cfg = DLRMConfig(table_sizes=(6, 7, 8), num_dense=4, embedding_dim=5, bottom_mlp=(9,), top_mlp=(11,), seed=3)
    model = DLRM(cfg)
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(6, 4, generator=g)
    ids = torch.stack([torch.randint(0, n, (6,), generator=g) for n in cfg.table_sizes], dim=1)  # (B, T)
    logits = model(dense, JaggedBatch.from_dense(ids))
    assert logits.shape == (6,)
    # the same model applied step by step, one-hot lookups by plain indexing
    z = model.bottom(dense)
    pooled = torch.stack([model.embeddings.tables[t].weight[ids[:, t]] for t in range(3)], dim=1)
    vectors = torch.cat([z[:, None], pooled], dim=1)  # (B, 4, D)
    dots = [(vectors[:, i] * vectors[:, j]).sum(1) for i in range(4) for j in range(i)]
    expected = model.top(torch.cat([z, torch.stack(dots, 1)], 1)).squeeze(1)
    torch.testing.assert_close(logits, expected)


def test_same_seed_same_weights_and_sparse_gradients():
    cfg = DLRMConfig(table_sizes=(10, 20), bottom_mlp=(8,), top_mlp=(8,), seed=7)
    a, b, c = DLRM(cfg), DLRM(cfg), DLRM(DLRMConfig(table_sizes=(10, 20), bottom_mlp=(8,), top_mlp=(8,), seed=8))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.top[0].weight, c.top[0].weight)
    sparse = JaggedBatch.from_dense(torch.tensor([[1, 2], [3, 4]]))
    dlrm_loss(a(torch.randn(2, 13), sparse), torch.tensor([0.0, 1.0])).backward()
    grad = a.embeddings.tables[0].weight.grad
    assert grad.is_sparse and sorted(grad.coalesce().indices()[0].tolist()) == [1, 3]


def test_loss_over_slices_adds_up_to_the_global_mean():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(10, generator=g), (torch.rand(10, generator=g) > 0.5).float()
    full = dlrm_loss(logits, labels)
    parts = sum(dlrm_loss(lg, lb, global_batch_size=10) for lg, lb in zip(logits.split(4), labels.split(4)))
    torch.testing.assert_close(parts, full)
    expected = -(labels * torch.log(torch.sigmoid(logits)) + (1 - labels) * torch.log(1 - torch.sigmoid(logits)))
    torch.testing.assert_close(full, expected.mean())


def test_config_errors():
    with pytest.raises(ConfigError, match="table_sizes must be non-empty positive ints"):
        DLRMConfig(table_sizes=())
    with pytest.raises(ConfigError, match="embedding_dim must be >= 1"):
        DLRMConfig(table_sizes=(3,), embedding_dim=0)
    assert DLRMConfig(table_sizes=KAGGLE_TABLE_SIZES).bottom_mlp == (512, 256, 64)


@pytest.mark.slow
def test_training_on_synthetic_clicks_beats_a_constant_predictor(one_thread):
    gen = ClickLogGenerator(ClickLogConfig(scale=1e-3, max_rows=1000, seed=0))
    torch.manual_seed(0)
    model = DLRM(DLRMConfig(table_sizes=gen.sizes, bottom_mlp=(32,), top_mlp=(32,), seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in gen.batches(batch_size=256, num_batches=250, start=8192):
        loss = dlrm_loss(model(batch.dense, batch.sparse), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    held_out = gen.samples(0, 8192)  # never trained on
    p = held_out.labels.mean().item()
    entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p))  # logloss of the best constant predictor
    with torch.no_grad():
        logloss = dlrm_loss(model(held_out.dense, held_out.sparse), held_out.labels).item()
    print(f"held-out logloss {logloss:.4f}, label entropy {entropy:.4f}")
    assert logloss < entropy - 0.03, (logloss, entropy)


def test_a_model_larger_than_free_memory_is_refused_before_allocating():
    with pytest.raises(ConfigError, match=r"the model needs at least [\d.]+ TiB \(2 tables of 2,000,000 rows in all "
                                          r"x embedding_dim 1000000000"):
        DLRM(DLRMConfig(table_sizes=(10**6, 10**6), num_dense=13, embedding_dim=10**9, bottom_mlp=(8,), top_mlp=(8,)))


def _reference_interaction(z, pooled):  # the expression autograd differentiated before the fused backward
    B, T, D = pooled.shape
    v = torch.cat([z.unsqueeze(1), pooled], dim=1)
    li, lj = torch.tril_indices(T + 1, T + 1, offset=-1)
    return torch.cat([z, torch.bmm(v, v.transpose(1, 2))[:, li, lj]], dim=1)


def test_interaction_backward_is_autograds_of_bmm_and_indexing():
    g = torch.Generator().manual_seed(4)
    z, pooled = torch.randn(32, 16, generator=g), torch.randn(32, 26, 16, generator=g)
    grad_out = torch.randn(32, 367, generator=g)
    got, want = [], []
    for fn, out in ((interaction, got), (_reference_interaction, want)):
        a, b = z.clone().requires_grad_(), pooled.clone().requires_grad_()
        y = fn(a, b)
        y.backward(grad_out)
        out.extend([y.detach(), a.grad, b.grad])
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=0, atol=0)  # same floats, forward and backward
    small = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
             torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(interaction, small)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sgd_fused_into_the_tables_trains_what_sparse_gradients_and_torch_sgd_train(dtype, one_thread):
    # 26 small tables, so that rows repeat within a batch and across batches; the weights stay off the torch
    # optimizer (no .grad), which then steps the MLPs alone
    gen = ClickLogGenerator(ClickLogConfig(max_rows=300, seed=2))
    cfg = DLRMConfig(table_sizes=gen.sizes, bottom_mlp=(16,), top_mlp=(16,))
    ref = DLRM(cfg).to(dtype)
    fused = DLRM(cfg, embeddings=EmbeddingTables(cfg.table_sizes, 16, 0, fused_sgd_lr=0.05)).to(dtype)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ref, fused)]
    for b in gen.batches(64, 15):
        losses = []
        for m, opt in zip((ref, fused), opts):
            opt.zero_grad(set_to_none=True)
            loss = dlrm_loss(m(b.dense.to(dtype), b.sparse), b.labels.to(dtype))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-12 if dtype == torch.float64 else 0, abs=0)
    assert all(t.weight.grad is None for t in fused.embeddings.tables)
    exact = dtype == torch.float32  # float32: the same roundings as torch's fused multiply-add
    for x, y in zip(ref.embeddings.tables, fused.embeddings.tables):
        torch.testing.assert_close(x.weight, y.weight, rtol=0 if exact else 1e-12, atol=0 if exact else 1e-14)
    with torch.no_grad():  # evaluation: a plain lookup, nothing updated
        before = [t.weight.clone() for t in fused.embeddings.tables]
        fused(b.dense.to(dtype), b.sparse)
        assert all(torch.equal(x, t.weight) for x, t in zip(before, fused.embeddings.tables))
    with pytest.raises(ConfigError, match="fused_sgd_lr must be > 0, got 0"):
        EmbeddingTables((3,), 2, fused_sgd_lr=0)


@pytest.mark.parametrize("build, imports_sympy", [
    ("from haloflow.models.dlrm import _mlp; _mlp([13, 8, 4], torch.Generator().manual_seed(0), True)", False),
    ("torch.nn.utils.skip_init(torch.nn.Linear, 13, 8)", True)])  # the second: the control
def test_building_the_mlps_never_imports_sympy(build, imports_sympy):
    """The layers are built uninitialised without ``skip_init``, whose ``to_empty`` imports sympy (0.35 s of a
    DLRM process's start-up); the control shows it does."""
    code = f"import sys, torch\n{build}\nprint('sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(imports_sympy)]
