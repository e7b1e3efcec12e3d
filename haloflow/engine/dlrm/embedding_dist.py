"""Collectives of the sharded embedding engine: input dist, output dist and table-gradient sync, all async.

Every function here starts its communication and returns a handle at once; ``handle.wait()`` is called as
late as possible (TorchRec's awaitables). Every rank of the group must call the same functions in the same
order, even a rank that sends and receives nothing.

Input dist: route jagged ids to the ranks that hold their shards (ids carry no gradient)::

    rank s, local batch B_s                          rank d receives from every source s, in rank order
    lengths for d  (n_d, B_s)  ---all-to-all 1--->   lengths (n_d, B_s) per source     n_d = slots held by d
    values  for d  (sum,)      ---all-to-all 2--->   values, split by the sums of what all-to-all 1 delivered

    counts first: the second all-to-all's receive sizes are known only once the lengths have arrived.

Output dist: pooled vectors back to the ranks that own the samples (autograd-aware)::

    holder s computes (B_global, W_s) for its slots, samples in global order = row blocks [B_0 | B_1 | ...]
    pooled all-to-all:   block r (B_r, W_s) goes to rank r; r places the columns of every source's block
                         (table- and column-wise: every output column comes from exactly one source)
    reduce-scatter:      the same exchange, but r *adds* the blocks (row-wise partial sums), in a fixed
                         order, so every run sums identically
    backward:            the reverse all-to-all of the gradient blocks (launched in the wait node's
                         backward, waited in the request node's backward, so it overlaps the bottom MLP)

Table-gradient sync of data-parallel tables: coalesced sparse gradients are gathered (counts first, then
indices and rows; each rank's one block sent to every peer point to point, never repeated K times) and every
rank sums them in rank order, so all replicas apply the identical update.

Bytes: every collective records in ``CommStats`` the bytes this rank sends to *other* ranks (what a direct
exchange puts on the wire; self-sends are local copies). ``all_reduce`` records its tensor's bytes (the
payload; ring algorithms move about 2(K-1)/K of it per rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd import Function

from haloflow.engine.comm import (
    AllToAllHandle,
    CommStats,
    Group,
    all_gather_uneven,
    all_to_all,
    group_rank,
    group_size,
)

__all__ = [
    "JaggedReceived",
    "JaggedAllToAllHandle",
    "jagged_all_to_all",
    "PooledExchangeHandle",
    "pooled_exchange",
    "SparseGradHandle",
    "sparse_grad_all_reduce",
]


# --------------------------------------------------------------------------------------------- input dist
@dataclass(frozen=True)
class JaggedReceived:
    """What the input dist delivers: per source rank, lengths (n_d * B_s,) and values, in rank order."""

    lengths: Tensor  # int64 (n_d * sum_s B_s,): source s's block is (n_d, B_s) row-major
    values: Tensor  # int64 (sum of all received lengths,)
    length_splits: list[int]  # per source: n_d * B_s
    value_splits: list[int]  # per source: ids received from it


class JaggedAllToAllHandle:
    """Lengths in flight; ``wait()`` waits for them, starts the values exchange, and waits for that too."""

    def __init__(self, lengths: AllToAllHandle, values: Tensor, value_send_splits: list[int],
                 length_recv_splits: list[int], group: Group | None, stats: CommStats | None):
        self._lengths = lengths
        self._values = values
        self._value_send_splits = value_send_splits
        self._length_recv_splits = length_recv_splits
        self._group = group
        self._stats = stats

    def wait(self) -> JaggedReceived:
        lengths = self._lengths.wait()  # counts first
        per_source = lengths.split(self._length_recv_splits)
        # One read of K numbers: the receive sizes of the values all-to-all (a device sync on an accelerator).
        value_recv = torch.stack([c.sum() for c in per_source]).tolist() if per_source else []
        values = all_to_all(self._values, self._value_send_splits, value_recv, group=self._group,
                            stats=self._stats, kind="input_values").wait()
        return JaggedReceived(lengths, values, list(self._length_recv_splits), [int(v) for v in value_recv])


def jagged_all_to_all(
    lengths: Sequence[Tensor],
    values: Sequence[Tensor],
    recv_length_splits: Sequence[int],
    *,
    group: Group | None,
    stats: CommStats | None = None,
) -> JaggedAllToAllHandle:
    """Start the input dist: ``lengths[p]`` and ``values[p]`` go to rank p.

    Args:
        lengths: K int64 tensors, the counts for rank p (any shape; sent flat).
        values: K int64 tensors, the ids for rank p (``values[p].numel() == lengths[p].sum()``).
        recv_length_splits: K counts, how many lengths each source sends here (n_d * B_s).

    The lengths all-to-all starts now; the values follow in ``wait()`` (their sizes come from the lengths).
    """
    send_len = torch.cat([x.reshape(-1) for x in lengths]) if lengths else torch.empty(0, dtype=torch.int64)
    len_splits = [x.numel() for x in lengths]
    send_val = torch.cat([x.reshape(-1) for x in values]) if values else torch.empty(0, dtype=torch.int64)
    val_splits = [x.numel() for x in values]
    handle = all_to_all(send_len, len_splits, recv_length_splits, group=group, stats=stats, kind="input_lengths")
    return JaggedAllToAllHandle(handle, send_val, val_splits, [int(n) for n in recv_length_splits], group, stats)


# -------------------------------------------------------------------------------------------- output dist
class _Request:
    """State shared by the two autograd nodes of one pooled exchange."""

    def __init__(self, send_splits: list[int], recv_splits: list[int], group: Group | None,
                 stats: CommStats | None, kind: str):
        self.send_splits, self.recv_splits = send_splits, recv_splits
        self.group, self.stats, self.kind = group, stats, kind
        self.forward: AllToAllHandle | None = None
        self.backward: AllToAllHandle | None = None


class _ExchangeStart(Function):
    """Forward: start the all-to-all. Backward: wait for the reverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, req: _Request, send: Tensor) -> Tensor:
        req.forward = all_to_all(send.reshape(-1), req.send_splits, req.recv_splits, group=req.group,
                                 stats=req.stats, kind=req.kind)
        ctx.req, ctx.shape = req, send.shape
        return send.new_empty(0)  # a token that ties the wait node to this one in the graph

    @staticmethod
    def backward(ctx, _token_grad: Tensor):
        grad = ctx.req.backward.wait()  # (numel of send,), the gradient blocks back from every rank
        ctx.req.backward = None
        return None, grad.view(ctx.shape)


