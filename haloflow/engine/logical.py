"""V logical workers on K physical ranks: what makes a run's floats independent of K (EasyScale's guarantee).

A run is defined by V, the number of *logical workers*; K ranks (any K with V / K a power of two) each host
V / K of them, contiguous::

    V = 4 logical workers     w0  w1  w2  w3        each: its own slice of every batch (or its partition part)
    K = 1                     [w0  w1  w2  w3]      rank 0
    K = 2                     [w0  w1] [w2  w3]     ranks 0, 1
    K = 4                     [w0] [w1] [w2] [w3]   ranks 0..3

Every logical worker computes on its own, in the same shapes whatever K (a float sum depends on the shapes a
kernel sees: a GEMM gives one row different bits at M = 3 and M = 128 rows), and every sum over workers uses one
fixed tree, the pairwise tree over w0 .. w_{V-1}::

    tree_sum([g0, g1, g2, g3]) = (g0 + g1) + (g2 + g3)

Because each rank's workers are a contiguous power-of-two block, its local tree is a whole subtree: a rank sums
its own workers (``tree_sum`` over V / K partials), then the ranks' partials are summed by the same pairwise
tree over K (``grad_sync``'s reduce-scatter owner does it), and the result is the V-tree, bit for bit, at any K.

``fanout(params, n)`` gives each of a rank's n workers its own alias of every weight; autograd then hands all n
gradients of a weight to one backward, which sums them by ``tree_sum`` (not in the order the graph happens to
run), and ``sliced(module, xs)`` runs a module once per worker's input through those aliases.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

from haloflow.errors import ConfigError

__all__ = ["LogicalWorkers", "tree_sum", "fanout", "sliced", "sliced_mlp", "rank_tree_sum"]


def tree_sum(parts: Sequence[Tensor]) -> Tensor:
    """The pairwise tree sum of ``parts`` (adjacent pairs, level by level; an odd last one moves up a level).

    [a, b, c, d, e] -> [a+b, c+d, e] -> [(a+b)+(c+d), e] -> ((a+b)+(c+d))+e. A new tensor (never an alias)."""
    if not parts:
        raise ValueError("tree_sum of nothing")
    level = list(parts)
    if len(level) == 1:
        return level[0].clone()
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


class LogicalWorkers:
    """V logical workers hosted by K ranks: which this rank holds, and how a batch is cut among them.

    Raises ``ConfigError`` (the arithmetic shown) unless K divides V with V / K a power of two: only then is a
    rank's share of the V-tree a whole subtree (see the module docstring).
    """

    def __init__(self, v: int, k: int, rank: int, *, what: str = "--logical-workers"):
        if v < 1:
            raise ConfigError(f"{what} must be >= 1, got {v}", field="logical_workers")
        per = v // k if k > 0 else 0
        if k < 1 or v % k or per & (per - 1):
            raise ConfigError(f"{what} {v} on {k} ranks: expected a number of ranks that divides it with a power of "
                              f"two per rank (V / K = {v} / {k}; for V = {v}: --nproc in "
                              f"{[d for d in range(1, v + 1) if v % d == 0 and not (v // d) & (v // d - 1)]})",
                              field="logical_workers")
        self.v, self.k, self.rank, self.per_rank = v, k, rank, per

    @property
    def mine(self) -> range:
        """The logical workers this rank hosts (contiguous)."""
        return range(self.rank * self.per_rank, (self.rank + 1) * self.per_rank)

    def owner(self, worker: int) -> int:
        """The rank that hosts ``worker``."""
        return worker // self.per_rank

    def cut(self, n: int) -> list[int]:
        """Sizes of the V slices of ``n`` samples (the first ``n % V`` get one more): they depend on V only."""
        q, r = divmod(n, self.v)
        return [q + (w < r) for w in range(self.v)]

    def rank_sizes(self, n: int) -> list[int]:
        """Samples of a batch of ``n`` each rank holds: the sums of its workers' slices."""
        cut = self.cut(n)
        return [sum(cut[r * self.per_rank:(r + 1) * self.per_rank]) for r in range(self.k)]

    def my_slices(self, n: int) -> list[int]:
        """Sizes of this rank's workers' slices of a batch of ``n`` (a rank's rows, in worker order)."""
        return [self.cut(n)[w] for w in self.mine]

    def describe(self) -> str:
        return f"V = {self.v} logical workers on K = {self.k} ranks ({self.per_rank} each)"


class _Fanout(torch.autograd.Function):
    """n aliases of each weight; backward sums each weight's n gradients by ``tree_sum`` (slot order)."""

    @staticmethod
    def forward(ctx, n: int, *params: Tensor):
        ctx.n, ctx.m = n, len(params)
        return tuple(p.view_as(p) for _ in range(n) for p in params)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        n, m = ctx.n, ctx.m
        out = []
        for j in range(m):
            gs = [grads[i * m + j] for i in range(n)]
            present = [g for g in gs if g is not None]
            if not present:
                out.append(None)
                continue
            out.append(tree_sum([g if g is not None else torch.zeros_like(present[0]) for g in gs]))
        return (None, *out)


def fanout(params: Sequence[Tensor], n: int) -> list[tuple[Tensor, ...]]:
    """For each of ``n`` workers, its own aliases of ``params`` (in order): ``out[w][j]`` is ``params[j]``.

    The gradient ``params[j]`` receives is ``tree_sum`` of the n workers' gradients, in worker order. With
    ``n == 1`` the parameters themselves (nothing added to the graph)."""
    params = list(params)
    if n == 1:
        return [tuple(params)]
    flat = _Fanout.apply(n, *params)
    m = len(params)
    return [tuple(flat[i * m:(i + 1) * m]) for i in range(n)]


