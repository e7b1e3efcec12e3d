import torch
from torch import nn

from haloflow.cache import SGD, CachedEmbeddingBag, MemoryStore


def test_pooling_equals_nn_embedding_bag():
    w = torch.randn(9, 4)
    ids, offsets = torch.tensor([7, 2, 7, 8, 2, 0]), torch.tensor([0, 2, 2, 5])  # bag 1 empty
    ref = nn.EmbeddingBag(9, 4, mode="sum", _weight=w.clone())(ids, offsets)
    bag = CachedEmbeddingBag(MemoryStore(w.clone(), SGD()))
    assert torch.equal(bag(ids, offsets), ref)
    last = CachedEmbeddingBag(MemoryStore(w.clone(), SGD()), include_last_offset=True)
    assert torch.equal(last(ids, torch.tensor([0, 2, 2, 5, 6])), ref)


def test_step_applies_each_rows_summed_gradient_once():
    store = MemoryStore(torch.zeros(4, 1), SGD(lr=1.0))
    bag = CachedEmbeddingBag(store)
    out = bag(torch.tensor([1, 1, 3]), torch.tensor([0, 2]))  # bags [1, 1] and [3]
    (out * torch.tensor([[2.0], [5.0]])).sum().backward()
    bag.step()
    assert store.state_dict()["weight"].flatten().tolist() == [0, -4, 0, -5]
    bag.step()  # nothing pending: no second update
    assert store.state_dict()["weight"].flatten().tolist() == [0, -4, 0, -5]


def test_eval_mode_keeps_nothing_for_step():
    bag = CachedEmbeddingBag(MemoryStore(torch.ones(3, 2), SGD())).eval()
    out = bag(torch.tensor([0, 1]), torch.tensor([0]))
    assert not out.requires_grad and bag._pending == []
