"""The dense optimizers (``engine/optimizers.py``): torch.optim's bits and state dicts, without importing torch._dynamo."""

import copy
import os
import subprocess
import sys

import pytest
import torch

from haloflow.engine.optimizers import SGD, Adagrad, Adam, make_dense_optimizer
from tests.conftest import REPO

CASES = [  # (ours, torch's, keyword arguments)
    (SGD, torch.optim.SGD, {"lr": 0.1}),
    (SGD, torch.optim.SGD, {"lr": 0.1, "fused": True}),
    (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}),
    (Adagrad, torch.optim.Adagrad, {"lr": 0.01, "fused": True}),
    (Adagrad, torch.optim.Adagrad, {"lr": 0.01, "foreach": True}),
    (Adam, torch.optim.Adam, {"lr": 1e-3, "fused": True}),
    (Adam, torch.optim.Adam, {"lr": 1e-2, "weight_decay": 5e-4}),
]


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for i in steps:
        torch.manual_seed(100 + i)
        x, y = torch.randn(32, 7), torch.randn(32, 3)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _same_state(a: dict, b: dict) -> bool:
    if a["param_groups"] != b["param_groups"] or a["state"].keys() != b["state"].keys():
        return False
    return all(s.keys() == b["state"][k].keys() and all(torch.equal(v, b["state"][k][n]) for n, v in s.items())
               for k, s in a["state"].items())


@pytest.mark.parametrize("ours, theirs, kwargs", CASES, ids=lambda c: c.__name__ if isinstance(c, type) else None)
def test_the_same_bits_and_state_dict_as_torch_optim(ours, theirs, kwargs):
    a, b = _model(0), _model(0)
    opt_a, opt_b = ours(a.parameters(), **kwargs), theirs(b.parameters(), **kwargs)
    assert isinstance(opt_a, theirs)
    _train(a, opt_a, range(5))
    _train(b, opt_b, range(5))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert _same_state(opt_a.state_dict(), opt_b.state_dict())
    # each loads the other's state dict and both go on alike
    c, d = _model(1), _model(1)
    c.load_state_dict(a.state_dict())
    d.load_state_dict(b.state_dict())
    opt_c, opt_d = ours(c.parameters(), **kwargs), theirs(d.parameters(), **kwargs)
    opt_c.load_state_dict(copy.deepcopy(opt_b.state_dict()))  # (torch loads tensors without copying them)
    opt_d.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    _train(c, opt_c, range(5, 9))
    _train(d, opt_d, range(5, 9))
    _train(a, opt_a, range(5, 9))
    assert all(torch.equal(p, q) and torch.equal(p, r) for p, q, r in zip(a.parameters(), c.parameters(),
                                                                           d.parameters()))


def test_param_groups_and_step_hooks_work_as_torchs():
    model = _model(0)
    groups = [{"params": [model[0].weight], "weight_decay": 1e-2}, {"params": [model[0].bias, *model[2].parameters()]}]
    opt = make_dense_optimizer("adam", groups, lr=1e-2)
    seen = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append("post"))
    _train(model, opt, range(2))
    assert seen == ["pre", "post"] * 2
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-2, 0]


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"dense optimizer 'lamb': expected one of \['adagrad', 'adam', 'sgd'\]"):
        make_dense_optimizer("lamb", _model(0).parameters(), lr=0.1)


_FRESH = """
import sys, torch
{make}
model = torch.nn.Linear(4, 2)
opt = {cls}(model.parameters(), lr=0.1)
model(torch.ones(3, 4)).sum().backward()
opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())
print("torch._dynamo" in sys.modules)
"""


@pytest.mark.parametrize("cls, imports_dynamo", [("haloflow.engine.optimizers.Adam", False),
                                                 ("torch.optim.Adam", True)])  # the second: the control
def test_a_process_that_steps_them_never_imports_torch_dynamo(cls, imports_dynamo):
    module = cls.rsplit(".", 1)[0]
    code = _FRESH.format(make=f"import {module}", cls=cls)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(imports_dynamo)]


def test_a_training_command_never_imports_torch_dynamo(tmp_path):
    """The 1.7 s import no training process needs: DLRM (fused MLP optimizer, custom ops) from the CLI, in one
    process; nor sympy (0.35 s, which ``skip_init`` of the MLP layers pulled in)."""
    code = ("import sys\nfrom haloflow.cli import main\n"
            "rc = main(['train', 'dlrm', '--synthetic', '--max-steps', '3', '--optimizer', 'adagrad'])\n"
            "print(rc, 'torch._dynamo' in sys.modules, 'sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:] == ["0", "False", "False"], out.stdout[-2000:]
