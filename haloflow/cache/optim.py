"""Row optimizers: SGD, Adagrad and row-wise Adagrad, each updating only the rows a batch touched.

Per row ``i`` with gradient ``g_i`` (D,), summed over every occurrence of the row in the batch::

    SGD                 w_i -= lr * g_i
    Adagrad             s_i += g_i * g_i                       s_i (D,)  one accumulator per element
                        w_i -= lr * g_i / (sqrt(s_i) + eps)
    row-wise Adagrad    m_i += mean(g_i * g_i)                 m_i ()    one accumulator per row (FBGEMM)
                        w_i -= lr * g_i / (sqrt(m_i) + eps)

Adagrad is ``torch.optim.Adagrad`` with ``lr_decay=0`` and ``weight_decay=0``, in the same order of operations
as its sparse-gradient path (``state += g.pow(2)``; ``std = sqrt(state) + eps``; ``w += -lr * (g / std)``), so a
table updated here equals one updated by torch bit for bit. Row-wise Adagrad is FBGEMM's
``EmbOptimType.EXACT_ROWWISE_ADAGRAD`` (https://github.com/pytorch/FBGEMM): D times less state than Adagrad.

Shapes:
    update: weight (u, D), state {name: (u, *per-row shape)}, grad (u, D); in place
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from haloflow.cache.types import RowOptimizer
from haloflow.errors import ConfigError
from haloflow.kernels.sgd_update import sgd_update

__all__ = ["SGD", "Adagrad", "RowWiseAdagrad", "make_optimizer", "OPTIMIZERS"]


def _check(cls: str, lr: float, eps: float | None = None, init: float | None = None) -> None:
    if not lr > 0:
        raise ConfigError(f"{cls}.lr must be > 0, got {lr}", field="lr")
    if eps is not None and not eps > 0:
        raise ConfigError(f"{cls}.eps must be > 0, got {eps}", field="eps")
    if init is not None and not init >= 0:
        raise ConfigError(f"{cls}.initial_accumulator_value must be >= 0, got {init}", field="initial_accumulator_value")


@dataclass(frozen=True, kw_only=True)
class SGD(RowOptimizer):
    """Plain SGD (``torch.optim.SGD`` without momentum): no state.

    Args:
        lr: learning rate (DLRM's reference uses 0.1).
    """

    lr: float = 0.1
    name = "sgd"

    def __post_init__(self) -> None:
        _check("SGD", self.lr)

    def state_spec(self, dim: int) -> dict[str, tuple[tuple[int, ...], float]]:
        return {}

    def update(self, weight: Tensor, state: dict[str, Tensor], grad: Tensor) -> None:
        weight.add_(grad, alpha=-self.lr)  # (u, D)

    def apply_rows(self, arrays: dict[str, Tensor], index: Tensor, grad: Tensor) -> None:
        """In place, one pass (``haloflow::sgd_update``): the floats of ``update`` on gathered copies."""
        weight = arrays["weight"]
        if weight.device != grad.device:
            return super().apply_rows(arrays, index, grad)
        sgd_update(weight, index.to(weight.device), grad, self.lr)

    def config(self) -> dict:
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class Adagrad(RowOptimizer):
    """``torch.optim.Adagrad`` (lr_decay 0, weight_decay 0) on rows; state ``sum`` (D,) per row.

    Args:
        lr: learning rate (torch's default 0.01).
        eps: added to the square root (torch's default 1e-10).
        initial_accumulator_value: starting value of every ``sum`` element (torch's default 0).
    """

    lr: float = 0.01
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0
    name = "adagrad"

    def __post_init__(self) -> None:
        _check("Adagrad", self.lr, self.eps, self.initial_accumulator_value)

    def state_spec(self, dim: int) -> dict[str, tuple[tuple[int, ...], float]]:
        return {"sum": ((dim,), self.initial_accumulator_value)}

    def update(self, weight: Tensor, state: dict[str, Tensor], grad: Tensor) -> None:
        acc = state["sum"]  # (u, D)
        acc.add_(grad.pow(2))
        std = acc.sqrt().add_(self.eps)  # (u, D)
        weight.add_(grad / std, alpha=-self.lr)

    def config(self) -> dict:
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class RowWiseAdagrad(RowOptimizer):
    """FBGEMM's exact row-wise Adagrad: one accumulator per row, the running sum of the row's mean g^2.

    Args:
        lr: learning rate.
        eps: added to the square root (FBGEMM's default 1e-8).
        initial_accumulator_value: starting value of every row's accumulator.
    """

    lr: float = 0.01
    eps: float = 1e-8
    initial_accumulator_value: float = 0.0
    name = "rowwise_adagrad"

    def __post_init__(self) -> None:
        _check("RowWiseAdagrad", self.lr, self.eps, self.initial_accumulator_value)

    def state_spec(self, dim: int) -> dict[str, tuple[tuple[int, ...], float]]:
        return {"sum": ((), self.initial_accumulator_value)}

    def update(self, weight: Tensor, state: dict[str, Tensor], grad: Tensor) -> None:
        acc = state["sum"]  # (u,)
        acc.add_(grad.pow(2).mean(dim=1))  # one reduction over D per row
        scale = acc.sqrt().add_(self.eps).reciprocal_().mul_(self.lr)  # (u,)  lr / (sqrt(m) + eps)
        weight.sub_(grad * scale.unsqueeze(1))  # (u, D)

    def config(self) -> dict:
        return {"name": self.name, **asdict(self)}


OPTIMIZERS: dict[str, type[RowOptimizer]] = {"sgd": SGD, "adagrad": Adagrad, "rowwise_adagrad": RowWiseAdagrad}


def make_optimizer(config: dict | RowOptimizer) -> RowOptimizer:
    """An optimizer from ``{"name": "sgd" | "adagrad" | "rowwise_adagrad", **hyperparameters}`` (or itself)."""
    if isinstance(config, RowOptimizer):
        return config
    kwargs = dict(config)
    name = kwargs.pop("name", None)
    if name not in OPTIMIZERS:
        raise ConfigError(f"optimizer name must be one of {sorted(OPTIMIZERS)}, got {name!r}", field="optimizer")
    try:
        return OPTIMIZERS[name](**kwargs)
    except TypeError as err:
        raise ConfigError(f"optimizer {name!r}: {err}", field="optimizer") from None
