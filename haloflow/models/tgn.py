"""Temporal Graph Network with node memory (TGN, Rossi et al. 2020, https://arxiv.org/abs/2006.10637).

Per node a memory ``s_v`` (M,), updated by a GRU from the node's last message; embeddings from one temporal
graph-attention layer over the most recent neighbours; an MLP scores a (src, dst) pair::

    message of v from event (v, u, t, e)   m_v = [ s_v, s_u, e, phi(t - t_v) ]         "identity" message
    memory update                           s_v <- GRU(m_v, s_v),   t_v <- t            "last" aggregator
    time encoding                           phi(dt) = cos(dt * w + b),  w_0 = 1 / 10^linspace(0, 9, d)
    embedding of v at time t                z_v = MLP([ attn(q_v, K_v, V_v), s_v ])
        q_v = [ s_v, phi(0) ] W_q;   for the k newest neighbours u_j (events e_j at t_j < t):
        K_v, V_v = [ s_uj, e_j, phi(t - t_j) ] W_k, W_v;   2 heads, softmax over j, dropout on the weights
    link logit                              MLP([ z_src, z_dst ])

When memory is updated (where implementations leak labels): batch b uses memories computed at its START from
the messages that EARLIER batches stored; the GRU runs inside batch b's graph, so it gets gradients, and no
batch sees its own events in memory. Batch b's messages are stored after its loss, for b + 1.

The per-batch computation is a function of the state ROWS of the nodes it touches, so the same math runs
single-process or with the state owned by partitions (``haloflow.engine`` gathers and scatters rows)::

        owners of node rows                           process running (part of) batch b
    +--------------------------+  gather rows   +-------------------------------------------------------+
    | TGNMemoryState           |  of node_ids   | batch = make_tgn_batch(events, event_ids, neg, csr)   |
    |  memory, last_update,    | -------------> | out   = model(rows, batch)                            |
    |  mailbox (mail_*)        |  (all-to-all)  |   1. s' = update_memory(rows)     GRU on old messages |
    |                          |                |   2. z  = embed(s', batch)        attention over csr  |
    |                          |                |   3. logits = decode(z)                               |
    |                          |                | loss  = tgn_batch_loss(out..., num_events=global B)   |
    |                          |                | loss.backward(); optimizer.step()                     |
    | state.apply(rows, upd)   | <------------- | upd   = tgn_messages(batch, out)   s' of src and dst, |
    |  newest mail_eid wins    |  (all-to-all)  |                                    their new message  |
    +--------------------------+                +-------------------------------------------------------+

Every piece keys on global ids: negatives and dropout masks are drawn from ``(seed, epoch, event id)``, the loss
is divided by the global batch size, and ``apply`` resolves concurrent writes by event id, so splitting a batch
across processes changes nothing but float rounding.

Shapes:
    B events per batch, Q = 3B queries (src, dst, negative), k neighbours, n distinct nodes touched,
    M memory, T time, F edge features, D embedding.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from haloflow.kernels.attend import attend
from haloflow.kernels.cos_encode import cos_encode
from haloflow.kernels.gru_gates import gru_gates
from haloflow.kernels.keyed_dropout import dropout_mask
from haloflow.data.temporal import TemporalEvents
from haloflow.data.temporal_sampler import TemporalCSR
from haloflow.errors import ConfigError
from haloflow.models.config import TGNConfig
from haloflow.models.tgn_memory import MemoryRows, MemoryUpdate
from haloflow.utils.arrays import sorted_unique

__all__ = [
    "TGNConfig",
    "TimeEncoder",
    "TemporalAttention",
    "TGN",
    "TGNBatch",
    "TGNOutput",
    "make_tgn_batch",
    "tgn_batch_loss",
    "tgn_messages",
]


class TimeEncoder(nn.Module):
    """``phi(dt) = cos(dt * w + b)`` with ``w = 1 / 10^linspace(0, 9, d)``, ``b = 0`` at init (TGN, TGL).

    Shapes:
        dt (...,) float;  mask bool (...,) or None: rows to encode (the others zeros, no gradient)
        -> (..., d) float32.
    """

    def __init__(self, dim: int, learnable: bool = True):
        super().__init__()
        w = torch.from_numpy(1.0 / 10.0 ** np.linspace(0, 9, dim)).float()
        self.w = nn.Parameter(w, requires_grad=learnable)
        self.b = nn.Parameter(torch.zeros(dim), requires_grad=learnable)

    def forward(self, dt: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return cos_encode(dt, self.w, self.b, mask)


class TemporalAttention(nn.Module):
    """Multi-head attention of each query over its k neighbours, with padding; a query without any neighbour
    gets a zero output (as TGN's ``TemporalAttentionLayer``, an ``nn.MultiheadAttention`` with kdim = vdim = Dk).

    The key and value projections are moved to the query side, which gives the same numbers with far fewer
    multiplications: per head h, with ``x_j = [s_u, e, phi(dt)]`` the input of neighbour j,

        score_hj = q_h . (W_k,h x_j + b_k,h) = (W_k,h^T q_h) . x_j + const     (const cancels in the softmax)
        out_h    = sum_j p_hj (W_v,h x_j + b_v,h) = W_v,h (sum_j p_hj x_j) + (sum_j p_hj) b_v,h

    so the (Dq x Dk) projections run once per query (3B rows), not once per neighbour slot (3Bk rows): about
    2*Q*Dq*Dk + 2*Q*k*H*Dk multiply-adds instead of 2*Q*k*Dq*Dk (9x fewer at k = 10, Dq = Dk = 200, H = 2).

    Shapes:
        query (Q, Dq);  kv (Q, k, Dk) neighbour inputs;  mask bool (Q, k);  drop_keys int64 (Q,)  ->  (Q, Dq).
    """

    def __init__(self, query_dim: int, key_dim: int, heads: int, dropout: float, seed: int):
        super().__init__()
        self.heads, self.dropout, self.seed = heads, dropout, seed
        self.w_q = nn.Linear(query_dim, query_dim)
        self.w_kv = nn.Linear(key_dim, 2 * query_dim)  # keys and values stacked: (2 Dq, Dk), as TGN's k/v proj
        self.w_o = nn.Linear(query_dim, query_dim)

    def forward(self, query: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, drop_keys: torch.Tensor,
                epoch: int) -> torch.Tensor:
        q_n, k = mask.shape
        h, dq = self.heads, query.shape[1]
        dh = dq // h
        w_k, w_v = self.w_kv.weight.view(2, h, dh, -1).unbind(0)  # (H, Dh, Dk) each
        b_v = self.w_kv.bias[dq:].view(h, dh)  # (H, Dh); the key bias cancels in the softmax
        q = self.w_q(query).view(q_n, h, dh) * dh**-0.5  # (Q, H, Dh)
        q_in = torch.einsum("qhd,hdk->qhk", q, w_k)  # (Q, H, Dk): the query moved to the neighbours' input space
        # scores, softmax over the real slots, dropout and the weighted sum in one fused pass (kernels/attend.py)
        slots = torch.arange(q_n * k, device=kv.device).view(q_n, k)  # kv as a memory of Q*k rows, one per slot
        none = kv.new_zeros(q_n, k, 0)
        probs, x_bar = attend(q_in, kv.reshape(q_n * k, -1), slots, none, none, mask,
                              self._dropout_multiplier(drop_keys, q_n, k, epoch, query))
        out = torch.einsum("qhk,hdk->qhd", x_bar, w_v) + probs.sum(-1, keepdim=True) * b_v  # (Q, H, Dh)
        empty = ~mask.any(dim=1)  # (Q,) no neighbour: a zero output
        return self.w_o(out.reshape(q_n, dq)).masked_fill(empty[:, None], 0.0)

    def folded(self, s_q: torch.Tensor, t_q: torch.Tensor, memory: torch.Tensor, nbr_row: torch.Tensor,
               nbr_feat: torch.Tensor, nbr_phi: torch.Tensor, mask: torch.Tensor, drop_keys: torch.Tensor, epoch: int,
               w_after: torch.Tensor, query_pos: torch.Tensor | None = None) -> torch.Tensor:
        """``forward(cat([s_q, t_q for every query], 1), kv, ...) @ w_after.T`` with the weights multiplied first,
        ``kv = cat([memory[nbr_row], nbr_feat, nbr_phi], 2)`` read in place by the fused core (never built).

        In TGN the query's time part is phi(0), the same for every query, and the attention's output goes straight
        into the merge layer's first product, so per head h (scale s = Dh^-1/2, ``W_q = [W_qs | W_qt]``)::

            W_k,h^T q_h   = s_q (s W_qs,h^T W_k,h) + s W_k,h^T (W_qt,h t_q + b_q,h)        (Q, Dk)
            w_after att   = sum_h xbar_h (w_after W_o,h W_v,h)^T + psum_h (w_after W_o,h b_v,h) + w_after b_o

        Same numbers as the unfolded products up to rounding, with one (Q x Ds x H*Dk) product on the query side
        instead of (Q x Dq x Dq) + (Q x Dq x H*Dk), and one (Q x (H*Dk + H) x D) on the output side instead of
        (Q x H*Dk x Dq) + (Q x Dq x Dq) + (Q x Dq x D): at widths 100 and 3B = 600 queries about 60M of the
        forward's 110M multiply-adds (and twice as many in the backward) are saved, for products of the weights
        alone that cost 12M.

        ``query_pos`` lets queries share a state row: ``s_q`` then holds U distinct rows and query i reads row
        ``query_pos[i]``, so the query-side product runs over U rows, not Q (TGN's queries repeat nodes: on
        Wikipedia 296 distinct of 600 a batch).

        Shapes:
            s_q (Q, Ds), or (U, Ds) with query_pos int64 (Q,) in [0, U);  t_q (Dq - Ds,);  memory (n, M);
            nbr_row int64 (Q, k);  nbr_feat (Q, k, F);  nbr_phi (Q, k, T);  mask, drop_keys as in ``forward``;
            w_after (D, Dq)  ->  (Q, D).
        """
        q_n, k = mask.shape
        h, dq, ds = self.heads, self.w_q.out_features, s_q.shape[1]
        dh, dk = dq // h, memory.shape[1] + nbr_feat.shape[2] + nbr_phi.shape[2]
        d_out = w_after.shape[0]
        w_k, w_v = self.w_kv.weight.view(2, h, dh, dk).unbind(0)  # (H, Dh, Dk) each
        b_v = self.w_kv.bias[dq:].view(h, dh, 1)  # (H, Dh, 1); the key bias cancels in the softmax
        w_qs, w_qt = self.w_q.weight.split([ds, dq - ds], dim=1)  # (Dq, Ds), (Dq, Dq - Ds)
        scale = dh**-0.5
        # a row-wise dot, not a (1 x Dq) product: MKL splits a one-row product's inner dimension by thread count
        # (a matrix-vector product, which its reproducible mode does not cover)
        q_shared = ((w_qt * t_q).sum(1).add_(self.w_q.bias) * scale).view(h, 1, dh)  # (H, 1, Dh)
        a = torch.bmm(w_qs.view(h, dh, ds).transpose(1, 2), w_k) * scale  # (H, Ds, Dk)
        c = torch.bmm(q_shared, w_k)  # (H, 1, Dk)
        q_in = torch.addmm(c.reshape(-1), s_q, a.transpose(0, 1).reshape(ds, h * dk))  # (Q or U, H*Dk)
        q_in = (q_in if query_pos is None else q_in.index_select(0, query_pos)).view(q_n, h, dk)  # (Q, H, Dk)
        probs, x_bar = attend(q_in, memory, nbr_row, nbr_feat, nbr_phi, mask,
                              self._dropout_multiplier(drop_keys, q_n, k, epoch, s_q))
        g = (w_after @ self.w_o.weight).view(d_out, h, dh).transpose(0, 1)  # (H, D, Dh): w_after W_o,h
        b_all = torch.bmm(g, w_v).transpose(0, 1).reshape(d_out, h * dk)  # (D, H*Dk)
        e = torch.bmm(g, b_v).squeeze(2)  # (H, D)
        # two products, not one over cat([x_bar, sum_j p]): the cat and the slicing of its gradient copied the
        # (Q, H*Dk) block twice a batch
        # (w_after * b_o).sum(1), not w_after @ b_o: MKL's matrix-vector product splits by thread count, also in
        # its reproducible mode (which covers matrix-matrix products only)
        b_after = (w_after * self.w_o.bias).sum(1)  # (D,)
        base = torch.addmm(b_after, probs.sum(-1), e)  # (Q, D): biases, sum_j p_hj b_v,h folded
        out = torch.addmm(base, x_bar.reshape(q_n, h * dk), b_all.t())  # (Q, D)
        return out.masked_fill(~mask.any(dim=1)[:, None], 0.0)  # a query without neighbours: zero attention

    def _dropout_multiplier(self, drop_keys: torch.Tensor, q_n: int, k: int, epoch: int, like: torch.Tensor
                            ) -> torch.Tensor:
        """(Q, H, k): keep / (1 - p) of `keyed_dropout` on the (Q, H*k) weights (ones when not training).

        Keyed by (event id, role), not by position: any split of the batch drops the same weights."""
        h = self.heads
        if not self.training or self.dropout == 0.0:
            return torch.ones(q_n, h, k, dtype=like.dtype, device=like.device)
        keep = dropout_mask(drop_keys, h * k, p=self.dropout, seed=self.seed, epoch=epoch, layer=0)  # (Q, H*k)
        # 1 * scale rounds to the dtype's scale, the factor keyed_dropout multiplies a kept element by
        return (keep.to(device=like.device, dtype=like.dtype) * (1.0 / (1.0 - self.dropout))).view(q_n, h, k)


def _mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))


def _gru_cell(cell: nn.GRUCell, h: torch.Tensor, other: list[torch.Tensor], phi: torch.Tensor) -> torch.Tensor:
    """``cell(cat([h, *other, phi], 1), h)`` with the products arranged by input part (the caller passes the rows
    with mail only):

    - ``h`` appears twice (the message starts with the node's own memory, and it is the GRU's state), and the r and
      z gates read ``gi + gh`` only as a sum, so their h columns of ``W_ih`` and ``W_hh`` are added first: one
      (n x M x 4M) product of h, not (n x M x 3M) twice (at widths 100 a sixth fewer multiply-adds in the cell,
      forward and weight gradients both);
    - the other parts (``mail_other``, edge features) are state, so the backward computes input gradients for the
      T columns of ``phi`` only, not for all 2M+F+T of the message (torch's cell cannot tell which of its input
      columns need them);
    - the gates run in ``kernels/gru_gates.py`` (forward and backward by hand).

    Shapes:
        h (n, M);  other: tensors (n, d_i) with M + sum d_i + T = cell.input_size;  phi (n, T)  ->  (n, M).
    """
    m = h.shape[1]
    w_h, *w_other, w_time = cell.weight_ih.split([m, *(o.shape[1] for o in other), phi.shape[1]], dim=1)
    w_hh, b_hh = cell.weight_hh, cell.bias_hh
    w_hc = torch.cat([w_h[:2 * m] + w_hh[:2 * m], w_h[2 * m:], w_hh[2 * m:]])  # (4M, M)
    hp = torch.mm(h, w_hc.t())  # (n, 4M): [r z: gi + gh | n: gi's h part | n: gh], biases in xp and the gates
    b_x = cell.bias_ih + torch.cat([b_hh[:2 * m], b_hh.new_zeros(m)])  # (3M,) the r and z biases of both
    xp = torch.addmm(b_x, phi, w_time.t())  # (n, 3M): gi without its h part
    for o, w in zip(other, w_other):
        if o.shape[1]:
            xp = xp.addmm_(o, w.t())  # in place: addmm saves its inputs, not its output
    return gru_gates(xp, hp, b_hh[2 * m:], h)


# --------------------------------------------------------------------------------------------- batch
@dataclass(frozen=True, eq=False)
class TGNBatch:
    """Everything one process needs for its events of a batch, as tensors; node state is addressed by row
    positions into ``node_ids`` (the rows to gather), never by global id.

    Shapes:
        event_ids, src, dst, neg int64 (B,);  t float64 (B,);  edge_feat float32 (B, F);
        node_ids int64 (n,) ascending, distinct: every node whose state row the batch reads;
        query_row int64 (3B,): rows of [src; dst; neg];  query_nodes int64 (U,) its distinct rows, ascending, and
        query_pos int64 (3B,) with query_row = query_nodes[query_pos];  nbr_row int64 (3B, k) (0 on padding);
        nbr_dt float32 (3B, k) query time - neighbour event time;  nbr_mask bool (3B, k);
        nbr_feat float32 (3B, k, F);  epoch: key of the dropout masks.
    """

    event_ids: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    neg: torch.Tensor
    t: torch.Tensor
    edge_feat: torch.Tensor
    node_ids: torch.Tensor
    query_row: torch.Tensor
    query_nodes: torch.Tensor
    query_pos: torch.Tensor
    nbr_row: torch.Tensor
    nbr_dt: torch.Tensor
    nbr_mask: torch.Tensor
    nbr_feat: torch.Tensor
    epoch: int = 0

    @property
    def num_events(self) -> int:
        return int(self.event_ids.shape[0])

    def to(self, device: torch.device | str) -> TGNBatch:
        if torch.device(device) == self.node_ids.device:  # built on the host and trained there: nothing to move
            return self
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return TGNBatch(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})


def make_tgn_batch(events: TemporalEvents, event_ids: np.ndarray, neg: np.ndarray, csr: TemporalCSR, *,
                   num_neighbors: int, epoch: int = 0) -> TGNBatch:
    """Assemble a `TGNBatch`: look up the events, sample the k newest neighbours of src, dst and negative strictly
    before the event time, and number the distinct nodes touched.

    Args:
        events: the stream (read-only; every process may hold it whole).
        event_ids: int64 (B,) global ids of this process's events of the batch, ascending.
        neg: int64 (B,) negative destination of each event (`NegativeSampler.sample`).
        csr: the neighbour index (training: of the training events only, for an inductive split).
        num_neighbors, epoch: k, and the dropout key.

    Cost: one sampler call over 3B queries, one sort of the (3B + 3Bk) node ids touched.
    """
    eids = np.ascontiguousarray(event_ids, dtype=np.int64)  # (B,)
    neg = np.ascontiguousarray(neg, dtype=np.int64)
    if eids.ndim != 1 or neg.shape != eids.shape:
        raise ConfigError(f"make_tgn_batch needs event_ids (B,) and neg (B,), got {eids.shape} and {neg.shape}")
    b, f = eids.shape[0], events.edge_dim
    src, dst = events.src[eids], events.dst[eids]  # (B,)
    t = events.t[eids].astype(np.float64)  # (B,)
    q_nodes = np.concatenate([src, dst, neg])  # (3B,)
    q_t = np.tile(t, 3)  # (3B,)
    nb = csr.sample_recent(q_nodes, q_t, num_neighbors)  # (3B, k)
    node_ids = sorted_unique(np.concatenate([q_nodes, nb.ids[nb.mask]]))  # (n,)
    nbr_row = np.where(nb.mask, np.searchsorted(node_ids, nb.ids), 0)  # (3B, k)
    nbr_dt = np.where(nb.mask, q_t[:, None] - nb.times, 0.0).astype(np.float32)  # (3B, k), >= 0
    if f:
        edge_feat = events.edge_feat[eids]  # (B, F)
        nbr_feat = events.edge_feat[np.maximum(nb.eids, 0)] * nb.mask[..., None]  # (3B, k, F)
    else:
        edge_feat = np.zeros((b, 0), dtype=np.float32)
        nbr_feat = np.zeros((3 * b, num_neighbors, 0), dtype=np.float32)
    query_row = np.searchsorted(node_ids, q_nodes)  # (3B,)
    query_nodes, query_pos = np.unique(query_row, return_inverse=True)  # (U,), (3B,)
    as_t = torch.from_numpy
    return TGNBatch(
        event_ids=as_t(eids), src=as_t(src), dst=as_t(dst), neg=as_t(neg), t=as_t(t),
        edge_feat=as_t(np.ascontiguousarray(edge_feat, dtype=np.float32)), node_ids=as_t(node_ids),
        query_row=as_t(query_row), query_nodes=as_t(query_nodes), query_pos=as_t(query_pos.reshape(-1)),
        nbr_row=as_t(nbr_row), nbr_dt=as_t(nbr_dt),
        nbr_mask=as_t(nb.mask), nbr_feat=as_t(np.ascontiguousarray(nbr_feat, dtype=np.float32)), epoch=epoch,
    )


# --------------------------------------------------------------------------------------------- model
@dataclass(frozen=True, eq=False)
class TGNOutput:
    """What `TGN.forward` returns.

    Shapes:
        pos_logit, neg_logit (B,);  memory (n, M) the memory batch b used for each row of ``node_ids``
        (differentiable);  last_update float64 (n,).
    """

    pos_logit: torch.Tensor
    neg_logit: torch.Tensor
    memory: torch.Tensor
    last_update: torch.Tensor


class TGN(nn.Module):
    """TGN for link prediction: GRU memory, one temporal attention layer, MLP decoder (formulas above).

    Args:
        config: see `TGNConfig`. Weights come from torch's default initialisers under ``config.seed`` (the same on
            every process; the global RNG is left untouched).
    """

    def __init__(self, config: TGNConfig):
        super().__init__()
        self.config = c = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(c.seed)
            self.time_enc = TimeEncoder(c.time_dim, learnable=c.learn_time)
            self.memory_updater = nn.GRUCell(c.message_dim, c.memory_dim)
            self.attention = TemporalAttention(c.query_dim, c.key_dim, c.heads, c.dropout, c.seed)
            self.merge = _mlp(c.query_dim + c.memory_dim, c.embedding_dim, c.embedding_dim)
            self.decoder = _mlp(2 * c.embedding_dim, c.embedding_dim, 1)

    def update_memory(self, rows: MemoryRows) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply each row's pending message (if any): the memory batch b uses, and its time.

        Shapes:
            rows of n nodes -> memory (n, M), last_update float64 (n,).
        """
        has_mail = rows.mail_eid >= 0  # (n,)
        last_update = torch.where(has_mail, rows.mail_t, rows.last_update)
        parts = [rows.memory, rows.mail_other, rows.mail_feat, rows.mail_t - rows.last_update]  # dt float64: exact
        mailed = has_mail.nonzero().squeeze(1)  # (n_m,)
        every = mailed.shape[0] == has_mail.shape[0]
        if not every:  # the cell runs on the rows with mail only (94% on Wikipedia); the others keep their memory
            parts = [x.index_select(0, mailed) for x in parts]
        h, other, feat, dt = parts
        # the message [s_v, s_u, e, phi(dt)]: s_v is the state itself (no gradient, as s_u and e)
        new = _gru_cell(self.memory_updater, h, [other, feat], self.time_enc(dt))
        memory = new if every else rows.memory.index_copy(0, mailed, new)  # (n, M)
        return memory, last_update

    def embed(self, memory: torch.Tensor, batch: TGNBatch) -> torch.Tensor:
        """Embeddings of the 3B queries [src; dst; neg] at their event times.

        Shapes:
            memory (n, M) -> (3B, D).
        """
        # the queries' memory rows once per distinct node (U of 3B; index_select: its backward is one index_add)
        s_u = memory.index_select(0, batch.query_nodes)  # (U, M)
        zero = torch.cos(self.time_enc.b)  # (T,) = phi(0) = cos(0 w + b), the queries' time part
        q_n, k = batch.nbr_row.shape
        # (3B, k, T); with memory[nbr_row] and nbr_feat, the neighbours' input; zeros on padding (never read)
        phi = self.time_enc(batch.nbr_dt, batch.nbr_mask)
        roles = torch.arange(3, device=memory.device).repeat_interleave(batch.num_events)  # (3B,) src, dst, neg
        keys = batch.event_ids.repeat(3) * 3 + roles  # (3B,) dropout key of each query
        # merge(cat([attention(cat([s_q, phi(0)]), ...), s_q])) with the first merge product split by input part
        # and its attention part folded into the attention's weights (TemporalAttention.folded)
        first, act, last = self.merge
        w_att, w_state = first.weight.split([self.config.query_dim, self.config.memory_dim], dim=1)
        att = self.attention.folded(s_u, zero, memory, batch.nbr_row, batch.nbr_feat, phi, batch.nbr_mask, keys,
                                    batch.epoch, w_att, query_pos=batch.query_pos)  # (3B, D)
        state = F.linear(s_u, w_state, first.bias).index_select(0, batch.query_pos)  # (3B, D)
        return last(act(att + state))  # (3B, D)

    def decode(self, z_src: torch.Tensor, z_dst: torch.Tensor) -> torch.Tensor:
        """Link logits. Shapes: (B, D), (B, D) -> (B,)."""
        return self.decoder(torch.cat([z_src, z_dst], dim=1)).squeeze(1)

    def forward(self, rows: MemoryRows, batch: TGNBatch) -> TGNOutput:
        """One batch: rows are the state of ``batch.node_ids`` as stored before this batch.

        Shapes:
            rows of n = len(batch.node_ids) nodes -> `TGNOutput`.
        """
        if len(rows) != batch.node_ids.shape[0]:
            raise ConfigError(f"TGN.forward: {len(rows)} state rows for {batch.node_ids.shape[0]} batch nodes; "
                              f"expected one row per entry of batch.node_ids")
        memory, last_update = self.update_memory(rows)  # (n, M), (n,)
        z = self.embed(memory, batch)  # (3B, D)
        b, d = batch.num_events, self.config.embedding_dim
        # decode(z_src, z_dst) and decode(z_src, z_neg) with the first layer split by input half: z_src's half
        # runs once for both pairs, the other half once over [dst; neg]
        first, last = self.decoder[0], self.decoder[2]
        w_src, w_other = first.weight.split(d, dim=1)  # (D, D) each
        hidden = F.linear(z[b:], w_other).view(2, b, d) + F.linear(z[:b], w_src, first.bias)  # (2, B, D)
        # the (D -> 1) layer as a row-wise dot: as a product its weight gradient is (1 x 2B) @ (2B x D), whose 2B
        # MKL splits by thread count, reproducible mode or not, so the rounding depended on the threads; a column
        # sum does not
        logits = torch.add((hidden.relu() * last.weight.view(d)).sum(-1), last.bias)  # (2, B): [pos; neg]
        return TGNOutput(logits[0], logits[1], memory, last_update)


