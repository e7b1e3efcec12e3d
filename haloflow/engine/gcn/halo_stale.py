"""Stale halos (PipeGCN, https://arxiv.org/abs/2203.10983): use the previous epoch's halo, exchange in the background.

Per layer and training epoch t (two receive slots per direction, used alternately)::

    forward   wait exchange(x_{t-1})  ──>  halo_{t-1}  used now
              launch exchange(x_t)     ──>  lands in the other slot, waited on at epoch t+1
    backward  wait grads(t-1)          ──>  owners' share of epoch t-1's halo gradient, added into grad x now
              launch grads(t)          ──>  waited on at epoch t+1

Epoch 0 has nothing older, so it waits for its own exchanges (exact). Every launch waits for the previous
exchange of the same direction first, so a send buffer is never overwritten while still in flight.
"""

from __future__ import annotations

import torch

from haloflow.engine.comm import wait_work
from haloflow.engine.gcn.halo import HaloExchange, _Inflight

__all__ = ["StaleHalo"]


class StaleHalo:
    """One layer's stale exchange; ``apply(x)`` returns the halo rows of the previous epoch, (n_halo, F)."""

    def __init__(self, exchange: HaloExchange) -> None:
        if exchange.num_slots < 2:
            raise ValueError("a stale exchange needs an exchange with num_slots=2")
        self.exchange = exchange
        self._fwd: _Inflight | None = None  # last forward exchange (its rows are used next epoch)
        self._bwd: _Inflight | None = None
        self._fwd_slot = 0
        self._bwd_slot = 0

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return _StaleFn.apply(x, self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ex = self.exchange
        prev = self._fwd
        if prev is not None:
            ex.finish_features(prev)  # in flight since the previous epoch; usually done by now
            prev.work = None
        new = ex.launch_features(x, slot=self._fwd_slot)
        self._fwd_slot ^= 1
        if prev is None:  # first epoch: wait for this one (exact)
            ex.finish_features(new)
            new.work = None
            prev = new
        self._fwd = new
        return prev.out

    def backward(self, grad_halo: torch.Tensor) -> torch.Tensor:
        ex = self.exchange
        prev = self._bwd
        grad_x = None
        if prev is not None:
            grad_x = ex.finish_grads(prev)  # (n_inner, F) from the previous epoch
            prev.work = None
        new = ex.launch_grads(grad_halo, slot=self._bwd_slot)
        self._bwd_slot ^= 1
        if grad_x is None:  # first epoch: exact
            grad_x = ex.finish_grads(new)
            new.work = None
        self._bwd = new
        return grad_x

    def finish(self) -> None:
        """Wait for the exchanges launched for an epoch that will not run (before the group is destroyed)."""
        for what, kind, inflight in (("forward", "halo", self._fwd), ("backward", "halo_grad", self._bwd)):
            if inflight is not None and inflight.work is not None:
                wait_work(inflight.work, f"{self.exchange.name} ({what})", self.exchange.stats, kind)
                inflight.work = None


class _StaleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, stale: StaleHalo) -> torch.Tensor:
        ctx.stale = stale
        return stale.forward(x).detach()  # alias of a slot; overwritten two epochs later, long after use

    @staticmethod
    def backward(ctx, grad_halo: torch.Tensor):
        return ctx.stale.backward(grad_halo.contiguous()), None
