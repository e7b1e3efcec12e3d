"""`partition_out_of_core`: the partition folder of `partition_dataset`, in O(nodes) memory.

::

    EdgeSource -(1) count rows------> plan (budget: node arrays + chunks; refuses at once when they cannot fit)
               -(2) bucket sort ----> DiskCSR (original ids, symmetrised / de-duplicated as read_input does)
                (3) fennel | random over the DiskCSR in vertex order ------> parts (N,)
                (4) relabel, route rows / entries / node data to part buckets, halo sweep, then per part:
                    local CSR + halo + send lists + node data -> save_partitioned -> DIR/

For the same input, method, seed and passes, DIR equals the in-memory pipeline's folder file for file (the
assignment, every array, meta.json): each pass reproduces its in-memory counterpart's arithmetic, and the tests
hold it to that. Temporary files live in one folder under ``tmp_dir`` that goes when the run ends, however it
ends; the output folder appears only when it is complete (``save_partitioned``'s atomic rename).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from haloflow.host.malloc import trim
from haloflow.data.edge_source import EdgeSource
from haloflow.data.graph_folder import NodeArrays
from haloflow.errors import ConfigError
from haloflow.partition.api import PartitionConfig
from haloflow.partition.format import NODE_DATA, PartitionMeta, check_output_dir, save_partitioned
from haloflow.partition.ooc.budget import OutOfCoreConfig
from haloflow.partition.ooc.kernels import warm_kernels
from haloflow.partition.ooc.build import build_parts_streamed, check_part_memory, sweep_halos
from haloflow.partition.ooc.disk_csr import build_disk_csr, count_rows
from haloflow.partition.ooc.route import (degrees_by_new_id, relabel_streamed, route_node_data, route_rows,
                                         write_new_to_orig)
from haloflow.partition.ooc.scratch import ScratchSpace
from haloflow.partition.ooc.stream import stream_partition, streamable_config
from haloflow.partition.pipeline import PartitionSummary
from haloflow.utils.mapped import MappedNpy
from haloflow.utils.memory import current_rss_bytes, format_bytes, peak_rss_bytes

__all__ = ["OutOfCoreSummary", "partition_out_of_core"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class OutOfCoreSummary(PartitionSummary):
    """`PartitionSummary` plus what the out-of-core run used: the budget, its plan, the temporary disk."""

    memory_budget: int
    plan: str
    temp_peak_bytes: int
    num_nodes: int
    num_entries: int
    num_buckets: int  # bucket files of pass 2 (the external sort's runs)

    def report(self) -> str:
        return "\n".join([
            super().report(),
            f"memory budget: {format_bytes(self.memory_budget)} ({self.plan})",
            f"temporary files: {format_bytes(self.temp_peak_bytes)} at most ({self.num_buckets} bucket"
            f"{'s' if self.num_buckets != 1 else ''}), removed",
        ])


class _Stages:
    """Seconds per stage, in order, logged as each ends."""

    def __init__(self):
        self.times: dict[str, float] = {}
        self._t = time.perf_counter()

    def done(self, name: str) -> None:
        trim()  # what the stage freed leaves the resident set (haloflow keeps freed blocks for reuse: host/malloc.py)
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self._t
        log.info("%s: %.2f s (peak resident memory so far %s)", name, now - self._t, format_bytes(peak_rss_bytes()))
        self._t = now


def partition_out_of_core(
    source: EdgeSource,
    config: PartitionConfig,
    ooc: OutOfCoreConfig,
    out_dir: str | os.PathLike,
    *,
    nodes: NodeArrays | None = None,
    symmetrize: bool = True,
    overwrite: bool = False,
    progress: bool = True,
) -> OutOfCoreSummary:
    """Partition the graph of ``source`` (and its node data ``nodes``) into ``out_dir`` within ``ooc``'s budget.

    Args:
        source: the edges, read chunk by chunk (``haloflow.data.edge_source``).
        config: method ``fennel`` or ``random``; "auto" Fennel choices resolve to what streams (stream start,
            vertex order), and the folder records the resolved config.
        ooc: the memory budget and where temporary files go.
        nodes: node features / labels / masks, memory-mapped (``GraphFolder.nodes``).
        symmetrize: add every reverse edge and merge repeats (``read_input``'s default); a format that stores an
            undirected graph is symmetrised anyway.

    Raises:
        ConfigError: a method that cannot stream, a budget too small for the per-node arrays (one line naming the
            node count and the bytes per node), an existing ``out_dir`` without ``overwrite``.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir, overwrite)
    config = streamable_config(config)
    symmetrize = symmetrize or source.symmetric
    if nodes is not None and source.num_nodes is not None and nodes.num_nodes != source.num_nodes:
        raise ConfigError(f"{source.path}: the node files have {nodes.num_nodes:,} rows but the edges are read for "
                          f"{source.num_nodes:,} nodes")
    tmp_parent = Path(ooc.tmp_dir) if ooc.tmp_dir is not None else out_dir.absolute().parent
    if ooc.baseline is None:  # what the process holds before the first pass, its kernels loaded: fixed for the run
        warm_kernels()
        ooc = replace(ooc, baseline=current_rss_bytes())
    start = time.perf_counter()
    stages = _Stages()
    k = config.num_parts
    with ScratchSpace(tmp_parent) as scratch:
        rows = count_rows(source, ooc, config.method, config.balance, symmetrize=symmetrize, progress=progress)
        plan, n = rows.plan, rows.num_nodes
        stages.done("count")
        csr, out_degree = build_disk_csr(source, rows, scratch, symmetrize=symmetrize, progress=progress)
        del rows
        stages.done("bucket sort")
        train_mask = None
        if "train" in config.balance:
            if nodes is None or "train_mask" not in nodes.names:
                raise ConfigError('PartitionConfig.balance includes "train" but the input has no train_mask.npy')
            train_mask = nodes.rows("train_mask", 0, n)  # (N,) bool: one byte per node, in the plan
        assignment = stream_partition(csr, config, plan, train_mask=train_mask, progress=progress,
                                      on_pass=stages.done)
        del train_mask
        stages.done("balance" if config.method == "fennel" and k > 1 else "partition")
        parts = assignment.parts
        del assignment
        bounds, orig_to_new = relabel_streamed(parts, k)
        out_new = degrees_by_new_id(out_degree, orig_to_new)
        del out_degree
        buckets, in_new = route_rows(csr, parts, orig_to_new, bounds, plan, scratch, progress=progress)
        del orig_to_new
        if nodes is not None:
            route_node_data(nodes, parts, buckets, plan, progress=progress)
        del parts
        csr.indptr_path.unlink()
        csr.indices_path.unlink()
        stages.done("relabel + route")
        sweep = sweep_halos(buckets, plan, progress=progress)
        check_part_memory(buckets, sweep, in_new, out_new, plan)
        stats = sweep.stats(buckets, csr.num_edges)
        scratch.note()
        stages.done("halo")
        new_to_orig = MappedNpy(write_new_to_orig(buckets, scratch.path("new_to_orig.npy"), n, plan.block_rows))
        num_classes = nodes.num_classes(plan.node_rows(8)) if nodes is not None else 0
        node_data = tuple(name for name in NODE_DATA if nodes is not None and name in nodes.names)
        meta = PartitionMeta(
            method=config.method, seed=config.seed, num_parts=k, num_nodes=n, num_edges=csr.num_edges,
            bounds=tuple(int(b) for b in bounds), stats=stats, node_data=node_data, num_classes=num_classes,
            name=source.name, config={**asdict(config), "balance": list(config.balance)},
        )
        parts_iter = build_parts_streamed(buckets, sweep, in_new, out_new, plan, num_classes=num_classes,
                                          releases=(new_to_orig,))
        meta = save_partitioned(out_dir, parts_iter, meta, new_to_orig=new_to_orig.array, overwrite=overwrite)
        scratch.note()
        new_to_orig.release()
        stages.done("build + write")
        temp_peak = scratch.peak_bytes
    wall = time.perf_counter() - start
    log.info("partitioned %s out of core into %d parts in %.2f s; edge cut %.2f%%; temporary files at most %s",
             source.name, k, wall, 100 * stats.edge_cut, format_bytes(temp_peak))
    return OutOfCoreSummary(
        out_dir=out_dir, meta=meta, stats=stats, wall_time_s=wall, peak_memory_bytes=peak_rss_bytes(),
        stage_times=stages.times, memory_budget=ooc.memory_budget, plan=plan.describe(), temp_peak_bytes=temp_peak,
        num_nodes=n, num_entries=csr.num_edges, num_buckets=csr.num_buckets,
    )
