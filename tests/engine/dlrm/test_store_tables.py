"""DLRM with its tables in row stores: the same model as plain nn.EmbeddingBag tables, cached or not."""

import pytest
import torch

from haloflow.cache import CacheConfig, make_optimizer
from haloflow.data.jagged import JaggedBatch
from haloflow.engine.dlrm.store_tables import StoreTables
from haloflow.engine.dlrm.train import DLRMTrainConfig, train_dlrm
from haloflow.engine.runtime import RuntimeConfig
from haloflow.models.dlrm import DLRM, DLRMConfig, dlrm_loss
from tests.engine.dlrm.test_train import SMALL

CONFIG = DLRMConfig(table_sizes=(30, 7, 50), num_dense=3, embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,), seed=3)


def _batches(steps=12, batch=16, seed=0):
    g = torch.Generator().manual_seed(seed)

    for _ in range(steps):
        lists = [[torch.randint(0, n, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist()
                  for _ in range(batch)] for n in CONFIG.table_sizes]
        yield (torch.randn(batch, 3, generator=g), JaggedBatch.from_lists(lists),
               torch.randint(0, 2, (batch,), generator=g).float())


def _train(model, step_tables, opt):
    for dense, sparse, labels in _batches():
        opt.zero_grad()
        dlrm_loss(model(dense, sparse), labels).backward()
        if step_tables:
            model.embeddings.step()
        opt.step()
    return model


def test_sgd_through_memory_stores_equals_plain_embedding_bags():
    plain = DLRM(CONFIG)
    _train(plain, False, torch.optim.SGD(plain.parameters(), lr=0.1))
    stored = DLRM(CONFIG, embeddings=StoreTables.build(CONFIG, make_optimizer({"name": "sgd", "lr": 0.1})))
    _train(stored, True, torch.optim.SGD(stored.parameters(), lr=0.1))
    for t, bag in enumerate(stored.embeddings.bags):
        torch.testing.assert_close(bag.store.state_dict()["weight"], plain.embeddings.tables[t].weight.detach())
    for k, v in plain.state_dict().items():
        if "embeddings" not in k:
            torch.testing.assert_close(stored.state_dict()[k], v, msg=k)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("ratio", [0.05, 0.3])
def test_a_cache_of_any_size_trains_what_the_uncached_tables_train(optimizer, ratio):
    runs = []
    for cache in (None, CacheConfig(ratio=ratio)):
        tables = StoreTables.build(CONFIG, make_optimizer({"name": optimizer, "lr": 0.05}), cache=cache)
        model = DLRM(CONFIG, embeddings=tables)
        runs.append(_train(model, True, torch.optim.Adagrad(model.parameters(), lr=0.05)))
    (ref, cached) = runs
    for a, b in zip(ref.embeddings.state_dict_rows(), cached.embeddings.state_dict_rows()):
        for key in a:
            assert torch.equal(a[key], b[key]), key
    stats = cached.embeddings.cache_stats()
    assert stats.lookups > 0 and 0 < stats.hits < stats.lookups


def test_the_trainer_reports_the_cache():
    result = train_dlrm(DLRMTrainConfig(**SMALL, cache_ratio=0.05, optimizer="adagrad",
                                        runtime=RuntimeConfig(progress=False)))
    assert 0 <= result.cache["cache_hit_rate"] <= 1 and result.cache["cache_bytes_to_device"] > 0


def test_a_prefetched_batch_is_split_and_made_unique_once(monkeypatch):
    """prefetch(next) then forward(next): the forward reuses the prefetch's ids (one torch.unique per table, not
    two), and training with a prefetch of every next batch ends where training without one does."""
    calls = {"n": 0}
    unique = torch.unique

    def counting(*args, **kwargs):
        calls["n"] += 1
        return unique(*args, **kwargs)

    runs = []
    for prefetch in (False, True):
        tables = StoreTables.build(CONFIG, make_optimizer({"name": "sgd", "lr": 0.05}), cache=CacheConfig(ratio=0.3))
        model = DLRM(CONFIG, embeddings=tables)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        batches = list(_batches())
        monkeypatch.setattr(torch, "unique", counting)
        calls["n"] = 0
        for i, (dense, sparse, labels) in enumerate(batches):
            opt.zero_grad()
            logits = model(dense, sparse)
            if prefetch and i + 1 < len(batches):
                tables.prefetch(batches[i + 1][1])
            dlrm_loss(logits, labels).backward()
            tables.step()
            opt.step()
        monkeypatch.setattr(torch, "unique", unique)
        assert calls["n"] == len(batches) * len(CONFIG.table_sizes)  # with or without the prefetch
        runs.append(tables.state_dict_rows())
    for a, b in zip(*runs):
        assert torch.equal(a["weight"], b["weight"])
