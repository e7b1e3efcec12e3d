"""KaMinPar as a partitioning method (``--method kaminpar``): an optional package (PyPI ``kaminpar``).

KaMinPar (Gottesbueren, Heuer, Sanders, Schulz, Seemaier, ESA'21; https://github.com/KaMinPar/KaMinPar) is a
shared-memory deep multilevel partitioner: coarsening by size-constrained label propagation down to about 2K
nodes, initial bisections there, uncoarsening with parallel refinement (FM and flows in ``strong``).

::

    symmetric loop-free adjacency (xadj, adjncy), vertex weights or None
      -> one ParHiP binary file in the temporary folder (header, byte offsets, neighbours, weights; below)
      -> kaminpar.load_graph(path, PARHIP) -> KaMinPar(threads, context of the preset).compute_partition(g, K, eps)
      -> parts (N,); the file is removed

The hand-over. kaminpar 3.7.3's Python API takes a graph only from a file (METIS text or ParHiP binary) or from a
NetworKit graph (``kaminpar-networkit``, which needs NetworKit). Measured on a 300 x 300 grid (90k nodes, 359k
entries, 2 shared cores): the ParHiP file is written in 3.5 ms and loaded in 2.6 ms, the METIS text file takes 186
ms to write from Python (one line per node) and 4 ms to load; the partition itself took 42 ms (default preset,
K = 4). The binary file costs 8 (N+1) + 8 nnz (+ 8 N with weights) bytes of temporary disk and about the same again
of memory inside KaMinPar while it holds its own copy; NetworKit would hold one more copy of the graph in memory.
So the binary file it is.

ParHiP layout (all little-endian uint64 here: 64-bit ids and weights)::

    [version, n, m]             version bit 0 = no edge weights, bit 1 = no vertex weights (bits 2, 3 = 0: 64-bit)
    offsets (n+1)               byte position of each node's first neighbour: 24 + 8 (n+1) + 8 xadj[v]
    adjncy (m)                  m = directed entries, 2x the undirected edges
    vertex weights (n)          only when bit 1 is 0

Presets (``external.PRESETS``): the contexts of the same names (``fast_context``, ``eco_context``,
``strong_context``); eps as METIS's
(``external.library_eps``). The same seed gives the same parts on one thread (``kaminpar.reseed``); on several
threads KaMinPar 3.7.3 is not deterministic (measured: 4 runs of a 3,000-node Delaunay mesh at 2 threads gave 4
different partitions of equal quality), and the Python API exposes no deterministic mode. It runs on every CPU
the process may use, for speed; pass ``threads=1`` where the bits must repeat.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from haloflow.partition.external import DEFAULT_PRESET, PRESETS, library_eps, require
from haloflow.errors import ConfigError

__all__ = ["kaminpar_partition", "write_parhip", "parhip_bytes"]

log = logging.getLogger(__name__)

_CONTEXTS = {"fast": "fast_context", "eco": "eco_context", "strong": "strong_context"}


def parhip_bytes(num_nodes: int, nnz: int, weighted: bool) -> int:
    """Size of the temporary ParHiP file (module docstring)."""
    return 24 + 8 * (num_nodes + 1) + 8 * nnz + (8 * num_nodes if weighted else 0)


def write_parhip(path: str | os.PathLike, xadj: np.ndarray, adjncy: np.ndarray,
                 vweights: np.ndarray | None = None) -> None:
    """Write a symmetric adjacency as a ParHiP binary graph (module docstring's layout)."""
    n = xadj.shape[0] - 1
    version = 1 | (0 if vweights is not None else 2)
    with open(path, "wb") as f:
        np.array([version, n, adjncy.shape[0]], dtype="<u8").tofile(f)
        (24 + 8 * (n + 1) + 8 * np.asarray(xadj, dtype=np.int64)).astype("<u8").tofile(f)  # (N+1,) byte offsets
        np.asarray(adjncy).astype("<u8", copy=False).tofile(f)  # (nnz,)
        if vweights is not None:
            np.asarray(vweights).astype("<u8", copy=False).tofile(f)  # (N,)


def kaminpar_partition(indptr: np.ndarray, indices: np.ndarray, num_parts: int, *,
                       vweights: np.ndarray | None = None, imbalance: float = 1.05, seed: int = 0,
                       preset: str = DEFAULT_PRESET, threads: int | None = None,
                       tmp_dir: str | os.PathLike | None = None, context: str | None = None) -> np.ndarray:
    """int64 (N,) parts by KaMinPar on a symmetric loop-free adjacency; ``vweights`` int (N,) or None.

    Args:
        preset: ``fast``, ``eco`` or ``strong`` (module docstring).
        threads: KaMinPar's threads (default: the CPUs this process may run on).
        tmp_dir: where the ParHiP file goes for the moment it is read (default: the system's temporary folder).
        context: one of KaMinPar's own context names (``kaminpar.context_names()``: ``default``, ``largek``,
            ``terapart``, ...) instead of ``preset``; the benchmark's "default" column uses it.
    """
    if preset not in PRESETS:
        raise ConfigError(f"preset must be one of {', '.join(PRESETS)}; got {preset!r}", field="preset")
    kaminpar = require("kaminpar")
    if context is not None and context not in kaminpar.context_names():
        raise ConfigError(f"KaMinPar context must be one of {', '.join(sorted(kaminpar.context_names()))}; got "
                          f"{context!r}")
    n = indptr.shape[0] - 1
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64)
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    fd, name = tempfile.mkstemp(suffix=".parhip", prefix="haloflow-kaminpar-", dir=tmp_dir)
    os.close(fd)
    try:
        write_parhip(name, indptr, indices, vweights)
        graph = kaminpar.load_graph(name, kaminpar.GraphFileFormat.PARHIP)
    finally:
        Path(name).unlink(missing_ok=True)
    kaminpar.reseed(int(seed))
    ctx = kaminpar.context_by_name(context) if context is not None else getattr(kaminpar, _CONTEXTS[preset])()
    parts = kaminpar.KaMinPar(int(threads), ctx).compute_partition(graph, int(num_parts), library_eps(imbalance))
    del graph
    return np.asarray(parts, dtype=np.int64)
