"""``BatchedTables``: many tables' rows laid end to end, one lookup and one fused update for all of them.

FBGEMM's table-batched embedding (TBE, what TorchRec runs) in torch ops::

    table t's row i  ->  row offsets[t] + i of one array set      weight (R + 1, D), state (R + 1, ...)
                                                                   row R: a spare row no id names ("pad")
    lookup(ids, lengths, tables)      ids (nnz,) local to their bag's table, lengths (n,) and tables (n,) per bag
        rows, uniq, inverse = table_unique(ids, lengths, tables, offsets, pad=R), one op for:
          rows  = ids + offsets[tables of their bags]              (nnz,)
          uniq, inverse = padded_unique(rows, pad=R)               (nnz,) distinct rows, then R; (nnz,)
        w     = weight[uniq]                                       (nnz, D) leaf: the rows' gradients sum here
        out   = embedding_bag(inverse, w, bag offsets, "sum")      (n, D)
    step()                            the optimizer on the nnz rows of uniq at once (the pad rows' gradient
                                      is zero, which leaves row R as it is under SGD and both Adagrads)

Every shape in a step is fixed by nnz and n, never by a count read from the data, so nothing in a step waits
for the device to tell the host a number (the distinct-row count stays on the device: ``padded_unique``
pads instead of trimming), and the op count is the same for 2 tables or 200.

Exactness: a row's gradient sums its occurrences in the order they come (``embedding_bag``'s backward),
as the per-table ``CachedEmbeddingBag`` does for the same ids, and the row optimizer is the same arithmetic
(``optim.py``), so a model on ``BatchedTables`` trains the floats of one on a ``MemoryStore`` per table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from haloflow.cache.memory import check_state_dict
from haloflow.cache.types import RowOptimizer
from haloflow.errors import ConfigError
from haloflow.kernels.bag_grads import bag_row_grads
from haloflow.kernels.unique import padded_unique  # re-exported: the distinct rows of a batch, padded
from haloflow.kernels.unique import table_rows, table_unique

__all__ = ["BatchedTables", "TableRows", "padded_unique", "pooled_sum"]


class _PooledSum(torch.autograd.Function):
    """Forward: ``embedding_bag`` sums. Backward: each row's gradient summed over its occurrences in the order
    they come (``kernels.bag_grads``), not in the order of ``embedding_bag``'s backward, whose unstable sort
    orders a row's occurrences by the whole index array: the same bag would get other bits beside other
    tables. Shapes: rows (u, D), inverse (nnz,) in [0, u), offsets (n+1,) -> (n, D)."""

    @staticmethod
    def forward(ctx, rows: Tensor, inverse: Tensor, offsets: Tensor, lengths: Tensor) -> Tensor:
        ctx.save_for_backward(inverse, lengths)
        ctx.num_rows = rows.shape[0]
        return F.embedding_bag(inverse, rows, offsets, mode="sum", include_last_offset=True)

    @staticmethod
    def backward(ctx, grad: Tensor):
        inverse, lengths = ctx.saved_tensors
        return bag_row_grads(grad, inverse, lengths, ctx.num_rows), None, None, None


class _TableBags(torch.autograd.Function):
    """Forward: ``embedding_bag`` of the table itself. Backward: the rows' gradient summed per distinct row in
    order (``_PooledSum``'s), put in ``holder`` for the update; the table gets none (``anchor``, an empty leaf
    that requires grad, is what makes autograd call this backward)."""

    @staticmethod
    def forward(ctx, anchor: Tensor, weight: Tensor, rows: Tensor, offsets: Tensor, lengths: Tensor,
                inverse: Tensor, holder: list) -> Tensor:
        ctx.save_for_backward(inverse, lengths)
        ctx.holder = holder
        return F.embedding_bag(rows, weight, offsets, mode="sum", include_last_offset=True)

    @staticmethod
    def backward(ctx, grad: Tensor):
        inverse, lengths = ctx.saved_tensors
        ctx.holder.append(bag_row_grads(grad, inverse, lengths, inverse.numel()))  # (u, D), for ``BatchedTables.step``
        return None, None, None, None, None, None, None


def pooled_sum(rows: Tensor, inverse: Tensor, offsets: Tensor, lengths: Tensor | None = None) -> Tensor:
    """Bag j = the sum of ``rows[inverse[offsets[j]:offsets[j+1]]]``; a row's gradient sums its occurrences in
    order. ``lengths``: ``offsets.diff()``, when the caller has it. Shapes: rows (u, D), inverse (nnz,),
    offsets (n+1,), lengths (n,) -> (n, D)."""
    return _PooledSum.apply(rows, inverse, offsets, offsets.diff() if lengths is None else lengths)


class BatchedTables:
    """The rows of ``len(sizes)`` tables of one width, end to end, with the row optimizer fused.

    Args:
        sizes: each table's rows n_t.
        dim: the width D of every table.
        optimizer: the row optimizer of every table (``SGD``, ``Adagrad``, ``RowWiseAdagrad``).
        init: ``init(t)`` -> table t's initial rows (n_t, D), called once per table (None: zeros).
        device, dtype: where the rows live, and their floating type.
        names: the tables' names in errors (default ``t0``, ``t1``, ...).

    Shapes:
        lookup: ids (nnz,), lengths (n,), tables (n,) -> (n, D)
    """

    def __init__(self, sizes: Sequence[int], dim: int, optimizer: RowOptimizer, *,
                 init: Callable[[int], Tensor] | None = None, device=None, dtype: torch.dtype = torch.float32,
                 names: Sequence[str] | None = None):
        if not sizes or min(sizes) < 1 or dim < 1:
            raise ConfigError(f"BatchedTables needs tables of >= 1 row and a width >= 1; got rows {list(sizes)}, "
                              f"width {dim}", field="sizes")
        self.optimizer, self.dim = optimizer, int(dim)
        self.device = torch.device(device if device is not None else "cpu")
        self.names = list(names) if names is not None else [f"t{t}" for t in range(len(sizes))]
        self.offsets = [0]
        for n in sizes:
            self.offsets.append(self.offsets[-1] + int(n))
        self.num_rows = self.offsets[-1]  # R; row R is the pad row
        weight = torch.zeros(self.num_rows + 1, self.dim, dtype=dtype, device=self.device)
        if init is not None:  # one table at a time: each initial block is freed once copied in
            for t in range(len(sizes)):
                block = init(t)
                if tuple(block.shape) != (int(sizes[t]), self.dim):
                    raise ConfigError(f"table {self.names[t]!r}: initial rows of shape {tuple(block.shape)}, "
                                      f"expected ({int(sizes[t])}, {self.dim})", field="init")
                weight[self.offsets[t]:self.offsets[t + 1]].copy_(block)
        self.arrays: dict[str, Tensor] = {"weight": weight}
        for k, (shape, value) in optimizer.state_spec(self.dim).items():
            self.arrays[k] = torch.full((self.num_rows + 1, *shape), value, dtype=dtype, device=self.device)
        self.row_offsets = torch.tensor(self.offsets[:-1], dtype=torch.int64, device=self.device)  # (T,)
        self._pending: list[tuple[Tensor, list]] = []  # (uniq, [its gradient, once backward ran]) of lookups
        self._anchor = torch.zeros(0, device=self.device, requires_grad=True)

    @classmethod
    def from_weights(cls, weights: Sequence[Tensor], optimizer: RowOptimizer, **kwargs) -> BatchedTables:
        """Tables holding copies of ``weights`` (each (n_t, D)), on the first one's device unless given."""
        kwargs.setdefault("device", weights[0].device)
        kwargs.setdefault("dtype", weights[0].dtype)
        return cls([int(w.shape[0]) for w in weights], int(weights[0].shape[1]), optimizer,
                   init=lambda t: weights[t], **kwargs)

    @property
    def num_tables(self) -> int:
        return len(self.offsets) - 1

    def table(self, t: int) -> TableRows:
        """Table ``t`` as a ``RowStore`` (views of its rows: checkpoints read and load it through this)."""
        return TableRows(self, t)

    def lookup(self, ids: Tensor, lengths: Tensor, tables: Tensor, *, train: bool) -> Tensor:
        """Sum-pooled bags: bag j sums ``lengths[j]`` ids (in order) of table ``tables[j]``.

        ``train``: keep the rows for ``step`` (their gradient arrives by backward). Ids are not checked here
        (a check needs the host): ``ShardedEmbeddingCollection`` checks them against the tables' rows.
        """
        dev = self.device
        ids, lengths, tables = ids.to(dev), lengths.to(dev), tables.to(dev)
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=dev)
        torch.cumsum(lengths, 0, out=offsets[1:])
        weight = self.arrays["weight"]
        if not train:  # (nnz,) rows of the end-to-end tables, pooled into (n, D)
            rows = table_rows(ids, lengths, tables, self.row_offsets)
            return F.embedding_bag(rows, weight, offsets, mode="sum", include_last_offset=True)
        # the rows, their distinct values padded with R and each row's place among them, (nnz,) each
        rows, uniq, inverse = table_unique(ids, lengths, tables, self.row_offsets, self.num_rows)
        # the distinct rows' gradient (u, D) arrives in ``grad`` by backward: the same sums as ``pooled_sum``'s
        # gradient of gathered rows, without gathering them (the bags read the table itself)
        holder: list[Tensor] = []
        self._pending.append((uniq, holder))
        return _TableBags.apply(self._anchor, weight, rows, offsets, lengths, inverse, holder)  # (n, D)

    def step(self) -> None:
        """The row optimizer on every pending lookup's rows (after backward); lookups without a gradient skip."""
        pending, self._pending = self._pending, []
        for uniq, holder in pending:
            if holder:
                self.optimizer.apply_rows(self.arrays, uniq, holder[0])

    def state_dict(self) -> dict[str, Tensor]:
        """Every table's rows end to end (the pad row left out), shared: clone to snapshot."""
        return {k: a[:self.num_rows] for k, a in self.arrays.items()}

    def flush(self) -> None:
        """Make ``arrays`` hold every row (a cache writes its dirty rows back); nothing to do here."""

    def load_rows(self, lo: int, hi: int, state: dict[str, Tensor]) -> None:
        """Replace rows lo..hi-1 and their optimizer state."""
        for k, a in self.arrays.items():
            a[lo:hi].copy_(state[k])

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() for a in self.arrays.values())


