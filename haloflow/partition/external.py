"""KaHIP and Mt-KaHyPar as partitioning methods (``--method kahip``, ``--method mtkahypar``): optional packages.

::

    symmetric loop-free adjacency (metis.symmetric_adjacency)      the same input METIS gets
      kahip      kahip.kaffpa(vwgt, xadj, adjcwgt, adjncy, K, eps, quiet, seed, FAST)     KaFFPa (Sanders &
                 Schulz, SEA'13; https://github.com/KaHIP/KaHIP), multilevel with flow-based refinement
      mtkahypar  mtkahypar.initialize(threads) -> context (DETERMINISTIC preset: the same seed gives the same
                 parts), objective CUT, K, eps; graph from the edge list (Gottesbueren et al., ALENEX'22)
    -> parts (N,), then the same balance step as every method (partition/api.py)

``eps = imbalance - 1``: both libraries cap every part at ``(1 + eps) x ceil(N / K)`` of the balanced weight.
Neither package is a hard dependency (``pip install kahip mtkahypar``, or the ``partitioners`` extra); without
it the method is one clear line.
"""

from __future__ import annotations

import os

import numpy as np

from haloflow.errors import ConfigError

__all__ = ["kahip_partition", "mtkahypar_partition", "EXTERNAL_METHODS"]

EXTERNAL_METHODS = ("kahip", "mtkahypar")


def _require(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"method {module!r} needs the {module} package, which is not installed: pip install "
                          f"{module} (or haloflow[partitioners]), or choose --method metis") from None


def kahip_partition(indptr: np.ndarray, indices: np.ndarray, num_parts: int, *, vweights: np.ndarray | None = None,
                    imbalance: float = 1.05, seed: int = 0) -> np.ndarray:
    """int64 (N,) parts by KaFFPa (mode FAST) on a symmetric loop-free adjacency; ``vweights`` int (N,) or None."""
    kahip = _require("kahip")
    n = indptr.shape[0] - 1
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64)
    vwgt = np.ones(n, dtype=np.int32) if vweights is None else np.asarray(vweights, dtype=np.int32)
    _, parts = kahip.kaffpa(vwgt, np.asarray(indptr, dtype=np.int32), np.ones(indices.shape[0], dtype=np.int32),
                            np.asarray(indices, dtype=np.int32), int(num_parts), float(imbalance - 1.0), True,
                            int(seed), kahip.FAST)
    return np.asarray(parts, dtype=np.int64)


_INIT: dict = {}


def _mtkahypar_init(mtk, threads: int):
    """Mt-KaHyPar's thread pool is made once per process (a second initialize only warns and keeps the first)."""
    if "init" not in _INIT:
        _INIT["init"] = mtk.initialize(threads)
    return _INIT["init"]


def mtkahypar_partition(indptr: np.ndarray, indices: np.ndarray, num_parts: int, *,
                        vweights: np.ndarray | None = None, imbalance: float = 1.05, seed: int = 0,
                        threads: int | None = None) -> np.ndarray:
    """int64 (N,) parts by Mt-KaHyPar (deterministic preset, cut objective) on a symmetric loop-free adjacency."""
    mtk = _require("mtkahypar")
    n = indptr.shape[0] - 1
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64)
    init = _mtkahypar_init(mtk, int(threads or os.cpu_count() or 1))
    mtk.set_seed(int(seed))
    context = init.context_from_preset(mtk.PresetType.DETERMINISTIC)
    context.set_partitioning_parameters(int(num_parts), float(imbalance - 1.0), mtk.Objective.CUT)
    context.logging = False
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))  # (nnz,)
    once = rows < indices  # each undirected edge once
    edges = np.stack([rows[once], np.asarray(indices)[once]], axis=1)  # (m, 2)
    if vweights is None:
        graph = init.create_graph(context, n, edges.shape[0], edges)
    else:
        graph = init.create_graph(context, n, edges.shape[0], edges, np.asarray(vweights, dtype=np.int64),
                                  np.ones(edges.shape[0], dtype=np.int64))
    parts = graph.partition(context).get_partition()
    return np.asarray(parts, dtype=np.int64)
