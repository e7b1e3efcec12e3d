"""haloflow/kernels/cos_encode.py: the time encoding against float64 formulas and against autograd of the stock
formula: values, gradients, thread counts, masks."""

import numpy as np
import pytest
import torch

from haloflow.kernels.cos_encode import cos_encode


def _by_autograd(dt, w, b, mask):
    """The encoding as plain torch ops, differentiated by autograd: the reference for the op's own backward."""
    return torch.cos(torch.addcmul(b, dt.to(w.dtype).unsqueeze(-1), w)) * mask.unsqueeze(-1)


def _inputs(seed=0, n=(300, 7), d=50):
    gen = torch.Generator().manual_seed(seed)
    w = torch.from_numpy(1.0 / 10.0 ** np.linspace(0, 9, d)).float()
    b = torch.randn(d, generator=gen) * 0.3
    dt = (torch.rand(n, generator=gen) ** 3 * 3e7).float()  # gaps up to a year in seconds: |a| up to 3e7
    dt.view(-1)[:4] = torch.tensor([0.0, 1e-3, 1.0, 2.0**23])
    return dt, w.requires_grad_(), b.requires_grad_()


def test_values_are_the_cosine_of_the_fused_float32_argument():
    dt, w, b = _inputs()
    arg = torch.addcmul(b, dt.unsqueeze(-1), w).detach()  # float32, one rounding (a fused multiply-add)
    out = cos_encode(dt, w, b)
    assert out.shape == (300, 7, 50) and out.dtype == torch.float32
    err = (out.detach().double() - torch.cos(arg.double())).abs().max()
    assert err < 2.5e-7, err  # about the float32 rounding of a value in [-1, 1]


def test_gradients_equal_the_float64_formulas():
    dt, w, b = _inputs(1)
    dt = dt.clone().requires_grad_()
    g = torch.randn(300, 7, 50, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad(cos_encode(dt, w, b), (dt, w, b), g)
    arg = torch.addcmul(b, dt.unsqueeze(-1), w).detach().double()
    g_arg = -torch.sin(arg) * g.double()  # d cos / d a at the same float32 argument
    want = ((g_arg * w.detach().double()).sum(-1), (g_arg * dt.detach().double()[..., None]).sum((0, 1)),
            g_arg.sum((0, 1)))
    for a, e in zip(got, want):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=1e-5 * float(e.abs().max()))


def test_the_same_floats_at_one_and_two_threads():
    dt, w, b = _inputs(3, n=(1000, 10), d=100)
    g = torch.randn(1000, 10, 100, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = cos_encode(dt, w, b)
            runs.append((out.detach(), *torch.autograd.grad(out, (w, b), g)))
    finally:
        torch.set_num_threads(before)
    for a, e in zip(*runs):
        assert torch.equal(a, e)


@pytest.mark.parametrize("shape", [(0,), (5,), (2, 3)])
def test_agrees_with_the_torch_ops_path_on_small_and_empty_inputs(shape):
    gen = torch.Generator().manual_seed(5)
    dt = torch.rand(shape, generator=gen) * 100
    w, b = torch.rand(8, generator=gen).requires_grad_(), torch.rand(8, generator=gen).requires_grad_()
    out, ref = cos_encode(dt, w, b), _by_autograd(dt, w, b, torch.ones(shape, dtype=torch.bool))
    torch.testing.assert_close(out, ref)
    g = torch.ones_like(ref)
    if out.numel():
        for a, e in zip(torch.autograd.grad(out, (w, b), g), torch.autograd.grad(ref, (w, b), g)):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["the op", "autograd of torch ops"])
def test_masked_rows_are_zeros_without_gradient_and_the_others_unchanged(path):
    dt, w, b = _inputs(6, n=(200, 10), d=40)
    mask = torch.rand(200, 10, generator=torch.Generator().manual_seed(7)) < 0.7
    g = torch.randn(200, 10, 40, generator=torch.Generator().manual_seed(8))
    if path == "the op":
        full, part = cos_encode(dt, w, b), cos_encode(dt, w, b, mask)
    else:
        full = _by_autograd(dt, w, b, torch.ones_like(mask))
        part = _by_autograd(dt, w, b, mask)
    assert torch.equal(part[mask], full[mask]) and not part[~mask].any()
    got = torch.autograd.grad(part, (w, b), g)
    want = torch.autograd.grad(full, (w, b), g * mask[..., None])  # the masked rows' gradient is dropped
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6 * float(e.abs().max()))


def test_float64_times_are_encoded_in_the_weights_dtype():
    dt = torch.tensor([3.0, 1e6], dtype=torch.float64)
    w, b = torch.tensor([1.0, 1e-3]), torch.zeros(2)
    torch.testing.assert_close(cos_encode(dt, w, b), torch.cos(dt.float()[:, None] * w))