class _ExchangeWait(Function):
    """Forward: wait for the all-to-all. Backward: start the reverse all-to-all (waited by the start node)."""

    @staticmethod
    def forward(ctx, req: _Request, token: Tensor) -> Tensor:
        ctx.req = req
        ctx.token_shape = token.shape
        out = req.forward.wait()
        req.forward = None
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        req = ctx.req
        req.backward = all_to_all(grad.contiguous(), req.recv_splits, req.send_splits, group=req.group,
                                  stats=req.stats, kind=req.kind + "_grad")
        return None, grad.new_zeros(ctx.token_shape)


class PooledExchangeHandle:
    """A pooled exchange in flight; ``wait()`` returns this rank's (B_r, W_out) block (differentiable)."""

    def __init__(self, req: _Request, token: Tensor, source_widths: list[int], batch: int,
                 columns: Tensor, out_width: int):
        self._req, self._token = req, token
        self._source_widths, self._batch = source_widths, batch
        self._columns, self._out_width = columns, out_width

    def wait(self) -> Tensor:
        flat = _ExchangeWait.apply(self._req, self._token)  # (B_r * sum W_s,)
        B = self._batch
        blocks = [c.view(B, w) for c, w in zip(flat.split([B * w for w in self._source_widths]),
                                                self._source_widths)]  # K x (B_r, W_s)
        received = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)  # (B_r, sum W_s)
        out = received.new_zeros(B, self._out_width)
        # Columns of sources in rank order; a column listed twice (row-wise shards) is summed in that order,
        # which index_add does sequentially on CPU, so the sum order is fixed.
        return out.index_add(1, self._columns, received)  # (B_r, W_out)


