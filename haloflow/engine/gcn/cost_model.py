"""Predict the time of one full-batch GCN training epoch at K ranks, from partition statistics and measured rates.

Per rank and training step (precomputed layer 0, L layers; ``w_l`` = the width layer l aggregates, which is its
output width when it transforms first and its input width otherwise)::

    compute  = sum_l  2 x nnz x w_l x t_spmm                 forward A @ h and backward A^T @ g (l >= 1)
             + sum_l  3 x n x d_l x d_l+1 x t_gemm           h @ W forward; grad input and grad W backward
                                                             (layer 0: 2x, its input needs no gradient)
             + sum_l  n x d_l x t_elem                        keyed dropout (a hash per element)
             + n x (d_1 + ... + d_L) x t_other                everything else, per activation element: bias,
                                                             relu, loss, the backward's elementwise kernels,
                                                             allocation, the optimizer step
    comm     = sum_l  latency + (send + halo) x w_l x 4 bytes x t_byte       forward, and again backward
    exposed  = sum_l  max(0, comm_l - 2 x nnz_inner x w_l x t_spmm)          overlapped with the inner SpMMs
    epoch(K) = max over ranks of  compute + exposed + gradient sync

Bytes are predicted exactly (they are what the engine sends); times are as good as the rates, which the
benchmark measures on this machine (``haloflow bench gcn-dist``). ``t_other`` is what a whole single-process
training step measures beyond the first three terms, divided by its activation elements: without it the model
under-predicted the measured epoch by 30-43% at K = 1 and 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from haloflow.errors import ConfigError
from haloflow.models.gcn import GCNConfig
from haloflow.partition.types import GraphPart

__all__ = ["Rates", "PartLoad", "EpochCost", "halo_bytes_per_epoch", "predict_epoch"]

_FLOAT_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class Rates:
    """Seconds per unit of work on one rank, measured (see the module docstring)."""

    spmm_s: float  # per stored entry x column of a CSR @ dense product
    gemm_s: float  # per multiply-add of a dense product
    elem_s: float  # per element of keyed dropout
    byte_s: float  # per byte a rank sends or receives in an all-to-all (1 / bandwidth)
    latency_s: float = 0.0  # per collective
    other_s: float = 0.0  # per activation element of a training step, for the work the other terms leave out

    def __post_init__(self) -> None:
        for name in ("spmm_s", "gemm_s", "elem_s", "byte_s", "latency_s", "other_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"Rates.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class PartLoad:
    """The statistics of one part that set its cost."""

    n_inner: int
    n_halo: int
    n_send: int
    nnz_inner: int  # stored entries with an inner column (self-loops excluded)
    nnz_halo: int

    @classmethod
    def from_part(cls, part: GraphPart) -> "PartLoad":
        inner = int(np.count_nonzero(np.asarray(part.indices) < part.n_inner))
        return cls(n_inner=part.n_inner, n_halo=part.n_halo, n_send=int(np.asarray(part.send_ids).size),
                   nnz_inner=inner, nnz_halo=int(np.asarray(part.indices).size) - inner)

    @classmethod
    def whole(cls, num_nodes: int, nnz: int) -> "PartLoad":
        """The single-process run: one part, no halo."""
        return cls(n_inner=num_nodes, n_halo=0, n_send=0, nnz_inner=nnz, nnz_halo=0)


@dataclass(frozen=True)
class EpochCost:
    """Seconds of one rank's epoch, by kind; adds like a vector."""

    compute_s: float = 0.0
    comm_s: float = 0.0  # the exchanges' own duration
    exposed_s: float = 0.0  # the part of comm not hidden behind compute

    def __add__(self, other: "EpochCost") -> "EpochCost":
        return EpochCost(self.compute_s + other.compute_s, self.comm_s + other.comm_s,
                         self.exposed_s + other.exposed_s)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_s


def _exchange_widths(model: GCNConfig) -> list[int]:
    """The width each exchanging layer aggregates (layers 1.., plus layer 0 without precompute)."""
    d = model.dims
    widths = [d[layer + 1] if model.transform_first(layer) else d[layer] for layer in range(1, model.num_layers)]
    return ([d[0]] if not model.precompute_first else []) + widths


def halo_bytes_per_epoch(loads: list[PartLoad], model: GCNConfig) -> int:
    """Bytes all ranks send in one training step: halo rows forward plus halo gradients backward."""
    rows = sum(p.n_send + p.n_halo for p in loads)  # sent forward + sent back (each halo row once per direction)
    return rows * sum(_exchange_widths(model)) * _FLOAT_BYTES


def _rank_cost(load: PartLoad, model: GCNConfig, rates: Rates, overlap: bool) -> EpochCost:
    d, n = model.dims, load.n_inner
    nnz = load.nnz_inner + load.nnz_halo + (n if model.norm == "gcn" else 0)  # + self-loops
    cost = EpochCost(compute_s=2 * n * d[0] * d[1] * rates.gemm_s + n * d[0] * rates.elem_s  # layer 0 (cached)
                     + n * sum(d[1:]) * rates.other_s)
    widths = _exchange_widths(model)
    if not model.precompute_first:
        widths = widths[1:]
        cost += EpochCost(compute_s=nnz * d[0] * rates.spmm_s)  # layer 0 aggregates the input each epoch
    for layer, w in zip(range(1, model.num_layers), widths):
        compute = (2 * nnz * w * rates.spmm_s + 3 * n * d[layer] * d[layer + 1] * rates.gemm_s
                   + n * d[layer] * rates.elem_s)
        comm = 0.0
        if load.n_halo or load.n_send:
            comm = 2 * (rates.latency_s + (load.n_send + load.n_halo) * w * _FLOAT_BYTES * rates.byte_s)
        hidden = 2 * (load.nnz_inner + n) * w * rates.spmm_s if overlap else 0.0
        cost += EpochCost(compute_s=compute, comm_s=comm, exposed_s=max(0.0, comm - hidden))
    return cost


def predict_epoch(loads: list[PartLoad], model: GCNConfig, rates: Rates, *, overlap: bool = True) -> EpochCost:
    """The cost of the slowest rank (everyone waits for it at the exchanges); K = len(loads)."""
    if not loads:
        raise ConfigError("predict_epoch needs at least one part")
    costs = [_rank_cost(load, model, rates, overlap) for load in loads]
    params = sum(d_in * d_out + d_out for d_in, d_out in zip(model.dims[:-1], model.dims[1:]))
    k = len(loads)
    # reduce-scatter + all-gather: 2 P (K-1) / K floats per rank, two latencies
    sync = (2 * rates.latency_s + 2 * params * (k - 1) / k * _FLOAT_BYTES * rates.byte_s) if k > 1 else 0.0
    worst = max(costs, key=lambda c: c.total_s)
    return worst + EpochCost(comm_s=sync, exposed_s=sync)
