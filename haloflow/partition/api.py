"""`partition_graph`: assign every node to one of K parts, balanced on the weights asked for.

::

    PartitionConfig --validate--> method ----------------------------> rebalance -----------> Assignment
                                   metis:  symmetric adjacency, METIS  (only if a weight is    parts (N,) in [0, K)
                                   fennel: streaming over the CSR,      over its cap; see
                                     every balanced weight in its score balance.py)
                                     (auto: or the vertex count's
                                     parts rebalanced, the smaller cut)
                                   random: seeded permutation
                                   kahip / mtkahypar / kaminpar: as
                                     metis, through the optional packages
                                     (external.py, kaminpar.py), --preset
                                   auto: metis, then the libraries present
                                     within a time budget (auto.py)

The cut is counted on edges (an edge is cut when its two ends are in different parts); an edge belongs to its
destination's part, so the "edges" weight of a part is the in-degree sum of its nodes. ``relabel`` then turns
the assignment into contiguous id ranges (the partition book).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError
from haloflow.partition.balance import (BALANCE_WEIGHTS, balance_caps, balance_goals, balance_weights, part_loads,
                                         rebalance)
from haloflow.partition.fennel import FENNEL_PASSES, FENNEL_STARTS, cut_entries, fennel_partition
from haloflow.partition.auto import DEFAULT_TIME_BUDGET, auto_partition
from haloflow.partition.external import (DEFAULT_PRESET, EXTERNAL_METHODS, PRESETS, kahip_partition,
                                         mtkahypar_partition)
from haloflow.partition.kaminpar import kaminpar_partition
from haloflow.partition.metis import metis_partition, symmetric_adjacency
from haloflow.partition.random import random_partition
from haloflow.partition.types import Assignment

__all__ = ["METHODS", "FENNEL_ORDER_CHOICES", "PartitionConfig", "partition_graph", "fennel_weights"]

log = logging.getLogger(__name__)

METHODS = ("metis", "fennel", "random", "kahip", "mtkahypar", "kaminpar", "auto")
_EXTERNAL = {"kahip": kahip_partition, "mtkahypar": mtkahypar_partition, "kaminpar": kaminpar_partition}
FENNEL_ORDER_CHOICES = ("auto", "bfs", "natural")


MAX_SEED = 2**31 - 1  # the partitioners' C libraries take a 32-bit int

@dataclass(frozen=True, kw_only=True)
class PartitionConfig:
    """How to partition.

    Args:
        num_parts: K, the number of parts (1 <= K <= number of nodes).
        method: ``"metis"``, ``"fennel"`` (streaming, O(nodes) memory, fast), ``"random"``, the optional
            ``"kahip"`` / ``"mtkahypar"`` / ``"kaminpar"`` (``external.py``, ``kaminpar.py``; their packages
            installed; METIS's 3 % imbalance), or ``"auto"`` (``auto.py``: METIS, then the libraries present
            within ``time_budget``, the smallest cut kept).
        balance: weights to balance, any of ``"nodes"``, ``"edges"`` (in-edges), ``"train"`` (training nodes).
        imbalance: every balanced weight ends with largest part <= imbalance x mean part (see balance.py for the
            floor used when rounding or one heavy node makes that impossible).
        seed: makes every method deterministic (the same seed gives the same parts; kaminpar, and auto when it
            keeps kaminpar, only on one thread: ``kaminpar.py``); 0 is METIS's own default.
        chunk_size: fennel only, vertices per streamed chunk (bounds the rows read at once).
        fennel_start: fennel only, ``"auto"`` (default: the stream and bisect starts, then multilevel when the
            bisection cut less than the stream, the smallest cut wins; out of core the stream),
            ``"stream"`` (plain Fennel, the fastest),
            ``"multilevel"`` (coarsened by label propagation and refined level by level: road networks and meshes,
            where it cuts 0.8-1.2x METIS's edges) or ``"bisect"`` (recursive BFS bisection, then restreaming); see
            ``haloflow.partition.fennel`` and ``haloflow.partition.multilevel``.
        fennel_order: fennel only, the order vertices are streamed in: ``"auto"`` (default: BFS in memory, id order
            out of core, which reads the CSR sequentially), ``"bfs"`` or ``"natural"`` (ids 0..N-1).
        passes: fennel only, streaming passes: 1 = plain Fennel, more = restreaming passes that re-place each
            vertex knowing the previous pass's assignment.
        preset: kahip, mtkahypar and kaminpar: ``"fast"``, ``"eco"`` or ``"strong"`` (default; the libraries'
            own configurations, mapped in ``external.py``).
        time_budget: auto only, the time the libraries may take, in multiples of METIS's measured time (default
            3.0; METIS's own run included).
    """

    num_parts: int
    method: str = "metis"
    balance: tuple[str, ...] = ("nodes",)
    imbalance: float = 1.05  # METIS's own default is 1.03 (k-way); 5% leaves room for a second weight
    seed: int = 0
    chunk_size: int = 1 << 20  # 1M vertices: ~8 MiB of indptr per chunk
    fennel_start: str = "auto"
    fennel_order: str = "auto"
    passes: int = FENNEL_PASSES  # one streaming pass + 3 restreaming passes (measured in fennel.py's docstring)
    preset: str = DEFAULT_PRESET  # a library is chosen for its quality: strong (external.py's measurements)
    time_budget: float = DEFAULT_TIME_BUDGET

    def __post_init__(self) -> None:
        if isinstance(self.balance, str):  # balance="edges" would otherwise be read letter by letter
            object.__setattr__(self, "balance", (self.balance,))
        object.__setattr__(self, "balance", tuple(self.balance))
        if isinstance(self.num_parts, bool) or not isinstance(self.num_parts, (int, np.integer)) or self.num_parts < 1:
            raise ConfigError(f"PartitionConfig.num_parts must be an integer >= 1, got {self.num_parts!r}")
        if self.method not in METHODS:
            raise ConfigError(f"PartitionConfig.method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if not self.balance:
            raise ConfigError(f"PartitionConfig.balance must name at least one of {', '.join(BALANCE_WEIGHTS)}")
        for name in self.balance:
            if name not in BALANCE_WEIGHTS:
                raise ConfigError(
                    f"PartitionConfig.balance: unknown weight {name!r}, expected any of {', '.join(BALANCE_WEIGHTS)}"
                )
        if len(set(self.balance)) != len(self.balance):
            raise ConfigError(f"PartitionConfig.balance names a weight twice: {self.balance!r}")
        if not (self.imbalance >= 1.0 and math.isfinite(self.imbalance)):
            raise ConfigError(f"PartitionConfig.imbalance must be a finite number >= 1.0 (largest part / mean part), "
                              f"got {self.imbalance}")
        if not isinstance(self.seed, (int, np.integer)) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"PartitionConfig.seed must be an integer in [0, {MAX_SEED}] (METIS and KaHIP take a "
                              f"32-bit seed), got {self.seed!r}")
        if not isinstance(self.chunk_size, (int, np.integer)) or self.chunk_size < 1:
            raise ConfigError(f"PartitionConfig.chunk_size must be an integer >= 1, got {self.chunk_size!r}")
        if self.fennel_order not in FENNEL_ORDER_CHOICES:
            raise ConfigError(f"PartitionConfig.fennel_order must be one of {', '.join(FENNEL_ORDER_CHOICES)}; got "
                              f"{self.fennel_order!r}")
        passes = self.passes
        if isinstance(passes, bool) or not isinstance(passes, (int, np.integer)) or not 1 <= passes <= 1000:
            raise ConfigError(f"PartitionConfig.passes must be an integer in 1..1000, got {self.passes!r}")
        if self.preset not in PRESETS:
            raise ConfigError(f"PartitionConfig.preset must be one of {', '.join(PRESETS)}; got {self.preset!r}")
        if isinstance(self.time_budget, bool) or not (isinstance(self.time_budget, (int, float))
                                                      and math.isfinite(self.time_budget) and self.time_budget >= 1):
            raise ConfigError(f"PartitionConfig.time_budget must be a finite number >= 1 (x METIS's time), got "
                              f"{self.time_budget!r}")
        if self.fennel_start not in FENNEL_STARTS:
            raise ConfigError(
                f"PartitionConfig.fennel_start must be one of {', '.join(FENNEL_STARTS)}; got {self.fennel_start!r}"
            )


def partition_graph(
    graph: CSRGraph,
    config: PartitionConfig,
    *,
    train_mask: np.ndarray | None = None,
    progress: bool = False,
) -> Assignment:
    """Assign each node of ``graph`` to a part.

    Args:
        graph: the graph (its CSR arrays may be ``np.memmap``s; random, and fennel started by stream or bisect,
            then never load the edges; the multilevel start, and so auto, copies them).
        config: see :class:`PartitionConfig`.
        train_mask: bool (N,), needed when ``"train"`` is balanced.
        progress: show a progress bar (only when stderr is a terminal).

    Returns:
        ``Assignment`` with ``parts`` int64 (N,) in [0, K).
    """
    train_mask = _check_inputs(graph, config, train_mask)
    k = config.num_parts
    weights = balance_weights(np.diff(np.asarray(graph.indptr)), config.balance, train_mask)  # (N, W)
    caps = balance_caps(weights, k, config.imbalance)  # (W,)
    indptr, indices = graph.indptr, graph.indices  # adjacency that prices the rebalancing moves
    if config.method == "metis":
        indptr, indices = symmetric_adjacency(graph.indptr, graph.indices, graph.num_nodes,
                                              known_symmetric=graph.simple_symmetric)
        parts = metis_partition(
            indptr, indices, k, vweights=_metis_weight(weights, config.balance), imbalance=config.imbalance,
            seed=config.seed,
        )
    elif config.method in EXTERNAL_METHODS:
        indptr, indices = symmetric_adjacency(graph.indptr, graph.indices, graph.num_nodes,
                                              known_symmetric=graph.simple_symmetric)
        parts = _EXTERNAL[config.method](indptr, indices, k, vweights=_metis_weight(weights, config.balance),
                                         imbalance=config.imbalance, seed=config.seed, preset=config.preset)
    elif config.method == "auto":
        indptr, indices = symmetric_adjacency(graph.indptr, graph.indices, graph.num_nodes,
                                              known_symmetric=graph.simple_symmetric)
        parts, _ = auto_partition(indptr, indices, k, vweights=_metis_weight(weights, config.balance),
                                  imbalance=config.imbalance, seed=config.seed, time_budget=config.time_budget)
    elif config.method == "fennel":
        parts = _fennel(graph, config, weights, progress)
    else:
        parts = random_partition(graph.num_nodes, k, seed=config.seed)
    parts = rebalance(indptr, indices, parts, weights, caps, k, goals=balance_goals(weights, k, config.imbalance))
    log.info(
        "partitioned %d nodes into %d parts with %s; largest/cap per weight %s",
        graph.num_nodes, k, config.method,
        {b: f"{int(l)}/{int(c)}" for b, l, c in zip(config.balance, part_loads(parts, weights, k).max(0), caps)},
    )
    return Assignment(parts=parts, num_parts=k, method=config.method, seed=config.seed)


def fennel_weights(weights: np.ndarray, config: PartitionConfig) -> dict:
    """Fennel's balance arguments for ``config``: none for the vertex count alone (the paper's score, capped at
    ``imbalance * N / K``); otherwise every balanced weight with its strict goal as the hard cap, so that an
    assignment that meets them all leaves the rebalancer nothing to move. The out-of-core stream calls this too.
    """
    if config.balance == ("nodes",):
        return {}
    caps = balance_caps(weights, config.num_parts, config.imbalance)
    goals = balance_goals(weights, config.num_parts, config.imbalance)
    return {"weights": weights, "caps": np.minimum(goals, caps)}


def _fennel(graph: CSRGraph, config: PartitionConfig, weights: np.ndarray, progress: bool) -> np.ndarray:
    """Fennel's assignment, every balanced weight in its score (:func:`fennel_weights`).

    With several weights and ``fennel_start="auto"``, also the vertex count's partition after the rebalancer
    (what Fennel did before it scored every weight); the smaller cut wins, the weighted one on a tie. Where the
    vertex count's parts already come out nearly balanced on the other weights (communities of similar degree),
    the few repairing moves cost less cut than the weighted score, whose penalty moves hubs to even the loads;
    where they hold most edges in one part (a social graph's core: Slashdot K = 4, 3.4 x the mean part's edges),
    the weighted stream wins by far. Out of core, "auto" is the weighted stream alone (``ooc/stream.py``).
    """
    symmetric = None  # the multilevel start's adjacency (the graph's own arrays when it is already one)
    if config.fennel_start in ("multilevel", "auto"):
        symmetric = symmetric_adjacency(graph.indptr, graph.indices, graph.num_nodes,
                                        known_symmetric=graph.simple_symmetric)

    def run(**balance) -> np.ndarray:
        return fennel_partition(
            graph.indptr, graph.indices, config.num_parts, imbalance=config.imbalance, seed=config.seed,
            chunk_size=config.chunk_size, start=config.fennel_start, passes=config.passes,
            order="bfs" if config.fennel_order == "auto" else config.fennel_order, symmetric=symmetric,
            progress=progress, **balance,
        )

    parts = run(**fennel_weights(weights, config))
    if config.balance == ("nodes",) or config.fennel_start != "auto":
        return parts
    k = config.num_parts
    caps = balance_caps(weights, k, config.imbalance)
    goals = balance_goals(weights, k, config.imbalance)
    parts = rebalance(graph.indptr, graph.indices, parts, weights, caps, k, goals=goals)  # no moves when it fits
    repaired = rebalance(graph.indptr, graph.indices, run(), weights, caps, k, goals=goals)
    weighted_cut, repaired_cut = (cut_entries(graph.indptr, graph.indices, p) for p in (parts, repaired))
    log.debug("fennel with %s: cut entries %d weighted, %d by the vertex count then rebalanced",
              "+".join(config.balance), weighted_cut, repaired_cut)
    return repaired if repaired_cut < weighted_cut else parts


def _check_inputs(graph: CSRGraph, config: PartitionConfig, train_mask: np.ndarray | None) -> np.ndarray | None:
    n = graph.num_nodes
    if n == 0:
        raise ConfigError("cannot partition an empty graph (0 nodes): expected at least num_parts nodes")
    if config.num_parts > n:
        raise ConfigError(
            f"PartitionConfig.num_parts={config.num_parts} exceeds the graph's {n} nodes: expected 1 <= num_parts <= {n}"
        )
    if "train" in config.balance and train_mask is None:
        raise ConfigError('PartitionConfig.balance includes "train" but no train_mask was given')
    if train_mask is None:
        return None
    train_mask = np.asarray(train_mask)
    if train_mask.shape != (n,):
        raise ConfigError(f"train_mask must have shape ({n},) like the graph's nodes, got {train_mask.shape}")
    if train_mask.dtype != np.bool_:
        if not np.issubdtype(train_mask.dtype, np.integer) or not np.isin(train_mask, (0, 1)).all():
            raise ConfigError(f"train_mask must be bool (or 0/1 integers), got dtype {train_mask.dtype}")
        train_mask = train_mask.astype(bool)
    return train_mask


def _metis_weight(weights: np.ndarray, balance: tuple[str, ...]) -> np.ndarray | None:
    """The one weight METIS balances: vertex count alone -> None; several -> their sum, each scaled to mean 8.

    The sum brings every balanced weight near its mean, so the rebalancing afterwards has few moves to make.
    """
    if balance == ("nodes",):
        return None
    n = weights.shape[0]
    combined = np.zeros(n, dtype=np.int64)
    for j in range(weights.shape[1]):
        total = int(weights[:, j].sum())
        if total > 0:
            combined += weights[:, j] * (8 * n) // total  # (N,) mean 8 per weight
    return combined if combined.any() else None
