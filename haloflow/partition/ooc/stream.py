"""Pass 3: the assignment, streamed over the on-disk CSR in vertex order, as ``partition_graph`` computes it.

::

    weights  balance_weights: the in-degrees (from indptr.npy) and the training mask as in memory
    fennel   pass 1..P: for each block of rows read from indices.npy (sequentially, pages released behind):
                 FennelStream.place_rows(block)       the per-vertex step the in-memory Fennel takes, in the
                                                      same order (ids 0..N-1) with the same weights, caps and
                                                      alpha (api.fennel_weights)
    multilevel  (``fennel_start="multilevel"``, an undirected graph) ``multilevel_blocks``: level 0's clustering
             and refinement sweeps stream the blocks in row order as in memory; level 1, built from the cut
             entries, and the coarser levels are in memory when the budget holds them (MULTILEVEL_BYTES_PER_NODE
             and _PER_ENTRY), else one line says it does not fit
    random   random_partition(N, K, seed)             the same seeded permutation
    then     the balance check of ``partition_graph``: the same weights, caps and goals; when the assignment
             already meets them (always for nodes alone: Fennel's hard cap is the cap; for several weights when
             the stream ends within every cap, as in every run measured) nothing moves, as in memory. Otherwise
             ``rebalance`` runs over the CSR memory-mapped (its pages count as resident while it runs; a warning
             says so).

Only ``fennel_order="natural"`` and ``fennel_start="stream"`` or ``"multilevel"`` can stream; ``"auto"`` resolves to
the stream here (so with several weights the weighted stream alone: the in-memory auto's other candidates need the
whole graph, or a pass to compare the cuts).
"""

from __future__ import annotations

import logging

import numpy as np

from haloflow.errors import ConfigError
from haloflow.partition.api import PartitionConfig, fennel_weights
from haloflow.partition.balance import balance_caps, balance_goals, balance_weights, is_balanced, part_loads, rebalance
from haloflow.partition.fennel import FennelStream
from haloflow.partition.ooc.budget import MIN_WORK, MemoryPlan
from haloflow.partition.ooc.disk_csr import DiskCSR
from haloflow.partition.random import random_partition
from haloflow.partition.types import Assignment
from haloflow.utils.memory import format_bytes
from haloflow.utils.progress import progress_bar

__all__ = ["STREAMABLE_METHODS", "streamable_config", "stream_partition"]

log = logging.getLogger(__name__)

STREAMABLE_METHODS = ("fennel", "random")


def streamable_config(config: PartitionConfig) -> PartitionConfig:
    """``config`` with its "auto" choices resolved to what streams; raises ``ConfigError`` for what cannot."""
    from dataclasses import replace

    if config.method not in STREAMABLE_METHODS:
        raise ConfigError(f"--memory-budget streams the graph, and method {config.method!r} needs it whole in memory: "
                          f"expected --method {' or '.join(STREAMABLE_METHODS)} (or no --memory-budget)")
    if config.method == "fennel":
        if config.fennel_start == "bisect":
            raise ConfigError("PartitionConfig.fennel_start='bisect' needs the whole graph in memory; with "
                              "--memory-budget expected stream, multilevel (or auto)")
        if config.fennel_order == "bfs":
            raise ConfigError("PartitionConfig.fennel_order='bfs' visits rows in random order; with --memory-budget "
                              "expected natural (or auto), which reads the on-disk CSR sequentially")
    return replace(config, fennel_start="stream" if config.fennel_start == "auto" else config.fennel_start,
                   fennel_order="natural" if config.fennel_order == "auto" else config.fennel_order)


def _fennel(csr: DiskCSR, config: PartitionConfig, plan: MemoryPlan, weights: np.ndarray, progress: bool,
            on_pass) -> np.ndarray:
    stream = FennelStream(csr.num_nodes, csr.num_edges, config.num_parts, imbalance=config.imbalance,
                          seed=config.seed, parts_dtype=np.int32, **fennel_weights(weights, config))
    with progress_bar(total=config.passes * csr.num_nodes, desc="fennel", unit="node", enabled=progress) as bar:
        for p in range(config.passes):
            for first, indptr, indices in csr.blocks(plan.block_entries, plan.block_rows):
                stream.place_rows(indptr, indices, first, restream=p > 0)
                bar.update(indptr.shape[0] - 1)
            log.info("fennel pass %d/%d done; part sizes %s", p + 1, config.passes, stream.sizes.tolist())
            if on_pass is not None:
                on_pass(f"fennel pass {p + 1}")
    return stream.parts


MULTILEVEL_BYTES_PER_NODE = 72  # labels, cluster weights, connection counts, vertex weights, parts, unique's copies
MULTILEVEL_BYTES_PER_ENTRY = 32  # level 1's cut-entry keys, sorted, counted, split into rows and columns


