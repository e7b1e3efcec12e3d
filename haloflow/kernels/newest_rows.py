"""Write rows into a state, the newest event winning where several rows target one: `write_newest`.

TGN's memory owner applies one batch's updates in one call (``models/tgn_memory.TGNMemoryState.apply``)::

    rows   int64 (u,)  target row of each update row (may repeat)
    eids   int64 (u,)  event id of each update row
    for each distinct target r:  state[r] = update[the row with the largest event id among those targeting r]
    (for every field of the state at once: memory, last update, and the mailbox)

Ties of an event id keep the update row that comes last (both bodies sort stably). A table op (called once a
batch, not worth a custom op's dispatch):

- stock: two stable argsorts (by event id, then by row), the last of each run of equal rows, one indexed write per
  field, on any device.
- CPU (numba): one ``lexsort`` and one parallel pass that copies the six fields of a row together (one pass where
  torch's indexed writes took six: 0.24 -> 0.09 ms a Wikipedia batch); float32 state, contiguous fields and rows
  in range, else the stock body. The same bits (a copy).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from haloflow.host.threads import follow_torch_threads
from haloflow.kernels._registry import Op, call, register

__all__ = ["write_newest"]


def stock(state: list[torch.Tensor], rows: torch.Tensor, update: list[torch.Tensor], eids: torch.Tensor) -> None:
    order = torch.argsort(eids, stable=True)
    order = order[torch.argsort(rows[order], stable=True)]
    r = rows[order]
    last = torch.ones_like(r, dtype=torch.bool)
    last[:-1] = r[1:] != r[:-1]
    pick_, r = order[last], r[last]
    with torch.no_grad():
        for dst, src in zip(state, update):
            dst[r] = src[pick_].detach().to(dst.dtype)


@njit(parallel=True, cache=True)
def _copy_rows(memory, last_update, mail_other, mail_feat, mail_t, mail_eid, o_memory, o_last_update, o_mail_other,
               o_mail_feat, o_mail_t, o_mail_eid, dst, src):  # pragma: no cover - compiled
    # out field[dst[i]] = field[src[i]] for the six fields, one row per iteration (dst distinct)
    for i in prange(dst.shape[0]):
        a, b = dst[i], src[i]
        o_memory[a] = memory[b]
        o_last_update[a] = last_update[b]
        o_mail_other[a] = mail_other[b]
        o_mail_feat[a] = mail_feat[b]
        o_mail_t[a] = mail_t[b]
        o_mail_eid[a] = mail_eid[b]


def _compiled_fits(state, rows, update) -> bool:
    return (len(state) == 6 and state[0].dtype == torch.float32
            and all(t.is_contiguous() for t in state)
            and all(u.dtype == s.dtype and u.device == s.device for u, s in zip(update, state))
            and rows.dtype == torch.int64
            and (rows.numel() == 0 or (int(rows.min()) >= 0 and int(rows.max()) < state[0].shape[0])))


def cpu(state: list[torch.Tensor], rows: torch.Tensor, update: list[torch.Tensor], eids: torch.Tensor) -> None:
    if not _compiled_fits(state, rows, update):  # the stock body then indexes, or raises, as torch does
        return stock(state, rows, update, eids)
    r_np, eid = rows.contiguous().numpy(), eids.contiguous().numpy()
    order = np.lexsort((eid, r_np))  # by row, then event id; stable: the same winner as the stock body
    r_sorted = r_np[order]
    last = np.ones(r_sorted.shape[0], dtype=bool)
    last[:-1] = r_sorted[1:] != r_sorted[:-1]
    follow_torch_threads()
    _copy_rows(*(u.detach().contiguous().numpy() for u in update), *(s.numpy() for s in state),
               r_sorted[last], order[last])


OP = register(Op("write_newest", stock=stock, cpu=cpu, bitwise=frozenset({"cpu"}),
                 doc="TGN memory write-back: per row the newest event's update, all fields in one pass"))


def write_newest(state: list[torch.Tensor], rows: torch.Tensor, update: list[torch.Tensor], eids: torch.Tensor
                 ) -> None:
    """``state[f][r] = update[f][newest row targeting r]`` for every field f (the module docstring), in place.

    Shapes:
        state: fields (N, ...);  rows int64 (u,);  update: fields (u, ...) in the same order;  eids int64 (u,).
    """
    if rows.numel():
        call(OP, state, rows, update, eids)
