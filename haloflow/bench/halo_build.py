"""Halo construction and partition-folder I/O at scale, measured against one transpose of the same graph.

The peer is ``CSRGraph.transpose()`` (one sort of all E edges), the cheapest whole-graph pass anyone building
halos must at least match. For an R-MAT graph and a random K-way assignment (the worst case for halos: almost
every edge is cut) it reports, per stage, seconds, the ratio to the peer and the peak extra memory (VmHWM after
resetting it, minus the RSS before the stage; memory the allocator kept from an earlier stage is reused and so
not counted again):

    halo index      HaloIndex.build: every part's halo and the cut, one pass over the edges
    build parts     HaloBuilder.build for k = 0..K-1, one part alive at a time
    save            save_partitioned to a temporary folder (np.save + CRC-32 of every file)
    load + verify   load_partition of every part with checksums (mmap)

    haloflow bench halo-build                                   # 2^18 nodes, 2^21 edges, K = 16 (seconds)
    haloflow bench halo-build --scale 22 --edges-log 25 --parts 16   # the issue's size (about 3 minutes)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from haloflow.data.generators import RMATConfig, rmat_graph
from haloflow.partition.format import PartitionMeta, load_meta, load_partition, save_partitioned
from haloflow.partition.halo import HaloBuilder, HaloIndex
from haloflow.partition.relabel import relabel
from haloflow.partition.stats import partition_stats
from haloflow.partition.types import Assignment
from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.memory import format_bytes, peak_rss_bytes, reset_peak_rss
from haloflow.utils.table import format_table
from haloflow.utils.help_format import HelpFormatter


def _measure(fn):
    """(result, seconds, peak extra bytes) of ``fn()``."""
    reset_peak_rss()
    base = peak_rss_bytes()
    t = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t, max(peak_rss_bytes() - base, 0)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--scale", type=int, default=18, help="2^scale nodes")
    ap.add_argument("--edges-log", type=int, default=None, help="2^edges_log edges (default scale + 3)")
    ap.add_argument("--parts", type=int, default=16, help="parts whose halos are built")
    ap.add_argument("--seed", type=int, default=0, help="seed of the graph and the partition")
    ap.add_argument("--out", default="bench-results/halo_build.json", help="where the JSON results go")
    args = ap.parse_args(argv)
    edges_log = args.edges_log if args.edges_log is not None else args.scale + 3

    graph = rmat_graph(RMATConfig(scale=args.scale, num_edges=1 << edges_log, seed=args.seed),
                       dedup=False, drop_self_loops=False)
    k = args.parts
    assign = np.random.default_rng(args.seed).integers(0, k, graph.num_nodes)
    rel = relabel(Assignment(parts=assign, num_parts=k, method="random", seed=args.seed))

    rows = {}
    _, *rows["peer: transpose"] = _measure(graph.transpose)
    index, *rows["halo index"] = _measure(lambda: HaloIndex.build(graph, rel))
    builder = HaloBuilder(graph, rel, index=index)
    _, *rows["build parts"] = _measure(lambda: [builder.build(p).n_halo for p in range(k)])
    stats = partition_stats(graph, rel, index=index)
    meta = PartitionMeta(method="random", seed=args.seed, num_parts=k, num_nodes=graph.num_nodes,
                         num_edges=graph.num_edges, bounds=tuple(rel.book.bounds.tolist()), stats=stats)
    with tempfile.TemporaryDirectory(dir=Path(args.out).parent if Path(args.out).parent.exists() else None) as tmp:
        folder = Path(tmp) / "parts"
        build_secs = []

        def parts():
            for p in range(k):
                t = time.perf_counter()
                part = builder.build(p)
                build_secs.append(time.perf_counter() - t)
                yield part

        _, *rows["save"] = _measure(lambda: save_partitioned(folder, parts(), meta, new_to_orig=rel.new_to_orig))
        rows["save"][0] -= sum(build_secs)  # the parts are rebuilt as they are written; count the writing only
        folder_bytes = sum(f.size for f in load_meta(folder).files.values())
        _, *rows["load + verify"] = _measure(lambda: [load_partition(folder, p).n_inner for p in range(k)])
    peer = rows["peer: transpose"][0]

    print(f"R-MAT 2^{args.scale} nodes, {graph.num_edges:,} edges, K = {k} (random), edge cut {stats.edge_cut:.1%}, "
          f"total halo {stats.total_halo:,}, folder {format_bytes(folder_bytes)}")
    print(format_table(["stage", "seconds", "x transpose", "peak extra"],
                       [[name, secs, secs / peer, format_bytes(mem)] for name, (secs, mem) in rows.items()],
                       float_fmt=".2f"))
    result = {
        "graph": {"scale": args.scale, "nodes": graph.num_nodes, "edges": graph.num_edges},
        "parts": k, "edge_cut": stats.edge_cut, "total_halo": stats.total_halo, "folder_bytes": folder_bytes,
        "stages": {name: {"seconds": secs, "ratio_to_transpose": secs / peer, "peak_extra_bytes": mem}
                   for name, (secs, mem) in rows.items()},
    }
    out = atomic_write_text(args.out, json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    raise SystemExit(main())
