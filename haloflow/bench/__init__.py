"""Benchmarks, each a module with ``main(argv) -> int`` that prints a table and writes JSON under ``bench-results/``.

Run them as ``haloflow bench NAME [OPTIONS]`` or ``python benchmarks/NAME.py [OPTIONS]`` (the same code). Every
benchmark measures haloflow against a peer in the same run (pymetis, PyG, plain PyTorch, a transpose, numpy's
parsers): the ratio is the result, not the absolute time. Some peers are test extras (``pip install
haloflow[test]`` brings torch-geometric).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Benchmark", "BENCHMARKS"]


@dataclass(frozen=True)
class Benchmark:
    module: str  # importable module with ``main(argv) -> int``
    summary: str  # one line for ``haloflow bench``'s list
    minutes: str  # typical run time of the defaults on 2 quiet cores (beside other work: longer, e.g. cache 6)


BENCHMARKS: dict[str, Benchmark] = {
    "partition": Benchmark("haloflow.bench.partition",
                           "metis / fennel / random against pymetis called directly: cut, halo, balance, time, memory",
                           "15"),
    "partition-ooc": Benchmark("haloflow.bench.partition_ooc",
                               "--memory-budget on an R-MAT graph larger than the budget: peak RSS, time per pass, "
                               "temporary disk, cut; against in memory and METIS", "60"),
    "gcn": Benchmark("haloflow.bench.gcn", "one-process GCN epoch against PyG GCNConv; SpMM kernels", "1"),
    "gcn-dist": Benchmark("haloflow.bench.gcn_dist",
                          "GCN epoch at K = 1, 2, 4: overlapped vs a wait-first control, halo bytes, cost model",
                          "8"),
    "grad-sync": Benchmark("haloflow.bench.grad_sync",
                           "gradient sync bytes and time: reduce-scatter + all-gather against all-gather + sum", "1"),
    "dlrm": Benchmark("haloflow.bench.dlrm",
                      "DLRM samples/s against plain PyTorch; sharded K = 2, 4 bytes against the plan", "3"),
    "tgn": Benchmark("haloflow.bench.tgn",
                     "TGN on Wikipedia against PyG's TGN (AP, events/s), EdgeBank; K = 2, 4 fetch bytes and overlap",
                     "6"),
    "planner": Benchmark("haloflow.bench.planner",
                         "table-sharding plans against the lower bound; planning 1,000 tables", "1"),
    "readers": Benchmark("haloflow.bench.readers", "graph readers against numpy's and pyarrow's parsers", "1"),
    "halo-build": Benchmark("haloflow.bench.halo_build",
                            "halo construction and partition-folder I/O against one transpose", "2"),
    "cache": Benchmark("haloflow.bench.cache",
                       "embedding cache: hit rate per policy against Belady; mmap table through a cache vs np.memmap",
                       "2-6"),  # 2 alone on 2 cores; 6 beside the test suite (measured by the user)
    "contention": Benchmark("haloflow.bench.contention",
                            "GCN, DLRM and TGN steps under busy co-tenant processes: slowdown against plain PyTorch's, "
                            "2 threads against 1", "8"),
    "dlrm-memory": Benchmark("haloflow.bench.dlrm_memory",
                             "per-rank peak RSS of sharded (and cached) Kaggle tables at K = 1, 2, 4 vs the plan",
                             "3"),
    "exactness": Benchmark("haloflow.bench.exactness",
                           "what equal floats at every K cost: step time and bytes, K-invariant path against the old, "
                           "DLRM, GCN, TGN at K = 1, 2", "12"),
    "partition-budget": Benchmark("haloflow.bench.partition_budget",
                                  "--memory-budget's peak RSS from the OS at 256 MiB, 384 MiB, 1 GiB on 4x edge files",
                                  "20"),
}
