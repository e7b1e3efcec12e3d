"""What an op is, once: its stock torch formula (the oracle) and the bodies registered beside it.

::

    Op("keyed_dropout", stock=..., cpu=..., gpu=..., bitwise={"cpu", "gpu"}, custom_op=torch.ops.haloflow...)
        stock   torch ops only: runs on any device, and is what every other body is tested against
        cpu     a compiled CPU body (numba), or None
        gpu     a GPU body (Triton), or None: the stock formula then runs on the GPU
        bitwise the bodies that equal the stock formula bit for bit (the others: to a stated tolerance)

A custom op (``torch.library.custom_op``) has torch pick the body by the inputs' device; a table op (``pick``)
is a dict lookup, for the per-table paths where the custom op's dispatch (~10 us a call on this CPU, against
~1 us) would be paid 26 times a step.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["Op", "OPS", "register", "pick", "triton_available"]


@dataclass(frozen=True)
class Op:
    name: str
    stock: Callable
    cpu: Callable | None = None
    gpu: Callable | None = None
    bitwise: frozenset[str] = field(default_factory=frozenset)  # bodies equal to stock bit for bit
    custom_op: object | None = None  # the torch.library op (``torch.ops.haloflow.<name>``), when it is one
    doc: str = ""  # one line for the table in kernels/__init__.py

    def body(self, device: torch.device) -> Callable:
        """The body that runs on ``device`` (a table op's dispatch; a custom op's is torch's)."""
        chosen = {"cpu": self.cpu, "cuda": self.gpu}.get(device.type)
        return chosen if chosen is not None else self.stock


OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Add ``op`` to the table (`OPS`, what ``tests/kernels/test_ops.py`` walks)."""
    if op.name in OPS:
        raise ValueError(f"kernel {op.name!r} is registered twice")
    OPS[op.name] = op
    return op


def pick(op: Op, like: torch.Tensor) -> Callable:
    """The body of a table op for tensors on ``like``'s device."""
    return op.body(like.device)


def triton_available() -> bool:
    """Whether Triton can be imported (the GPU bodies; on a CPU-only machine the tests run them interpreted)."""
    return importlib.util.find_spec("triton") is not None
