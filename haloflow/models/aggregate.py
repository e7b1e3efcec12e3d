"""Neighbour aggregation, injected into the models: the `Aggregator` protocol and its single-device form.

A model never knows about ranks: it hands ``h`` (one row per node this process owns) to ``agg.aggregate(layer,
h)`` and gets back one row per owned node. Single-device, `LocalAggregator` is one `SparseOperator` product; the
distributed engine implements the same protocol with a halo exchange, using `normalized_values` and
`self_loop_values` so that every edge gets the same value as here (normalisation uses *global* degrees).

Normalisations (``A[v, u] = 1`` for an edge u -> v, i.e. row v lists v's in-neighbours)::

    "gcn"   A_hat = D^-1/2 (A + I) D^-1/2,  D = diag(in_degree + 1)       (Kipf & Welling; PyG gcn_norm)
            A_hat[v, u] = 1 / sqrt((deg_v + 1) (deg_u + 1)),  A_hat[v, v] += 1 / (deg_v + 1)
    "mean"  A_mean[v, u] = 1 / deg_v,  no self-loop; a node without in-neighbours aggregates to 0

    4-node example (edges 0->1, 1->0, 1->2, 2->1, 3->2; in-degrees [1, 2, 2, 0]), "gcn":
        row 1 = h0 / sqrt(3*2) + h1 / 3 + h2 / sqrt(3*3)

``deg`` counts the in-edges of the graph as stored. For PyG's exact ``gcn_norm`` a graph must not hold
self-loops of its own (PyG keeps an existing self-loop instead of adding a second one); build it with
``CSRGraph.from_edges(..., drop_self_loops=True)``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError
from haloflow.models.spmm import DEFAULT_KERNEL, SparseOperator

__all__ = [
    "Aggregator",
    "BlockAggregator",
    "LocalAggregator",
    "NORMS",
    "normalized_values",
    "self_loop_values",
    "add_diagonal",
]

NORMS = ("gcn", "mean")


@runtime_checkable
class Aggregator(Protocol):
    """What a model calls to gather neighbour rows."""

    def aggregate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """(n_own, F) -> (n_own, F): row v = sum over in-neighbours u of v (plus the self-loop for "gcn") of
        norm(u, v) * h[u], where rows of remote u come from their owners. Differentiable in h."""
        ...


@runtime_checkable
class BlockAggregator(Aggregator, Protocol):
    """An `Aggregator` over several blocks of rows at once (a process hosting several parts of a graph): what
    ``GCN.forward_blocks`` calls with more than one block."""

    def aggregate_blocks(self, layer: int, hs: list[torch.Tensor]) -> list[torch.Tensor]:
        """[(n_b, F)] -> [(n_b, F)]: ``aggregate`` of each block, every block's rows computed on their own; the
        blocks' remote neighbours (in other blocks or processes) gathered together."""
        ...


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ConfigError(f"norm must be one of {NORMS}, got {norm!r}")


def normalized_values(
    indptr: np.ndarray,
    indices: np.ndarray,
    row_gdeg_in: np.ndarray,
    col_gdeg_in: np.ndarray,
    norm: str,
) -> np.ndarray:
    """The value of every stored entry (v, u) of an adjacency block, from *global* in-degrees.

    Args:
        indptr: (R+1,) row offsets of the block; indices: (nnz,) its columns.
        row_gdeg_in: (R,) global in-degree of each row node; col_gdeg_in: (C,) of each column node.
        norm: ``"gcn"`` or ``"mean"`` (see the module docstring). The self-loop is *not* included here.

    Returns:
        float32 (nnz,), computed in float64 and rounded once, so every rank gets bit-identical values per edge.
    """
    _check_norm(norm)
    counts = np.diff(indptr)  # (R,)
    row_deg = np.asarray(row_gdeg_in, dtype=np.float64)
    if row_deg.shape != counts.shape:
        raise ConfigError(f"row_gdeg_in has shape {row_deg.shape}, expected ({counts.shape[0]},): one per row")
    if norm == "mean":
        if np.any((counts > 0) & (row_deg <= 0)):
            raise ConfigError("a row with stored entries has global in-degree 0; degrees do not match the graph")
        inv = np.divide(1.0, row_deg, out=np.zeros_like(row_deg), where=row_deg > 0)
        return np.repeat(inv, counts).astype(np.float32)
    col_deg = np.asarray(col_gdeg_in, dtype=np.float64)
    if indices.size and int(indices.max()) >= col_deg.shape[0]:
        raise ConfigError(f"column {int(indices.max())} has no degree: col_gdeg_in has {col_deg.shape[0]} entries")
    row_scale = 1.0 / np.sqrt(row_deg + 1.0)  # (R,)
    col_scale = 1.0 / np.sqrt(col_deg + 1.0)  # (C,)
    return (np.repeat(row_scale, counts) * col_scale[indices]).astype(np.float32)