class TableRows:
    """One table of a ``BatchedTables`` seen as a ``RowStore``: its rows' views, its name and size."""

    def __init__(self, batch: BatchedTables, t: int):
        self.batch, self.index = batch, t
        self.name, self.dim, self.device = batch.names[t], batch.dim, batch.device
        self.optimizer = batch.optimizer
        self._lo, self._hi = batch.offsets[t], batch.offsets[t + 1]
        self.num_rows = self._hi - self._lo

    def _ids(self, ids: Tensor) -> Tensor:
        return ids.to(self.device) + self._lo

    def gather(self, ids: Tensor) -> Tensor:
        self.batch.flush()
        arrays = self.batch.arrays
        return arrays["weight"].index_select(0, self._ids(ids).to(arrays["weight"].device)).to(self.device)  # (n, D)

    def apply_gradients(self, ids: Tensor, grads: Tensor) -> None:
        """The row optimizer on rows ``ids`` of this table (outside the batch's own lookups and steps)."""
        self.batch.flush()
        arrays = self.batch.arrays
        dev = arrays["weight"].device
        self.optimizer.apply_rows(arrays, self._ids(ids).to(dev), grads.to(dev))
        self.batch.load_rows(self._lo, self._lo, {k: a[:0] for k, a in arrays.items()})  # a cache starts over

    def flush(self) -> None:
        self.batch.flush()

    def state_dict(self) -> dict[str, Tensor]:
        """This table's arrays (views of the batch's, shared: clone to snapshot), a cache flushed first."""
        self.batch.flush()
        return {k: a[self._lo:self._hi] for k, a in self.batch.arrays.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        mine = self.state_dict()
        check_state_dict(self.name, state, {k: tuple(a.shape) for k, a in mine.items()})
        self.batch.load_rows(self._lo, self._hi, state)

    def close(self) -> None:
        pass
