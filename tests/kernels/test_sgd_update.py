"""``haloflow::sgd_update``'s CPU body (one fused multiply-add per element, in place) against its stock formula
(gather, ``add_(alpha=-lr)``, write back), bit for bit at a batch's size and at sizes no vector width divides; a
multiply and an add rounded apart is the control that must differ; bad indices get torch's own error."""

import numpy as np
import pytest
import torch

from haloflow.kernels.sgd_update import cpu, stock


def _batch(u, n_rows=5000, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n_rows + 1, D, generator=g)
    weight[n_rows] = 0.0  # the pad row
    index = torch.randperm(n_rows, generator=g)[:u]
    grad = torch.randn(u, D, generator=g) * torch.rand(u, 1, generator=g) * 10
    return weight, index, grad


@pytest.mark.parametrize("u,D", [(3328, 16), (1, 16), (31, 16), (33, 7), (1000, 3)])
def test_one_fused_multiply_add_a_value_gives_the_stock_bits(u, D):
    weight, index, grad = _batch(u, D=D)
    pad = torch.full((5,), weight.shape[0] - 1)  # padded as padded_unique pads: zero gradients
    index, grad = torch.cat([index, pad]), torch.cat([grad, torch.zeros(5, D)])
    got, want = weight.clone(), weight.clone()
    cpu(got, index, grad, 0.1)
    stock(want, index, grad, 0.1)
    assert torch.equal(got, want)
    assert not torch.equal(got, weight)
    cpu(got, index.to(torch.int32), grad, 0.1)  # int32 rows take the same pass
    stock(want, index, grad, 0.1)
    assert torch.equal(got, want)


def test_the_control_a_multiply_and_an_add_rounded_apart_differs():
    weight, index, grad = _batch(3328)
    rows = weight.index_select(0, index)
    fused = rows.clone().add_(grad, alpha=-0.1)
    apart = rows + torch.from_numpy(np.float32(-0.1) * grad.numpy())
    assert not torch.equal(fused, apart)  # so the bitwise test above can fail


def test_an_index_out_of_range_gets_torchs_error_and_changes_nothing():
    weight, index, grad = _batch(10)
    index[4] = weight.shape[0]
    before = weight.clone()
    with pytest.raises(IndexError):
        cpu(weight, index, grad, 0.1)
    assert torch.equal(weight, before)


def test_a_gradient_of_another_shape_gets_torchs_error_not_a_read_past_its_end():
    weight, index, grad = _batch(10)
    before = weight.clone()
    for bad in (grad[:9], torch.zeros(10, 8)):
        with pytest.raises(RuntimeError):
            cpu(weight, index, bad, 0.1)
    assert torch.equal(weight, before)
