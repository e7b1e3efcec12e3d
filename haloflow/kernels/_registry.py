"""What an op is, once: its stock torch formula (the oracle) and the bodies registered beside it.

::

    Op("keyed_dropout", stock=..., cpu=..., gpu=..., bitwise={"cpu", "gpu"}, custom_op=torch.ops.haloflow...)
        stock   torch ops only: runs on any device, and is what every other body is tested against
        cpu     a compiled CPU body (numba), or None
        gpu     a GPU body (Triton), or None: the stock formula then runs on the GPU
        bitwise the bodies that equal the stock formula bit for bit (the others: to a stated tolerance)

A custom op (``torch.library.custom_op``) has torch pick the body by the inputs' device; that is the op's
declaration (what ``opcheck``, ``torch.compile`` and ``torch.export`` see). Eager calls take a shorter road to the
same bodies: `eager` wraps an op's body (picked from this table by the inputs' device), its ``setup_context`` and
its ``backward`` in one ``torch.autograd.Function``, and `call` runs a body straight from the table. Measured on
the 2-core AMD VM (2026-12-06): a call through the custom op's dispatcher took 62-72 us against 36 us through an
``autograd.Function`` (and 28 us for the body alone), which made a TGN batch (9 such calls) 6 % slower; and torch
guards a custom op's device kernels against torch.compile by importing ``torch._dynamo`` on the first call (~1.7 s
of CPU in a process that has not). A table op (`call` alone) has no custom op at all: the per-table writes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

__all__ = ["Op", "OPS", "register", "declare", "call", "eager", "rows2d", "triton_available"]


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
        kind = device.type
        chosen = self.cpu if kind == "cpu" else self.gpu if kind == "cuda" else None
        return chosen if chosen is not None else self.stock


OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Add ``op`` to the table (`OPS`, what ``tests/kernels/test_ops.py`` walks)."""
    if op.name in OPS:
        raise ValueError(f"kernel {op.name!r} is registered twice")
    OPS[op.name] = op
    return op


def declare(name: str, stock: Callable, cpu: Callable, fake: Callable, *, doc: str,
            mutates_args: tuple[str, ...] = (), bitwise: frozenset[str] = frozenset({"cpu"})) -> Op:
    """An op without a backward in one call: the custom op ``haloflow::<name>`` whose body on any device is
    ``stock`` (its annotations give the schema), with ``cpu`` registered for the CPU and ``fake`` for tracing
    (``fake(*args)``: outputs of the right shapes, or None); then its row in the table."""
    custom = torch.library.custom_op(f"haloflow::{name}", mutates_args=mutates_args)(stock)
    custom.register_kernel("cpu")(cpu)
    custom.register_fake(fake)
    return register(Op(name, stock=stock, cpu=cpu, bitwise=bitwise, custom_op=getattr(torch.ops.haloflow, name),
                       doc=doc))


def triton_available() -> bool:
    """Whether Triton can be imported (the GPU bodies; on a CPU-only machine the tests run them interpreted)."""
    return importlib.util.find_spec("triton") is not None


def _device(args) -> torch.device:
    """The device of the first tensor among ``args`` (a list or tuple of tensors counts by its first)."""
    for a in args:
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            a = a[0]
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def _tracing(args) -> bool:
    """Whether the call is being traced (``torch.compile``, ``make_fx``, fake or functional tensors): then only the
    custom op may run, since the compiled bodies read real memory."""
    if _current_dispatch_mode() is not None or torch.compiler.is_compiling():
        return True
    for a in args:  # (called per op: plain tensors, the common case, are told by their type alone)
        kind = type(a)
        if kind is not torch.Tensor and kind is not torch.nn.Parameter and isinstance(a, torch.Tensor) \
                and kind.__torch_dispatch__ is not _PLAIN_DISPATCH:
            return True
    return False


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


_COMPILED_FLOATS = (torch.float32, torch.float64)  # what the numba bodies are compiled for


def _compiled_can_take(args) -> bool:
    """Whether a compiled CPU body can take ``args``: no floating type but float32 and float64 (numba has no half
    types). Otherwise the stock formula runs."""
    for a in args:
        if isinstance(a, (list, tuple)):
            if not _compiled_can_take(a):
                return False
        elif isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype not in _COMPILED_FLOATS:
            return False
    return True


def rows2d(t: torch.Tensor):
    """``t``'s memory as a (rows, columns) NumPy array, a view (a compiled body's writes reach ``t``): ``t`` must be
    contiguous, else the reshape would be a copy and the writes lost."""
    if not t.is_contiguous():
        raise ValueError(f"a compiled body needs contiguous rows, got a tensor of shape {tuple(t.shape)} with "
                         f"strides {t.stride()}")
    cols = 1
    for n in t.shape[1:]:
        cols *= int(n)
    return t.numpy().reshape(t.shape[0], cols)


def call(op: Op, *args):
    """``op``'s body for the arguments' device, from the table; through its custom op while traced (so that a
    traced graph holds ``torch.ops.haloflow.<op>``); the stock formula where a compiled body cannot take the
    arguments (``_compiled_can_take``)."""
    if op.custom_op is not None and _tracing(args):
        return op.custom_op(*args)
    body = op.body(_device(args))
    if body is op.cpu and not _compiled_can_take(args):
        return op.stock(*args)
    return body(*args)


def eager(op: Op, setup_context: Callable, backward: Callable) -> Callable:
    """The eager front of a custom op with a backward: the body from the table, and the very ``setup_context`` and
    ``backward`` functions registered with the custom op, in one ``torch.autograd.Function`` (see the module
    docstring for why). While ``torch.compile`` traces, the custom op itself."""

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(*args):
            body = op.body(_device(args))
            if body is not op.stock:  # a compiled body reads .numpy(), which a tensor that requires grad refuses
                args = tuple(a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args)
            return body(*args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            setup_context(ctx, inputs, output)

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    Eager.__name__ = Eager.__qualname__ = f"Eager_{op.name}"

    def apply(*args):
        if _tracing(args):
            return op.custom_op(*args)
        return Eager.apply(*args)

    return apply
