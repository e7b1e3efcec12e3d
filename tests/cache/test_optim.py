import numpy as np
import pytest
import torch
from torch import nn

from haloflow.cache import SGD, Adagrad, CachedEmbeddingBag, MemoryStore, RowWiseAdagrad, make_optimizer
from haloflow.errors import ConfigError
from tests.cache.conftest import zipf_batches

N, D, STEPS = 30, 5, 50


def _train_ours(w0, opt, batches, seed=1):
    store = MemoryStore(w0.clone(), opt)
    bag = CachedEmbeddingBag(store)
    g = torch.Generator().manual_seed(seed)
    for ids, offsets in batches:
        out = bag(ids, offsets)  # (B, D)
        (out * torch.randn(out.shape, generator=g)).sum().backward()
        bag.step()
    return store.state_dict()


def _in_order(grad):
    """A sparse gradient coalesced with each row's occurrences summed in the order they come (as the stores sum
    them; ``coalesce()`` orders a row's occurrences by its sort of the whole index array)."""
    ids, vals = grad._indices()[0], grad._values()
    rows = torch.unique(ids)
    summed = torch.zeros(grad.shape, dtype=vals.dtype).index_add_(0, ids, vals)  # one occurrence at a time
    return torch.sparse_coo_tensor(rows.unsqueeze(0), summed[rows], grad.shape, is_coalesced=True)


def _train_torch(w0, make_opt, batches, seed=1, coalesce=False, in_order=True):
    """nn.EmbeddingBag with a torch optimizer; ``in_order``: the sparse gradient summed per row in occurrence order
    first (torch's optimizers then do their own arithmetic on it), ``coalesce``: by ``coalesce()`` first."""
    ref = nn.EmbeddingBag(N, D, mode="sum", sparse=True, _weight=w0.clone())
    opt = make_opt(ref.parameters())
    g = torch.Generator().manual_seed(seed)
    for ids, offsets in batches:
        opt.zero_grad()
        out = ref(ids, offsets)
        (out * torch.randn(out.shape, generator=g)).sum().backward()
        if coalesce:
            ref.weight.grad = ref.weight.grad.coalesce()
        elif in_order:
            ref.weight.grad = _in_order(ref.weight.grad)
        opt.step()
    return ref.weight.detach(), opt


@pytest.fixture
def setup(rng):
    w0 = torch.empty(N, D).uniform_(-1, 1, generator=torch.Generator().manual_seed(0))
    return w0, zipf_batches(rng, N, STEPS, nnz=40, bags=8)


def test_sgd_equals_torch_sgd_on_gradients_summed_in_order(setup):
    # Same order of operations: each row's gradient summed over its occurrences in order, then w += -lr * g.
    w0, batches = setup
    ours = _train_ours(w0, SGD(lr=0.1), batches)
    ref, _ = _train_torch(w0, lambda p: torch.optim.SGD(p, lr=0.1), batches)
    assert torch.equal(ours["weight"], ref)
    # control: torch's coalesce() sums a row's occurrences in another order, which shows in the bits
    other, _ = _train_torch(w0, lambda p: torch.optim.SGD(p, lr=0.1), batches, coalesce=True)
    assert not torch.equal(ours["weight"], other)


def test_sgd_matches_torch_sgd_on_raw_sparse_gradients(setup):
    # torch.optim.SGD adds an uncoalesced sparse gradient one occurrence at a time (w += -lr*g1; w += -lr*g2),
    # we add the summed gradient once: equal up to float32 rounding of the repeated adds, not bit for bit.
    w0, batches = setup
    ours = _train_ours(w0, SGD(lr=0.1), batches)
    ref, _ = _train_torch(w0, lambda p: torch.optim.SGD(p, lr=0.1), batches, in_order=False)
    assert not torch.equal(ours["weight"], ref)  # the orders do differ on this trace (repeated ids per batch)
    torch.testing.assert_close(ours["weight"], ref, rtol=1e-5, atol=1e-5)


def test_adagrad_equals_torch_adagrad_bit_for_bit(setup):
    # torch.optim.Adagrad, given the gradient summed per row in order, does what Adagrad.update does, in order.
    w0, batches = setup
    ours = _train_ours(w0, Adagrad(lr=0.1), batches)
    ref, opt = _train_torch(w0, lambda p: torch.optim.Adagrad(p, lr=0.1), batches)
    assert torch.equal(ours["weight"], ref)
    assert torch.equal(ours["sum"], opt.state[opt.param_groups[0]["params"][0]]["sum"])


def test_adagrad_initial_accumulator_and_eps_as_torch(setup):
    w0, batches = setup
    ours = _train_ours(w0, Adagrad(lr=0.05, eps=1e-6, initial_accumulator_value=0.5), batches)
    ref, _ = _train_torch(w0, lambda p: torch.optim.Adagrad(p, lr=0.05, eps=1e-6, initial_accumulator_value=0.5),
                          batches)
    assert torch.equal(ours["weight"], ref)


def _rowwise_reference(w0, batches, lr, eps, seed=1):
    """FBGEMM's exact row-wise Adagrad written out row by row in float64, from the dense gradient."""
    w = w0.double().clone()
    m = torch.zeros(N, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    for ids, offsets in batches:
        bounds = offsets.tolist() + [ids.numel()]
        upstream = torch.randn((len(offsets), D), generator=g).double()  # d loss / d pooled
        grad = torch.zeros(N, D, dtype=torch.float64)
        for b in range(len(offsets)):
            for i in ids[bounds[b]:bounds[b + 1]].tolist():
                grad[i] += upstream[b]
        for i in sorted(set(ids.tolist())):
            m[i] += (grad[i] ** 2).mean()
            w[i] -= lr / (m[i].sqrt() + eps) * grad[i]
    return w, m


def test_rowwise_adagrad_against_a_hand_written_reference(setup):
    # Our float32 arithmetic against a float64 reference: equal to float32 rounding (not bitwise by design).
    w0, batches = setup
    ours = _train_ours(w0, RowWiseAdagrad(lr=0.1), batches)
    w, m = _rowwise_reference(w0, batches, 0.1, 1e-8)
    assert ours["sum"].shape == (N,)
    torch.testing.assert_close(ours["weight"], w.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours["sum"], m.float(), rtol=1e-5, atol=1e-7)


def test_rowwise_adagrad_one_step_by_hand():
    opt = RowWiseAdagrad(lr=1.0, eps=0.0 + 1e-8)
    w = torch.tensor([[1.0, 1.0]])
    s = {"sum": torch.tensor([0.0])}
    opt.update(w, s, torch.tensor([[3.0, 4.0]]))
    assert s["sum"].tolist() == [12.5]  # (9 + 16) / 2
    torch.testing.assert_close(w, torch.tensor([[1 - 3 / 12.5 ** 0.5, 1 - 4 / 12.5 ** 0.5]]))


def test_make_optimizer_round_trips_config_and_names_bad_input():
    for opt in (SGD(lr=0.2), Adagrad(lr=0.3, eps=1e-9), RowWiseAdagrad(lr=0.4)):
        assert make_optimizer(opt.config()) == opt
    with pytest.raises(ConfigError, match="one of"):
        make_optimizer({"name": "adam"})
    with pytest.raises(ConfigError, match="lr must be > 0"):
        Adagrad(lr=0)
    with pytest.raises(ConfigError, match="eps must be > 0"):
        RowWiseAdagrad(eps=-1.0)
    assert np.isfinite(SGD().lr)
