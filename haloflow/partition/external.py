"""KaHIP and Mt-KaHyPar as partitioning methods (``--method kahip``, ``--method mtkahypar``): optional packages.

::

    symmetric loop-free adjacency (metis.symmetric_adjacency)      the same input METIS gets
      kahip      kahip.kaffpa(vwgt, xadj, adjcwgt, adjncy, K, eps, quiet, seed, MODE)     KaFFPa (Sanders &
                 Schulz, SEA'13; https://github.com/KaHIP/KaHIP), multilevel with flow-based refinement
      mtkahypar  mtkahypar.initialize(threads) -> context from a preset, objective CUT, K, eps; graph from the
                 edge list (Gottesbueren et al., ALENEX'22)
      kaminpar   kaminpar.py (its own file: the graph goes over as a binary file)
    -> parts (N,), then the same balance step as every method (partition/api.py)

Presets (``--preset``), one name for the three libraries; each is the library's own configuration::

    preset   kahip    mtkahypar               kaminpar
    fast     FAST     DETERMINISTIC           fast
    eco      ECO      DEFAULT                 eco
    strong   STRONG   DETERMINISTIC_QUALITY   strong      (the default: a library is asked for for its quality)

Mt-KaHyPar's fast and strong presets are deterministic (the same seed, the same parts); its eco (DEFAULT) is not on
several threads, nor is KaMinPar (``kaminpar.py``).

The imbalance they get is METIS's: ``eps = min(imbalance, 1.03) - 1``, every part at most ``(1 + eps) x`` the
mean part's weight, as METIS's k-way default (ufactor 30) allows; ``partition_graph``'s rebalancing then holds
``imbalance`` as for every method. Why ``--method kahip`` cut more than METIS before (measured 2026-12-06, 2 shared
cores, cut relative to METIS): it ran KaHIP's FAST mode; the imbalance (5 % against METIS's 3 %) was not the cause,
FAST cuts about as much at 5 % as at 3 % (Delaunay 100k K = 16: FAST 1.098x at 3 %, 1.091x at 5 %; STRONG 0.888x;
FE mesh 15.6k K = 16: FAST 1.011x, STRONG 0.901x). Mt-KaHyPar's HIGHEST_QUALITY cuts like DETERMINISTIC_QUALITY
there (0.874 / 0.861 at K = 4) but is not deterministic, so strong keeps the deterministic one.

Neither package is a hard dependency (``pip install kahip mtkahypar kaminpar``, or the ``partitioners`` extra);
without it the method is one clear line naming the package.
"""

from __future__ import annotations

import os

import numpy as np

from haloflow.errors import ConfigError

__all__ = ["kahip_partition", "mtkahypar_partition", "require", "library_eps", "EXTERNAL_METHODS", "PRESETS",
           "DEFAULT_PRESET"]

EXTERNAL_METHODS = ("kahip", "mtkahypar", "kaminpar")
PRESETS = ("fast", "eco", "strong")
DEFAULT_PRESET = "strong"
METIS_IMBALANCE = 1.03  # METIS's k-way default (ufactor 30): what every library gets at most, for a fair cut

_KAHIP_MODES = {"fast": "FAST", "eco": "ECO", "strong": "STRONG"}
_MTKAHYPAR_PRESETS = {"fast": "DETERMINISTIC", "eco": "DEFAULT", "strong": "DETERMINISTIC_QUALITY"}


def require(module: str, method: str | None = None):
    """Import an optional package, or raise the one-line ``ConfigError`` that names what to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"method {method or module!r} needs the {module} package, which is not installed: pip "
                          f"install {module} (or haloflow[partitioners]), or choose --method metis",
                          field="method") from None


def library_eps(imbalance: float) -> float:
    """The ``eps`` a library gets: METIS's 3 % or the tighter ``imbalance`` (module docstring)."""
    return float(min(imbalance, METIS_IMBALANCE) - 1.0)


def _check_preset(preset: str) -> None:
    if preset not in PRESETS:
        raise ConfigError(f"preset must be one of {', '.join(PRESETS)}; got {preset!r}", field="preset")


def kahip_partition(indptr: np.ndarray, indices: np.ndarray, num_parts: int, *, vweights: np.ndarray | None = None,
                    imbalance: float = 1.05, seed: int = 0, preset: str = DEFAULT_PRESET) -> np.ndarray:
    """int64 (N,) parts by KaFFPa on a symmetric loop-free adjacency; ``vweights`` int (N,) or None."""
    _check_preset(preset)
    kahip = require("kahip")
    n = indptr.shape[0] - 1
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64)
    vwgt = np.ones(n, dtype=np.int32) if vweights is None else np.asarray(vweights, dtype=np.int32)
    _, parts = kahip.kaffpa(vwgt, np.asarray(indptr, dtype=np.int32), np.ones(indices.shape[0], dtype=np.int32),
                            np.asarray(indices, dtype=np.int32), int(num_parts), library_eps(imbalance), True,
                            int(seed), getattr(kahip, _KAHIP_MODES[preset]))
    return np.asarray(parts, dtype=np.int64)


_INIT: dict = {}


def _mtkahypar_init(mtk, threads: int):
    """Mt-KaHyPar's thread pool is made once per process (a second initialize only warns and keeps the first)."""
    if "init" not in _INIT:
        _INIT["init"] = mtk.initialize(threads)
    return _INIT["init"]


def mtkahypar_partition(indptr: np.ndarray, indices: np.ndarray, num_parts: int, *,
                        vweights: np.ndarray | None = None, imbalance: float = 1.05, seed: int = 0,
                        threads: int | None = None, preset: str = DEFAULT_PRESET) -> np.ndarray:
    """int64 (N,) parts by Mt-KaHyPar (cut objective) on a symmetric loop-free adjacency."""
    _check_preset(preset)
    mtk = require("mtkahypar")
    n = indptr.shape[0] - 1
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64)
    init = _mtkahypar_init(mtk, int(threads or os.cpu_count() or 1))
    mtk.set_seed(int(seed))
    context = init.context_from_preset(getattr(mtk.PresetType, _MTKAHYPAR_PRESETS[preset]))
    context.set_partitioning_parameters(int(num_parts), library_eps(imbalance), mtk.Objective.CUT)
    context.logging = False
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))  # (nnz,)
    once = rows < indices  # each undirected edge once
    edges = np.stack([rows[once], np.asarray(indices)[once]], axis=1)  # (m, 2)
    del rows, once
    if vweights is None:
        graph = init.create_graph(context, n, edges.shape[0], edges)
    else:
        graph = init.create_graph(context, n, edges.shape[0], edges, np.asarray(vweights, dtype=np.int64),
                                  np.ones(edges.shape[0], dtype=np.int64))
    parts = graph.partition(context).get_partition()
    return np.asarray(parts, dtype=np.int64)
