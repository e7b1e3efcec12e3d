import pytest
import torch

from haloflow.cache import SGD, Adagrad, MemoryStore, RowStore
from haloflow.errors import ConfigError


def test_gather_and_apply_by_hand():
    store = MemoryStore(torch.arange(8.0).view(4, 2), SGD(lr=0.5), name="t")
    assert isinstance(store, RowStore)
    assert store.gather(torch.tensor([3, 0, 3])).tolist() == [[6, 7], [0, 1], [6, 7]]
    store.apply_gradients(torch.tensor([3, 1]), torch.tensor([[2.0, 2.0], [4.0, 0.0]]))
    assert store.state_dict()["weight"].tolist() == [[0, 1], [0, 3], [4, 5], [5, 6]]


def test_state_dict_round_trip_and_errors():
    a = MemoryStore(torch.randn(5, 3), Adagrad(lr=0.1), name="clicks")
    a.apply_gradients(torch.tensor([1, 4]), torch.ones(2, 3))
    b = MemoryStore(torch.zeros(5, 3), Adagrad(lr=0.1))
    b.load_state_dict({k: v.clone() for k, v in a.state_dict().items()})
    for k, v in a.state_dict().items():
        assert torch.equal(b.state_dict()[k], v)
    with pytest.raises(ConfigError, match=r"table 'clicks': state_dict has arrays \['weight'\], expected"):
        a.load_state_dict({"weight": torch.zeros(5, 3)})
    with pytest.raises(ConfigError, match=r"state_dict\['sum'\] has shape \(4, 3\), expected \(5, 3\)"):
        a.load_state_dict({"weight": torch.zeros(5, 3), "sum": torch.zeros(4, 3)})
