"""DLRM's tables in and out of checkpoints, in global terms: rectangles of tables, never rank k's arrays.

What each kind of table module saves (``table_pieces``) and reads back (``load_tables``)::

    EmbeddingTables (one process)        every table whole: weight
    StoreTables (one process, stores)    every table whole: weight + the row optimizer's state (caches flushed)
    ShardedEmbeddingCollection (K ranks) each rank its slots: (table, rows, columns) of weight (+ state);
                                         data-parallel replicas once, by rank 0

Reading cuts each of this run's rectangles out of whatever pieces the writer saved (``LoadedCheckpoint.rows``),
so a checkpoint of a 2-rank row-wise plan loads into one process, or into a 4-rank table-wise plan.
"""

from __future__ import annotations

import torch
from torch import nn

from haloflow.engine.checkpoint import LoadedCheckpoint, Piece
from haloflow.errors import CheckpointError

__all__ = ["table_pieces", "load_tables", "dense_state", "load_dense_state"]


def _rectangles(embeddings: nn.Module, replicas: bool) -> list[tuple[int, tuple[int, int], tuple[int, int], object]]:
    """``(table, rows, cols, holder)`` of every rectangle of this rank (its data-parallel replicas too with
    ``replicas``: every rank loads them, rank 0 alone saves them); ``holder`` is an ``nn.Parameter`` or a row
    store."""
    rectangles = getattr(embeddings, "rectangles", None)
    if rectangles is not None:
        return rectangles(replicas)
    raise TypeError(f"cannot checkpoint tables of type {type(embeddings).__name__}")


def table_pieces(embeddings: nn.Module, rank: int) -> list[Piece]:
    """This rank's rectangles of the tables with their optimizer state (row stores flush their caches first)."""
    pieces = []
    for t, rows, cols, holder in _rectangles(embeddings, replicas=rank == 0):
        arrays = dict(holder.state_dict()) if not isinstance(holder, torch.Tensor) else {"weight": holder.detach()}
        pieces.append(Piece(t, rows, cols, arrays))
    return pieces


@torch.no_grad()
def load_tables(embeddings: nn.Module, loaded: LoadedCheckpoint) -> None:
    """Fill this rank's rectangles (and their optimizer state) from the checkpoint's pieces."""
    for t, rows, cols, holder in _rectangles(embeddings, replicas=True):
        if isinstance(holder, torch.Tensor):
            if loaded.has_rows(t, "sum") or loaded.has_rows(t, "row_sum"):
                raise CheckpointError(f"{loaded.path}: table {t} carries row-optimizer state, but this run's tables "
                                      "are plain parameters")
            holder.copy_(loaded.rows(t, rows, cols, "weight").to(holder.device))
            continue
        names = list(holder.state_dict())  # weight and the optimizer's state arrays
        holder.load_state_dict({n: loaded.rows(t, rows, cols, n) for n in names})


def dense_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """The MLPs' weights and their optimizer state, by parameter name (the same on every rank)."""
    named = dict(_dense_named(model))
    state = {name: {k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
             for name, p in named.items() if p in opt.state}
    others = [p for p in opt.state if all(p is not q for q in named.values())
              and any(torch.is_tensor(v) and v.dim() > 0 for v in opt.state[p].values())]
    if others:
        raise CheckpointError("the tables' torch optimizer holds state that checkpoints do not save; train tables "
                              "with state through row stores (--optimizer adagrad / rowwise_adagrad)")
    return {"weights": {n: p.detach().cpu().clone() for n, p in named.items()}, "optimizer": state}


@torch.no_grad()
def load_dense_state(model: nn.Module, opt: torch.optim.Optimizer, saved: dict, where) -> None:
    named = dict(_dense_named(model))
    if set(saved["weights"]) != set(named):
        raise CheckpointError(f"{where}: the MLP parameters differ: the checkpoint has {sorted(saved['weights'])}, "
                              f"this model {sorted(named)}")
    for name, p in named.items():
        p.copy_(saved["weights"][name].to(p.device))
        if name in saved["optimizer"]:
            opt.state[p] = {k: v.to(p.device) if torch.is_tensor(v) and v.dim() > 0 else v
                            for k, v in saved["optimizer"][name].items()}


def _dense_named(model: nn.Module):
    for prefix in ("bottom", "top"):
        for name, p in getattr(model, prefix).named_parameters():
            yield f"{prefix}.{name}", p
