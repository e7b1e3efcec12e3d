"""``--method auto``: the smallest cut among METIS and the partitioning libraries present, within a time budget.

The rule (also in ``haloflow partition --help``)::

    1. METIS runs (always present); its wall time t sets the budget B = time_budget x t (default 3t)
    2. the libraries installed, best quality first (order below), each runs when  spent + predicted <= B:
         predicted = rate x CSR entries x log2(K) / 2,  divided by threads / 2 for the threaded libraries,
         times max(1, load average / CPUs) (a busy machine runs them slower: measured below),
         the rates measured here (2 shared cores); after each run, the predictions still to come are scaled by
         that run's measured / predicted
    3. the smallest edge cut wins (METIS on a tie), so auto never cuts more than METIS

    order   candidate          rate, us per CSR entry at K = 4 (measured 2026-12-06, FE mesh 15.6k, Delaunay 100k,
                                                                USA-road-NE 1.5M nodes; K = 16 about 2x)
    1       kahip strong       12     (3.6 - 12)
    2       mtkahypar strong    2.5   (1.2 - 2.2)
    3       kaminpar strong     0.75  (0.54 - 0.73)
    4       kaminpar eco        0.6   (0.2 - 0.57)
    5       kaminpar fast       0.55  (0.21 - 0.53)

Why rates per entry and not ratios to METIS's time: METIS's own rate varies 4x between graphs (0.1 us per entry on
the FE mesh, 0.43 on the road network), the libraries' much less, so a ratio to METIS predicts badly (KaMinPar
strong took 17x METIS's time on the FE mesh, 1.6x on the road network). At the default budget auto keeps METIS on
small meshes (a library's fixed cost alone is over 2x METIS's 10 ms there) and KaMinPar on the road network (its
strong preset cut 0.53x METIS's edges at K = 4 in 1.6x the time). ``spent`` counts only the partitioners' calls,
not the cut counting between them (one pass over the adjacency).

Why the load average: in the benchmark of 2026-12-06 (load average 5-6 on the 2 cores from other jobs) KaMinPar
strong on USA-road-NE K = 4 took 3.9 s and Mt-KaHyPar 21.6 s against 2.7 s and 4.8 s an hour earlier, and auto,
predicting from the quiet rates, took 5.7x METIS's time. The load average is what the kernel measures of that
contention, so it scales the predictions (and a loaded machine keeps METIS).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from haloflow.partition.external import kahip_partition, mtkahypar_partition
from haloflow.partition.fennel import cut_entries
from haloflow.partition.kaminpar import kaminpar_partition
from haloflow.partition.metis import metis_partition

__all__ = ["auto_partition", "AutoChoice", "AUTO_CANDIDATES", "DEFAULT_TIME_BUDGET"]

log = logging.getLogger(__name__)

DEFAULT_TIME_BUDGET = 3.0  # x METIS's time: the bound for auto


@dataclass(frozen=True)
class _Candidate:
    method: str
    preset: str
    rate: float  # predicted seconds per CSR entry at K = 4 on 2 threads (module docstring)
    threaded: bool


AUTO_CANDIDATES = (
    _Candidate("kahip", "strong", 12e-6, False),
    _Candidate("mtkahypar", "strong", 2.5e-6, True),
    _Candidate("kaminpar", "strong", 0.75e-6, True),
    _Candidate("kaminpar", "eco", 0.6e-6, True),
    _Candidate("kaminpar", "fast", 0.55e-6, True),
)
_CALLS = {"kaminpar": kaminpar_partition, "mtkahypar": mtkahypar_partition, "kahip": kahip_partition}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # sys.modules[module] is None: imports of it are blocked
        return False


@dataclass(frozen=True)
class AutoChoice:
    """What auto ran and kept: ``tried`` lists (method/preset, cut entries, seconds) in order."""

    winner: str
    tried: tuple[tuple[str, int, float], ...]


def auto_partition(xadj: np.ndarray, adjncy: np.ndarray, num_parts: int, *, vweights: np.ndarray | None = None,
                   imbalance: float = 1.05, seed: int = 0, time_budget: float = DEFAULT_TIME_BUDGET,
                   threads: int | None = None) -> tuple[np.ndarray, AutoChoice]:
    """int64 (N,) parts of the smallest cut found by the module docstring's rule, and what it tried."""
    t0 = time.perf_counter()
    best = metis_partition(xadj, adjncy, num_parts, vweights=vweights, imbalance=imbalance, seed=seed)
    unit = max(time.perf_counter() - t0, 1e-3)  # METIS's seconds
    spent = unit
    best_cut = cut_entries(xadj, adjncy, best)
    tried = [("metis", best_cut, unit)]
    winner = "metis"
    if num_parts > 1:
        threads = threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
        cpus = os.cpu_count() or 1
        busy = max(1.0, os.getloadavg()[0] / cpus) if hasattr(os, "getloadavg") else 1.0
        scale = busy  # measured / predicted of the last library run; before any, the machine's load
        for c in AUTO_CANDIDATES:
            if not _installed(c.method):
                continue
            base = (c.rate * adjncy.shape[0] * max(math.log2(num_parts), 1.0) / 2
                    * (2.0 / max(threads, 1) if c.threaded else 1.0))
            predicted = base * scale
            if spent + predicted > time_budget * unit:
                continue
            t1 = time.perf_counter()
            parts = _CALLS[c.method](xadj, adjncy, num_parts, vweights=vweights, imbalance=imbalance, seed=seed,
                                     preset=c.preset)
            took = time.perf_counter() - t1
            spent += took
            scale = took / base
            cut = cut_entries(xadj, adjncy, parts)
            tried.append((f"{c.method}/{c.preset}", cut, took))
            if cut < best_cut:
                best, best_cut, winner = parts, cut, f"{c.method}/{c.preset}"
    log.info("auto: kept %s; tried (method, cut entries, seconds) %s within %.1fx METIS's %.3f s (load average "
             "%.1f)", winner, tried, time_budget, unit, os.getloadavg()[0] if hasattr(os, "getloadavg") else -1)
    return best, AutoChoice(winner=winner, tried=tuple(tried))