def self_loop_values(row_gdeg_in: np.ndarray, norm: str) -> np.ndarray | None:
    """The diagonal added for ``norm``: ``1 / (deg_v + 1)`` (float32 (R,)) for "gcn", None for "mean"."""
    _check_norm(norm)
    if norm == "mean":
        return None
    return (1.0 / (np.asarray(row_gdeg_in, dtype=np.float64) + 1.0)).astype(np.float32)


def add_diagonal(
    indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, diag: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR arrays of ``A + diag(diag)`` for a block whose first R columns are the R rows (square or [inner|halo]).

    The new entry (v, v) goes in column order inside row v; an existing (v, v) entry is kept beside it (they sum).
    Rows whose columns are already sorted (every CSRGraph) take a linear merge, O(nnz + R); others a sort (a sort
    took 24 s of the 35 s start-up of a 50 M-entry graph).
    """
    n_rows = indptr.shape[0] - 1
    counts = np.diff(indptr)
    rows = np.repeat(np.arange(n_rows, dtype=np.int64), counts)  # (nnz,)
    cols = np.asarray(indices, dtype=np.int64)  # (nnz,)
    vals = np.asarray(values)
    diag = np.asarray(diag, dtype=vals.dtype)
    new_indptr = np.asarray(indptr, dtype=np.int64) + np.arange(n_rows + 1, dtype=np.int64)
    nnz = cols.shape[0]
    if nnz > 1 and not np.all((cols[1:] >= cols[:-1]) | (rows[1:] != rows[:-1])):
        all_rows = np.concatenate([rows, np.arange(n_rows, dtype=np.int64)])  # (nnz + R,)
        all_cols = np.concatenate([cols, np.arange(n_rows, dtype=np.int64)])
        order = np.lexsort((all_cols, all_rows))  # by row, then column; stable: an existing (v, v) comes first
        return new_indptr, all_cols[order], np.concatenate([vals, diag])[order]
    after = cols > rows  # (nnz,) entries that the row's new diagonal precedes
    before_diag = counts - np.bincount(rows[after], minlength=n_rows)  # (R,) entries of row v with column <= v
    out_cols = np.empty(nnz + n_rows, dtype=np.int64)
    out_vals = np.empty(nnz + n_rows, dtype=vals.dtype)
    entry_pos = np.arange(nnz, dtype=np.int64) + rows + after  # one new diagonal per earlier row, +1 past its own
    diag_pos = new_indptr[:-1] + before_diag
    out_cols[entry_pos], out_vals[entry_pos] = cols, vals
    out_cols[diag_pos], out_vals[diag_pos] = np.arange(n_rows, dtype=np.int64), diag
    return new_indptr, out_cols, out_vals


class LocalAggregator:
    """Single-device aggregation: one `SparseOperator` (N, N) built once from a `CSRGraph`.

    Args:
        graph: row v lists v's in-neighbours.
        norm: ``"gcn"`` (``D^-1/2 (A+I) D^-1/2``, D = in-degree + 1) or ``"mean"`` (``1/in-degree``, no self-loop).
        kernel: SpMM kernel, see `haloflow.models.spmm`.

    Shapes:
        ``aggregate(layer, h)``: (N, F) -> (N, F); the same operator for every layer.
    """

    def __init__(self, graph: CSRGraph, norm: str = "gcn", *, kernel: str = DEFAULT_KERNEL):
        _check_norm(norm)
        self.norm = norm
        deg = graph.in_degree()  # (N,)
        values = normalized_values(graph.indptr, graph.indices, deg, deg, norm)  # (nnz,)
        indptr, indices = graph.indptr, graph.indices
        if norm == "gcn":
            indptr, indices, values = add_diagonal(indptr, indices, values, self_loop_values(deg, norm))
        self.op = SparseOperator(indptr, indices, values, (graph.num_nodes, graph.num_nodes), kernel=kernel)

    def aggregate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        return self.op @ h  # (N, F)

    def __repr__(self) -> str:
        return f"LocalAggregator(norm={self.norm!r}, {self.op!r})"