# --------------------------------------------------------------------------------------------- loss, messages
def tgn_batch_loss(pos_logit: torch.Tensor, neg_logit: torch.Tensor, num_events: int) -> torch.Tensor:
    """``sum(BCE(pos, 1) + BCE(neg, 0)) / num_events``; TGN's ``mean BCE(pos) + mean BCE(neg)`` when
    ``num_events`` is the global batch size, so per-process pieces add up to the single-process loss.

    Shapes:
        pos_logit, neg_logit (B_local,) -> scalar.
    """
    if num_events < 1:
        raise ConfigError(f"tgn_batch_loss: num_events must be >= 1, got {num_events}")
    if pos_logit.shape != neg_logit.shape or pos_logit.dim() != 1:
        raise ConfigError(f"tgn_batch_loss needs pos_logit (B,) and neg_logit (B,), got {tuple(pos_logit.shape)} "
                          f"and {tuple(neg_logit.shape)}")
    return (F.softplus(-pos_logit).sum() + F.softplus(neg_logit).sum()) / num_events


def tgn_messages(batch: TGNBatch, out: TGNOutput) -> MemoryUpdate:
    """The rows batch b writes back: for both endpoints of each event, the memory the batch used (now the node's
    stored memory) and the event's message. A node in several events gets several rows; `TGNMemoryState.apply`
    keeps the newest.

    Shapes:
        -> MemoryUpdate with u = 2B rows: [src of every event; dst of every event].
    """
    b = batch.num_events
    src_row, dst_row = batch.query_row[:b], batch.query_row[b:2 * b]  # (B,)
    own = torch.cat([src_row, dst_row])  # (2B,)
    other = torch.cat([dst_row, src_row])  # (2B,)
    memory = out.memory.detach()  # (n, M)
    rows = MemoryRows(
        memory=memory[own], last_update=out.last_update[own], mail_other=memory[other],
        mail_feat=batch.edge_feat.repeat(2, 1), mail_t=batch.t.repeat(2), mail_eid=batch.event_ids.repeat(2),
    )
    return MemoryUpdate(torch.cat([batch.src, batch.dst]), rows)
