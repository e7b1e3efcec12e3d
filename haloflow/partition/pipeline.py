"""`partition_dataset`: the whole preprocessing flow from a data set to a partition folder.

::

    GraphDataset --partition_graph--> Assignment --relabel--> Relabelling --HaloIndex--> stats
                                                                   |
                         part 0, 1, ..., K-1 (built one at a time) +--> save_partitioned --> DIR/

Only one part's arrays are alive at a time, so peak memory is the graph plus the O(N + halo) index plus one part.
The CLI (`haloflow partition`) parses its arguments into a `PartitionConfig` and calls `read_input` and this.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.partition.api import PartitionConfig, partition_graph
from haloflow.partition.format import NODE_DATA, PartitionMeta, check_output_dir, save_partitioned
from haloflow.partition.halo import HaloBuilder, HaloIndex
from haloflow.partition.relabel import relabel
from haloflow.partition.stats import PartitionStats, format_stats, partition_stats
from haloflow.partition.types import GraphPart
from haloflow.utils.memory import format_bytes, peak_rss_bytes
from haloflow.utils.progress import progress_bar

__all__ = ["PartitionSummary", "partition_dataset", "read_input"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PartitionSummary:
    """What `partition_dataset` did: where, how good (``stats``), how long and how much memory it took."""

    out_dir: Path
    meta: PartitionMeta
    stats: PartitionStats
    wall_time_s: float
    peak_memory_bytes: int  # the process's RSS high-water mark at the end (graph loading included)
    stage_times: dict[str, float] = field(default_factory=dict)  # seconds per stage, in order

    def report(self) -> str:
        """The per-part table, edge cut, balance, then time and memory: what the CLI prints."""
        stages = ", ".join(f"{name} {secs:.2f} s" for name, secs in self.stage_times.items())
        return "\n".join([
            format_stats(self.stats),
            f"wall time: {self.wall_time_s:.2f} s ({stages})",
            f"peak memory: {format_bytes(self.peak_memory_bytes)}",
            f"written to {self.out_dir}",
        ])


def read_input(
    path: str | os.PathLike, *, format: str = "auto", symmetrize: bool = True, **reader_options
) -> GraphDataset:
    """Read a data set for partitioning; with ``symmetrize`` add every reverse edge (and drop duplicates).

    GCN training expects an undirected graph, hence the default; pass False to keep a directed graph as given.
    ``reader_options`` go to ``read_dataset`` (``num_nodes``, ``one_based`` for SNAP; ``name`` for Planetoid;
    ``split`` for OGB). Errors of the reader (file and line of a malformed line) pass through unchanged.
    """
    from haloflow.data.readers import read_dataset

    dataset = read_dataset(path, format=format, **reader_options)
    if symmetrize:
        src, dst = dataset.graph.edges()
        graph = CSRGraph.from_edges(src, dst, dataset.graph.num_nodes, symmetrize=True)
        log.info("symmetrised %s: %d -> %d edges", dataset.name, dataset.graph.num_edges, graph.num_edges)
        dataset = replace(dataset, graph=graph)
    return dataset


def _parts(builder: HaloBuilder, dataset: GraphDataset, bar) -> Iterator[GraphPart]:
    for k in range(builder.book.num_parts):
        bar.set_description_str(f"part {k}/{builder.book.num_parts}")
        yield builder.build(k, dataset)
        bar.update(1)


def partition_dataset(
    dataset: GraphDataset,
    config: PartitionConfig,
    out_dir: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> PartitionSummary:
    """Partition ``dataset`` into ``config.num_parts`` parts and write them to ``out_dir``.

    Args:
        dataset: graph (original ids) and node data; every node array present is split with the parts.
        config: method, K, balance weights, imbalance, seed.
        out_dir: the partition folder; it appears only when everything is written.
        overwrite: replace an existing partition folder.
        progress: show a progress bar over the stages and parts (only when stderr is a terminal).

    Raises:
        ConfigError: K < 1 or K > nodes, an empty graph, an existing ``out_dir`` without ``overwrite``.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir, overwrite)  # before any work: a typo should not cost a whole partitioning run
    graph, k = dataset.graph, config.num_parts
    start = time.perf_counter()
    times: dict[str, float] = {}
    with progress_bar(total=k + 3, desc="partition", unit="step", enabled=progress) as bar:

        def stage(name: str, t0: float) -> float:
            now = time.perf_counter()
            times[name] = now - t0
            log.info("%s: %.2f s", name, times[name])
            bar.update(1)
            return now

        bar.set_description_str(f"partition ({config.method})")
        t = time.perf_counter()
        assignment = partition_graph(graph, config, train_mask=dataset.train_mask)
        t = stage("partition", t)
        bar.set_description_str("relabel")
        relabelling = relabel(assignment)
        t = stage("relabel", t)
        bar.set_description_str("halo index")
        index = HaloIndex.build(graph, relabelling)
        stats = partition_stats(graph, relabelling, train_mask=dataset.train_mask, index=index)
        t = stage("halo index", t)
        meta = PartitionMeta(
            method=config.method,
            seed=config.seed,
            num_parts=k,
            num_nodes=graph.num_nodes,
            num_edges=graph.num_edges,
            bounds=tuple(int(b) for b in relabelling.book.bounds),
            stats=stats,
            node_data=tuple(name for name in NODE_DATA if getattr(dataset, name) is not None),
            num_classes=dataset.num_classes,
            name=dataset.name,
            config={**asdict(config), "balance": list(config.balance)},
        )
        builder = HaloBuilder(graph, relabelling, index=index)
        meta = save_partitioned(
            out_dir, _parts(builder, dataset, bar), meta, new_to_orig=relabelling.new_to_orig, overwrite=overwrite
        )
        times["build + write"] = time.perf_counter() - t
    wall = time.perf_counter() - start
    log.info("partitioned %s into %d parts in %.2f s; edge cut %.2f%%", dataset.name, k, wall, 100 * stats.edge_cut)
    return PartitionSummary(
        out_dir=out_dir, meta=meta, stats=stats, wall_time_s=wall, peak_memory_bytes=peak_rss_bytes(), stage_times=times
    )
