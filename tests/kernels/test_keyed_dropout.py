"""haloflow/kernels/keyed_dropout.py: the mask is a function of its key alone."""

import numpy as np
import pytest
import torch

from haloflow.errors import ConfigError
from haloflow.kernels.keyed_dropout import dropout_mask, keyed_dropout

KEY = dict(p=0.5, seed=3, epoch=7, layer=1)


def _ids(rng, n=300):
    return torch.from_numpy(rng.choice(10**9, size=n, replace=False))


def test_mask_depends_only_on_the_key_not_on_row_order_or_subset(rng):
    ids = _ids(rng)
    h = torch.from_numpy(rng.standard_normal((300, 24)).astype(np.float32))
    full = keyed_dropout(h, ids, training=True, **KEY)
    pick = torch.from_numpy(rng.permutation(300)[:97])  # a shuffled subset, as one rank would hold
    part = keyed_dropout(h[pick], ids[pick], training=True, **KEY)
    assert torch.equal(part, full[pick])


@pytest.mark.parametrize("change", [dict(epoch=8), dict(layer=2), dict(seed=4)])
def test_another_epoch_layer_or_seed_gives_another_mask(change, rng):
    ids = _ids(rng)
    a = dropout_mask(ids, 32, **KEY)
    b = dropout_mask(ids, 32, **{**KEY, **change})
    # Independent masks at p = 0.5 agree on about half the elements.
    assert 0.45 < (a == b).float().mean().item() < 0.55


def test_columns_of_one_row_differ(rng):
    m = dropout_mask(_ids(rng), 64, **KEY)
    assert not torch.equal(m[:, :32], m[:, 32:])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_keep_fraction_and_scaling(p, rng):
    ids = _ids(rng, 500)
    h = torch.from_numpy(rng.uniform(1, 2, (500, 40)).astype(np.float32))
    out = keyed_dropout(h, ids, p=p, seed=0, epoch=0, layer=0, training=True)
    kept = out != 0
    # 20,000 Bernoulli(1 - p) draws: the standard deviation of the fraction is <= 0.0036.
    assert abs(kept.float().mean().item() - (1 - p)) < 0.015
    torch.testing.assert_close(out[kept], h[kept] / (1 - p))


def test_gradient_is_the_scaled_mask(rng):
    ids = _ids(rng, 50)
    h = torch.from_numpy(rng.standard_normal((50, 8))).requires_grad_()
    out = keyed_dropout(h, ids, training=True, **KEY)
    out.sum().backward()
    mask = dropout_mask(ids, 8, **KEY)
    assert torch.equal(h.grad, mask.double() * 2.0)
    assert torch.autograd.gradcheck(lambda t: keyed_dropout(t, ids, training=True, **KEY), (h,))


def test_eval_mode_and_p_zero_return_the_input(rng):
    h = torch.randn(5, 3)
    ids = torch.arange(5)
    assert keyed_dropout(h, ids, training=False, **KEY) is h
    assert keyed_dropout(h, ids, p=0.0, seed=0, epoch=0, layer=0, training=True) is h


def test_errors_name_the_problem():
    h, ids = torch.ones(4, 2), torch.arange(4)
    with pytest.raises(ConfigError, match=r"p must be in \[0, 1\), got 1.0"):
        keyed_dropout(h, ids, p=1.0, seed=0, epoch=0, layer=0, training=True)
    with pytest.raises(ConfigError, match=r"node_ids \(n,\), got \(4, 2\) and \(3,\)"):
        keyed_dropout(h, ids[:3], p=0.5, seed=0, epoch=0, layer=0, training=True)
    with pytest.raises(ConfigError, match="epoch must be >= 0"):
        keyed_dropout(h, ids, p=0.5, seed=0, epoch=-1, layer=0, training=True)


def test_fused_relu_equals_dropout_of_relu(rng):
    ids = _ids(rng, 80)
    h = torch.from_numpy(rng.standard_normal((80, 13)).astype(np.float32)).requires_grad_()
    fused = keyed_dropout(h, ids, training=True, relu=True, **KEY)
    g = torch.from_numpy(rng.standard_normal((80, 13)).astype(np.float32))
    (grad_fused,) = torch.autograd.grad(fused, h, g)
    plain = keyed_dropout(torch.relu(h), ids, training=True, **KEY)
    (grad_plain,) = torch.autograd.grad(plain, h, g)
    assert torch.equal(fused, plain)
    assert torch.equal(grad_fused, grad_plain)
    assert torch.equal(keyed_dropout(h, ids, training=False, relu=True, **KEY), torch.relu(h))


def test_the_stock_mask_is_the_compiled_one_bit_for_bit(rng):
    # every body draws the same mask (the stock formula's torch int64 ops run on any device): against the numba one
    from haloflow.kernels import keyed_dropout as m

    ids = _ids(rng, 64)
    for n_cols in (7, 32):
        for key in (KEY, dict(p=0.1, seed=2**63 + 5, epoch=0, layer=9)):
            stock = m.keep_mask(ids, n_cols, m.base_key(key["seed"], key["epoch"], key["layer"]), m.threshold(key["p"]))
            assert torch.equal(stock, dropout_mask(ids, n_cols, **key))