def pooled_exchange(
    send: Tensor,
    batch_sizes: Sequence[int],
    source_widths: Sequence[int],
    columns: Tensor,
    out_width: int,
    *,
    group: Group | None,
    stats: CommStats | None = None,
    kind: str = "pooled",
) -> PooledExchangeHandle:
    """Start an output dist: pooled all-to-all (every output column from one source) or reduce-scatter.

    Args:
        send: (B_global, W_self) pooled vectors of this rank's slots, samples in global order.
        batch_sizes: K local batch sizes B_r (row block r of ``send`` goes to rank r).
        source_widths: K widths W_s, the columns every source sends (W_self == send.shape[1]).
        columns: int64 (sum W_s,), output column of each received column, sources in rank order; a column
            named by several sources receives their sum (the reduce of a reduce-scatter).
        out_width: W_out.

    Shapes:
        send (B_global, W_self) -> wait() (B_r, W_out)
    """
    K, rank = len(batch_sizes), group_rank(group)
    if send.shape != (sum(batch_sizes), source_widths[rank]):
        raise ValueError(f"pooled_exchange: send has shape {tuple(send.shape)}, expected "
                         f"({sum(batch_sizes)}, {source_widths[rank]})")
    if columns.numel() != sum(source_widths):
        raise ValueError(f"pooled_exchange: {columns.numel()} column indices for {sum(source_widths)} columns")
    W = send.shape[1]
    send_splits = [b * W for b in batch_sizes]  # row block r is contiguous: rows of r's samples
    recv_splits = [batch_sizes[rank] * w for w in source_widths]
    req = _Request(send_splits, recv_splits, group, stats, kind)
    if torch.is_grad_enabled() and not send.requires_grad:
        # Every rank must take part in the backward exchange, also one whose slots are all empty.
        send = send.detach().requires_grad_()
    token = _ExchangeStart.apply(req, send)
    return PooledExchangeHandle(req, token, [int(w) for w in source_widths], batch_sizes[rank], columns,
                                int(out_width))


# -------------------------------------------------------------------------------- data-parallel gradients
class SparseGradHandle:
    """Sparse gradients in flight; ``wait()`` returns the coalesced sums over all ranks, one per table."""

    def __init__(self, counts, local: list[Tensor], group: Group | None,
                 stats: CommStats | None):
        self._counts, self._local, self._group, self._stats = counts, local, group, stats

    def wait(self) -> list[Tensor]:
        if self._group is None:
            return self._local
        K = group_size(self._group)
        n = len(self._local)
        counts = self._counts.wait().view(K, n)  # (K, n_tables): unique rows each rank sends, per table
        idx = torch.cat([g._indices()[0] for g in self._local])  # (sum u,)
        rows = torch.cat([g._values() for g in self._local])  # (sum u, D)
        dim = rows.shape[1] if rows.dim() == 2 else self._local[0].shape[1]
        total = counts.sum(1).tolist()  # ids from each rank (a read of K numbers)
        # The same block goes to every peer (an all-gather with uneven sizes): point-to-point sends of the one
        # local block, so the memory beyond the gathered rows does not grow with K.
        h_idx = all_gather_uneven(idx, total, group=self._group, stats=self._stats, kind="dp_grad_indices")
        h_rows = all_gather_uneven(rows.reshape(-1), [t * dim for t in total], group=self._group,
                                   stats=self._stats, kind="dp_grad_values")
        all_idx, all_rows = h_idx.wait(), h_rows.wait().view(-1, dim)
        # Regroup per table: source p's block is table 0's ids, then table 1's, ...
        per_table_idx = [[] for _ in range(n)]
        per_table_rows = [[] for _ in range(n)]
        for p, (ci, cr) in enumerate(zip(all_idx.split(total), all_rows.split(total))):
            sizes = counts[p].tolist()
            for t, (i, r) in enumerate(zip(ci.split(sizes), cr.split(sizes))):
                per_table_idx[t].append(i)
                per_table_rows[t].append(r)
        out = []
        for t, g in enumerate(self._local):
            i = torch.cat(per_table_idx[t]).unsqueeze(0)  # (1, nnz) rank order, so every rank sums alike
            v = torch.cat(per_table_rows[t])  # (nnz, D)
            out.append(torch.sparse_coo_tensor(i, v, g.shape, check_invariants=False).coalesce())
        return out


def sparse_grad_all_reduce(
    grads: Sequence[Tensor], *, group: Group | None, stats: CommStats | None = None, coalesce_first: bool = True
) -> SparseGradHandle:
    """Start summing sparse row gradients of replicated tables over all ranks.

    Args:
        grads: one sparse COO gradient (rows, D) per table (as ``EmbeddingBag(sparse=True)`` makes them);
            coalesced here, so each rank sends each touched row once (``coalesce_first=False``: sent as they
            are, one row per looked-up id, so that the sum over all ranks' rows in rank order is the one a single
            process coalescing the whole batch computes, at any K).

    Cost: counts all-to-all (8 bytes per table per peer), then ``8 + 4 D`` bytes per unique row per peer.
    """
    local = [g.coalesce() for g in grads] if coalesce_first or group is None else list(grads)
    if group is None:
        return SparseGradHandle(None, local, None, stats)
    K = group_size(group)
    counts = torch.tensor([g._indices().shape[1] for g in local], dtype=torch.int64,
                          device=local[0].device)  # (n_tables,)
    h = all_gather_uneven(counts, [len(local)] * K, group=group, stats=stats, kind="dp_grad_counts")
    return SparseGradHandle(h, local, group, stats)
