"""Every hot op, declared once: its stock torch formula (the oracle, and the body any device can run), a compiled
CPU body and a GPU body registered beside it. The models call these ops and read as math (``haloflow/models``).

::

    op                 stock formula (any device)          CPU body               GPU body      declared as
    spmm               torch.sparse.mm, A^T built once      numba rows (opt-in)    stock         haloflow::spmm
    keyed_dropout      int64 splitmix64 torch ops           numba, one pass        Triton        haloflow::keyed_dropout
      masked_scale     g * mask * scale                     numba                  stock         haloflow::masked_scale
    cos_encode         addcmul, cos, sin                    numba Cody-Waite       stock         haloflow::cos_encode
    attend             einsum, softmax, bmm                 numba, one pass        stock         haloflow::attend
    gru_gates          sigmoid, tanh, lerp                  tail-free sigmoid      stock         haloflow::gru_gates
    interaction        bmm, index_select                    -                      stock         haloflow::interaction
    sgd_rows / _tables index_add_                           numba per occurrence   stock         table op
    write_newest       argsort, indexed writes              numba row copies       stock         table op
    keyed_uniform      int64 splitmix64 torch ops           numba                  -             table op
    cache_plan         gathers, stable sort, indexed writes numba, np.partition    stock         haloflow::cache_plan
      cache_announce   indexed writes into a ring           numba                  stock         haloflow::cache_announce
      cache_gather     two index_select, where              numba row copies       stock         haloflow::cache_gather
      cache_scatter    index_copy_ per array, index_fill_   numba row copies       stock         haloflow::cache_scatter
    padded_unique      stable sort, cumsum, scatter         np.sort of packed keys stock         haloflow::padded_unique
      table_rows       index_select, repeat_interleave      numba, one pass        stock         haloflow::table_rows
      table_unique     table_rows, then padded_unique       rows + keys in a pass  stock         haloflow::table_unique
    bag_row_grads      repeat_interleave, index_add_        numba, in order        stock         haloflow::bag_row_grads
    sgd_update         index_select, add_, index_copy_      numba fma, in place    stock         haloflow::sgd_update
    (each differentiable ``haloflow::<op>`` has a ``<op>_backward`` op beside it, with the same bodies; the cache
    and table ops above need none)

A custom op (``torch.library.custom_op``) lets torch pick the body by the inputs' device and carries its own
backward; ``torch.library.opcheck`` tests it. A table op (``_registry.call``: a dict lookup by device) is for the
per-table and per-batch writes, where a custom op's dispatch would cost more than the work: measured here, a call
through ``custom_op`` with autograd took ~24 us against ~14 us for an ``autograd.Function`` and ~6 us for the op
alone (2-core Xeon, torch 2.13).

Adding an op: one file here (its ``stock``, its bodies, its ``register(Op(...))``) and one row in
``tests/kernels/test_ops.py`` (inputs, and which bodies claim the stock formula's bits). Callers import an op from
its file (``from haloflow.kernels.attend import attend``); this package's ``__init__`` imports no torch. Bodies that only
compile where their library is (Triton) are registered when it imports; the tests run the Triton bodies in its
interpreter (``TRITON_INTERPRET=1``) on CPU tensors.
"""

import importlib
import pkgutil

__all__ = ["SPMM_KERNELS", "DEFAULT_SPMM_KERNEL", "registry"]

# The bodies ``haloflow::spmm`` can run on the CPU (``--kernel``): named here, where no torch is imported, so that
# the trainers' configs check a command line before any process starts. "torch" was faster at every GCN width in
# the 2026-12-02 runs (kernels/spmm.py).
SPMM_KERNELS = ("numba", "torch")
DEFAULT_SPMM_KERNEL = "torch"


def registry() -> dict:
    """Every op of this package by name (``_registry.Op``): imports each op file (a module here whose name does
    not start with ``_``), which registers its ops."""
    from haloflow.kernels._registry import OPS

    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    return OPS
