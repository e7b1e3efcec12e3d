"""``MemoryStore``: the whole table and its optimizer state in one place (today's plain in-memory table).

::

    device memory
      weight (N, D)     every row
      sum    (N, D)     Adagrad state (or (N,) for row-wise Adagrad, nothing for SGD)

It is the oracle of the cache: a `CachedStore` of any size trains to exactly the weights a `MemoryStore` reaches
with the same optimizer and batches.
"""

from __future__ import annotations

import torch
from torch import Tensor

from haloflow.cache.types import RowOptimizer
from haloflow.errors import ConfigError

__all__ = ["MemoryStore", "check_state_dict"]


def check_state_dict(name: str, state: dict[str, Tensor], expected: dict[str, tuple[int, ...]]) -> None:
    """Raise ``ConfigError`` unless ``state`` has exactly the arrays (and shapes) of ``expected``."""
    if set(state) != set(expected):
        raise ConfigError(f"table {name!r}: state_dict has arrays {sorted(state)}, expected {sorted(expected)}")
    for k, shape in expected.items():
        if tuple(state[k].shape) != shape:
            raise ConfigError(f"table {name!r}: state_dict[{k!r}] has shape {tuple(state[k].shape)}, expected {shape}")


class MemoryStore:
    """A table of ``weight.shape`` rows held whole on ``weight.device``, updated by ``optimizer``.

    Args:
        weight: initial weights (N, D); the store keeps this tensor (no copy) and updates it in place.
        optimizer: the row optimizer (`SGD`, `Adagrad`, `RowWiseAdagrad`).
        name: the table's name, used in error messages.

    Shapes:
        gather: ids (n,) -> (n, D); apply_gradients: ids (u,) distinct, grads (u, D)
    """

    def __init__(self, weight: Tensor, optimizer: RowOptimizer, *, name: str = "table"):
        if weight.dim() != 2:
            raise ConfigError(f"table {name!r}: weight must be (rows, dim), got shape {tuple(weight.shape)}")
        self.name, self.optimizer = name, optimizer
        self.num_rows, self.dim = int(weight.shape[0]), int(weight.shape[1])
        self.device = weight.device
        self.arrays: dict[str, Tensor] = {"weight": weight.detach()}
        for k, (shape, init) in optimizer.state_spec(self.dim).items():
            self.arrays[k] = torch.full((self.num_rows, *shape), init, dtype=weight.dtype, device=weight.device)

    def gather(self, ids: Tensor) -> Tensor:
        return self.arrays["weight"].index_select(0, ids.to(self.device))  # (n, D)

    def apply_gradients(self, ids: Tensor, grads: Tensor) -> None:
        self.optimizer.apply_rows(self.arrays, ids.to(self.device), grads.to(self.device))

    def flush(self) -> None:
        pass

    def state_dict(self) -> dict[str, Tensor]:
        """The arrays themselves (shared, as ``nn.Module.state_dict`` shares parameters): clone to snapshot."""
        return dict(self.arrays)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        check_state_dict(self.name, state, {k: tuple(a.shape) for k, a in self.arrays.items()})
        for k, a in self.arrays.items():
            a.copy_(state[k])

    def close(self) -> None:
        pass