def _multilevel(csr: DiskCSR, config: PartitionConfig, plan: MemoryPlan, weights: np.ndarray, progress: bool,
                on_pass) -> np.ndarray:
    """The multilevel start (``multilevel.py``) over the on-disk CSR: level 0 streamed in row order, level 1 on
    (built from the cut entries) in memory when the budget holds it."""
    from haloflow.partition.fennel import _multilevel_weight
    from haloflow.partition.multilevel import multilevel_blocks

    n = csr.num_nodes
    if not csr.symmetric:
        raise ConfigError("PartitionConfig.fennel_start='multilevel' needs an undirected graph; with "
                          "--memory-budget and a directed one expected stream (or auto)")
    room = plan.work + n * plan.node_bytes - n * MULTILEVEL_BYTES_PER_NODE
    if room < MIN_WORK:
        raise ConfigError(f"--fennel-start multilevel needs {MULTILEVEL_BYTES_PER_NODE} bytes per node "
                          f"({format_bytes(n * MULTILEVEL_BYTES_PER_NODE)} for {n:,} nodes) beside the rest, and "
                          f"--memory-budget {format_bytes(plan.budget)} leaves {format_bytes(max(room, 0))}: expected "
                          "a larger budget or --fennel-start stream")
    balance = fennel_weights(weights, config)
    with progress_bar(desc="multilevel", unit="sweep", enabled=progress) as bar:
        def tick(name: str) -> None:
            bar.update(1)
            if on_pass is not None:
                on_pass(f"multilevel {name}")

        parts = multilevel_blocks(lambda: csr.blocks(plan.block_entries, plan.block_rows), n, config.num_parts,
                                  imbalance=config.imbalance, seed=config.seed,
                                  vweight=_multilevel_weight(balance.get("weights")),
                                  max_coarse_entries=room // MULTILEVEL_BYTES_PER_ENTRY, on_sweep=tick)
    if parts is None:
        raise ConfigError(f"--fennel-start multilevel: the graph's first coarse level does not fit in what "
                          f"--memory-budget {format_bytes(plan.budget)} leaves ({format_bytes(room)}): expected a "
                          "larger budget or --fennel-start stream")
    return parts.astype(np.int32)


def stream_partition(csr: DiskCSR, config: PartitionConfig, plan: MemoryPlan, *,
                     train_mask: np.ndarray | None = None, progress: bool = False, on_pass=None) -> Assignment:
    """The assignment of ``partition_graph(graph, config)`` for the graph of ``csr`` (module docstring).

    ``on_pass(name)`` is called as each Fennel pass ends (the pipeline times them).

    Returns an ``Assignment`` whose ``parts`` is int32 (N,) (half of int64's memory; the same values).
    """
    n, k = csr.num_nodes, config.num_parts
    if n == 0:
        raise ConfigError("cannot partition an empty graph (0 nodes): expected at least num_parts nodes")
    if k > n:
        raise ConfigError(f"PartitionConfig.num_parts={k} exceeds the graph's {n} nodes: expected 1 <= num_parts <= "
                          f"{n}")
    if "train" in config.balance and train_mask is None:
        raise ConfigError('PartitionConfig.balance includes "train" but the input has no train_mask')
    # balance_weights reads in-degrees only for "edges"; otherwise a zero-byte stand-in gives it N. The weights
    # come before the stream because Fennel balances them as it places (fennel_weights), as in memory.
    in_degree = csr.in_degree() if "edges" in config.balance else np.broadcast_to(np.int64(0), (n,))
    weights = balance_weights(in_degree, config.balance, train_mask)  # (N, W)
    del in_degree
    if k == 1:
        parts = np.zeros(n, dtype=np.int32)
    elif config.method == "fennel" and config.fennel_start == "multilevel":
        parts = _multilevel(csr, config, plan, weights, progress, on_pass)
    elif config.method == "fennel":
        parts = _fennel(csr, config, plan, weights, progress, on_pass)
    else:
        parts = random_partition(n, k, seed=config.seed).astype(np.int32)
    caps = balance_caps(weights, k, config.imbalance)
    goals = balance_goals(weights, k, config.imbalance)
    # rebalance() returns the assignment unchanged when it meets the goals it aims at first (where they are
    # stricter than the caps) or else the caps; only otherwise does it read the adjacency.
    first_aim = np.minimum(goals, caps) if np.any(goals < caps) else caps
    if not is_balanced(parts, weights, first_aim, k):
        log.warning("the assignment is over a balance cap; rebalancing reads the CSR through a memory map (its "
                    "pages count as resident while it runs)")
        indptr = np.load(csr.indptr_path, mmap_mode="r")
        indices = np.load(csr.indices_path, mmap_mode="r")
        parts = rebalance(indptr, indices, parts, weights, caps, k, goals=goals).astype(np.int32)
        del indptr, indices
    log.info("partitioned %d nodes into %d parts with %s (out of core); largest/cap per weight %s", n, k,
             config.method,
             {b: f"{int(l)}/{int(c)}" for b, l, c in zip(config.balance, part_loads(parts, weights, k).max(0), caps)})
    return Assignment(parts=parts, num_parts=k, method=config.method, seed=config.seed)
