"""The dense parameters' optimizers: ``torch.optim``'s SGD, Adagrad and Adam, without torch.compile's guards.

torch.optim guards ``add_param_group`` (so the constructor), ``step``, ``zero_grad`` and the state-dict methods
against torch.compile by importing ``torch._dynamo`` on their first call: 1.7-1.9 s of CPU in every process that
trains, most of a training command's start-up (2026-12-07, the 2-core VM, five alternating rounds: ``haloflow train
dlrm --synthetic --max-steps 3`` 4.08 -> 3.10 s, its start-up 1.42 -> 0.70 s; ``docs/results/2026-12-07-startup.md``;
in a K-rank job every rank pays it). haloflow's training loops never compile, so these classes call the bodies of torch's own methods
(``inspect.unwrap`` of the guarded ones): the same functional update (``torch.optim.sgd.sgd``, ``adagrad``,
``adam``), the same state dicts and hooks, the same bits (``tests/engine/test_optimizers.py`` against
``torch.optim``), and ``isinstance(opt, torch.optim.SGD)`` still holds. On a torch whose method has no guard, the
unwrapped method is the method itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = ["SGD", "Adagrad", "Adam", "make_dense_optimizer"]


def _body(method):
    """A torch.optim method without its wrappers (the dynamo guard, ``step``'s grad-mode wrapper, the profiler hook
    torch adds to ``step`` at the first construction)."""
    return inspect.unwrap(method)


class _Unguarded:
    """``Optimizer``'s methods as torch writes them, called without importing ``torch._dynamo``."""

    _torch: type[Optimizer]  # the torch.optim class whose ``step`` this one runs

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _body(Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _body(Optimizer.zero_grad)(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _body(Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _body(Optimizer.load_state_dict)(self, state_dict)

    def step(self, closure=None):
        # torch runs the update with grad mode set to ``differentiable`` (``_use_grad_for_differentiable``)
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _body(self._torch.step)(self, closure)


class SGD(_Unguarded, torch.optim.SGD):
    """``torch.optim.SGD`` (module docstring)."""

    _torch = torch.optim.SGD


class Adagrad(_Unguarded, torch.optim.Adagrad):
    """``torch.optim.Adagrad`` (module docstring)."""

    _torch = torch.optim.Adagrad


class Adam(_Unguarded, torch.optim.Adam):
    """``torch.optim.Adam`` (module docstring)."""

    _torch = torch.optim.Adam


_BY_NAME = {"sgd": SGD, "adagrad": Adagrad, "adam": Adam}


def make_dense_optimizer(name: str, params: Iterable, **kwargs) -> Optimizer:
    """``SGD``, ``Adagrad`` or ``Adam`` by name, with torch's keyword arguments (``lr``, ``fused``, ...)."""
    if name not in _BY_NAME:
        raise ValueError(f"dense optimizer {name!r}: expected one of {sorted(_BY_NAME)}")
    return _BY_NAME[name](params, **kwargs)