def sliced(module: nn.Module, inputs: Sequence[tuple[Tensor, ...]]) -> list:
    """``module(*inputs[w])`` for every worker w, each through its own aliases of the module's weights, so that a
    weight's gradient is the tree sum of the workers' gradients (see ``fanout``). One worker: a plain call."""
    if len(inputs) == 1:
        return [module(*inputs[0])]
    names = [name for name, p in module.named_parameters() if p.requires_grad]
    if not torch.is_grad_enabled() or not names:
        return [module(*x) for x in inputs]
    params = [module.get_parameter(name) for name in names]
    aliases = fanout(params, len(inputs))
    return [functional_call(module, dict(zip(names, a)), x, strict=False) for a, x in zip(aliases, inputs)]


def rank_tree_sum(x: Tensor, group) -> Tensor:
    """The sum of every rank's ``x`` (same shape everywhere) by the pairwise tree over ranks, the same bits on
    every rank: an all-gather, then ``tree_sum`` (an all-reduce adds in an order of the backend's choosing).
    ``group=None``: ``x`` itself. Waits for every rank."""
    if group is None:
        return x
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return tree_sum(parts)


# ---------------------------------------------------------------------------------------------- the MLP path
_ROWS_AGREE: dict[tuple, bool] = {}


def _rows_agree(x: Tensor, weight: Tensor, slices: tuple[int, ...]) -> bool:
    """Whether one GEMM over all of ``x``'s rows gives every row the bits that a GEMM over its slice alone gives,
    in this process (its BLAS, thread count and these shapes), forward (``x W^T + b``) and backward (``dY W``).

    A BLAS picks its kernel and blocking by the shapes, not the values, so random values of the same shapes
    answer it; measured once per shape and cached. On a 2-core AMD EPYC with MKL: yes for every DLRM layer at
    slices of 32 rows and M up to 4,096; no for slices of 5, 7, 33 rows (tails of the kernel's row blocks)."""
    key = (tuple(x.shape), tuple(weight.shape), slices, x.dtype, x.device.type, torch.get_num_threads())
    if key not in _ROWS_AGREE:
        g = torch.Generator(device="cpu").manual_seed(0)
        xs = torch.randn(x.shape, generator=g, dtype=x.dtype).to(x.device)
        w = torch.randn(weight.shape, generator=g, dtype=x.dtype).to(x.device)
        dy = torch.randn(x.shape[0], weight.shape[0], generator=g, dtype=x.dtype).to(x.device)
        whole_f, whole_b = xs @ w.t(), dy @ w
        part_f = torch.cat([a @ w.t() for a in xs.split(list(slices))])
        part_b = torch.cat([a @ w for a in dy.split(list(slices))])
        _ROWS_AGREE[key] = bool(torch.equal(whole_f, part_f) and torch.equal(whole_b, part_b))
    return _ROWS_AGREE[key]


class _SlicedLinear(torch.autograd.Function):
    """``x W^T + b`` over a rank's logical workers' rows, the weight gradient the tree over the workers.

    Forward and the input gradient run as one GEMM over all rows when that gives each row its slice's bits
    (``_rows_agree``), else one GEMM per slice; the weight and bias gradients always per slice (a sum over the
    slice's rows, in its shape), then ``tree_sum``::

        dW = tree_sum([dY_v^T X_v for each slice v])     db = tree_sum([dY_v.sum(0) ...])
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, slices: tuple[int, ...], whole: bool):
        ctx.save_for_backward(x, weight)
        ctx.slices, ctx.whole, ctx.has_bias = slices, whole, bias is not None
        if whole:
            return torch.nn.functional.linear(x, weight, bias)
        return torch.cat([torch.nn.functional.linear(a, weight, bias) for a in x.split(list(slices))])

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight = ctx.saved_tensors
        slices = list(ctx.slices)
        dx = dw = db = None
        if len(slices) == 1:  # one worker: its sums whole (the bits tree_sum of one part gives)
            dx = dy @ weight if ctx.needs_input_grad[0] else None
            dw = dy.t() @ x if ctx.needs_input_grad[1] else None
            db = dy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
            return dx, dw, db, None, None
        dys = dy.split(slices)
        if ctx.needs_input_grad[0]:
            dx = dy @ weight if ctx.whole else torch.cat([d @ weight for d in dys])
        if ctx.needs_input_grad[1]:
            dw = tree_sum([d.t() @ a for d, a in zip(dys, x.split(slices))])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = tree_sum([d.sum(0) for d in dys])
        return dx, dw, db, None, None


def sliced_mlp(mlp: nn.Sequential, x: Tensor, slices: Sequence[int]) -> Tensor:
    """``mlp(x)`` for a rank's logical workers' rows of ``x`` (``slices``: their row counts, in order), each
    ``nn.Linear`` through ``_SlicedLinear`` (weight gradients the tree over the workers), other layers (ReLU and
    the like: row by row) as they are. The same bits for a worker's rows whatever K hosts it."""
    slices = tuple(int(b) for b in slices)  # one slice too: the same ops whatever K hosts it
    for layer in mlp:
        if isinstance(layer, nn.Linear):
            whole = _rows_agree(x, layer.weight, slices)
            x = _SlicedLinear.apply(x, layer.weight, layer.bias, slices, whole)
        else:
            x = layer(x)
    return x
