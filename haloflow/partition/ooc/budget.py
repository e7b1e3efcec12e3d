"""The memory plan of the out-of-core pipeline: what the per-node arrays take, and chunk sizes from what is left.

::

    --memory-budget B  (the whole process's resident set)
    |<- baseline ->|<--------- N x node_bytes --------->|<------------- work ------------->|
      interpreter,   the O(N) arrays of the fullest pass    every pass sizes its chunks from this:
      numpy, numba   (table below), held across passes       edges per input chunk, entries per bucket, ...

    bytes per node, by pass (ids int32 below 2^31 nodes, else int64; degrees int64)
      count       row counts                                           8   (16 while an unknown N grows)
      bucket sort out-degrees                                          8
      fennel      parts 4 + out-degrees 8 + balance weights 8 x W      12 + 8W   (+ in-degrees 8 for "edges",
                                                                                  + 1 for "train")
      random      permutation 8 + parts 8 + out-degrees 8              24
      route       parts 4 + new ids 4|8 + out-degrees 8 + by new id 8  24 | 28
      halo        in- and out-degrees by new id 16 + a byte map 1      17   (+ one part's halo, <= 8)
      write       in- and out-degrees by new id 16 + local id map 4    20

The plan refuses at once when ``baseline + N x node_bytes + MIN_WORK > (1 - SLACK) B``, naming N and the bytes per
node; ``baseline`` is measured once, when the pipeline starts (its numba kernels loaded). A part's CSR entries and
node data never are in memory whole: they are written to temporary files in row ranges and copied into the folder
through a map whose pages are released behind the copy (``utils.mapped.write_npy``). Its node-sized arrays (local
indptr, halo ids, local degrees: about 40 bytes per inner or halo node) are, and the build steps shrink to fit.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from haloflow.errors import ConfigError
from haloflow.utils.memory import current_rss_bytes, format_bytes

__all__ = ["OutOfCoreConfig", "MemoryPlan", "node_bytes", "plan_memory", "MIN_WORK"]

log = logging.getLogger(__name__)

MIN_WORK = 1 << 16  # the least room for chunks that still makes progress (a few hundred edges per chunk)
SLACK = 0.08  # of the budget kept free: the allocator's unreturned pages, kernels' scratch, file pages in flight

# Bytes of temporaries per unit of work in each pass (see the module docstring for the per-node arrays).
SCATTER_BYTES_PER_EDGE = 128  # pass 2 reading the input: both directions, keys, bucket ids, their order
BUCKET_BYTES_PER_ENTRY = 16  # a bucket's keys sorted in place, then its columns
BUCKET_BYTES_PER_ROW = 16  # a bucket's row counts and indptr
BLOCK_BYTES_PER_ENTRY = 16  # a CSR block read by a streaming pass (indices, their int64 view)
BLOCK_BYTES_PER_ROW = 16
ROUTE_BYTES_PER_ENTRY = 48  # new ids, part of each entry, the grouping order, grouped copies
ROUTE_BYTES_PER_ROW = 48
BUILD_BYTES_PER_ENTRY = 40  # a part's rows: columns, sort keys, row ids


@dataclass(frozen=True, kw_only=True)
class OutOfCoreConfig:
    """How the out-of-core pipeline may use memory and disk.

    Args:
        memory_budget: bytes the whole process may hold (resident set), its own baseline included.
        tmp_dir: where the temporary files go (a folder made inside it, removed at the end); None = beside the
            output folder.
        baseline: bytes of the process not to count against the budget's work room; None = measured (the RSS
            when the pipeline starts). Tests set 0 to plan a tiny budget in a process that imported torch.
    """

    memory_budget: int
    tmp_dir: Path | None = None
    baseline: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.memory_budget, bool) or not isinstance(self.memory_budget, int) or self.memory_budget <= 0:
            raise ConfigError(f"OutOfCoreConfig.memory_budget must be a positive number of bytes, got "
                              f"{self.memory_budget!r}")
        if self.baseline is not None and self.baseline < 0:
            raise ConfigError(f"OutOfCoreConfig.baseline must be >= 0 bytes, got {self.baseline}")
        if self.tmp_dir is not None:
            object.__setattr__(self, "tmp_dir", Path(self.tmp_dir))
            if self.tmp_dir.exists() and not self.tmp_dir.is_dir():  # a file, a FIFO, a device: never written
                raise ConfigError(f"tmp dir {self.tmp_dir} (--tmp-dir) is not a folder; expected a folder to make "
                                  "the temporary folder in", field="tmp_dir")


def id_bytes(num_nodes: int) -> int:
    return 4 if num_nodes < 2**31 else 8


def node_bytes(num_nodes: int, method: str, balance: tuple[str, ...], *, unknown_count: bool = False) -> dict[str, int]:
    """Bytes per node that each pass holds in its O(N) arrays (the module docstring's table)."""
    w = len(balance)
    fennel = 12 + 8 * w + (8 if "edges" in balance else 0) + (1 if "train" in balance else 0)
    table = {
        "count": 16 if unknown_count else 8,
        "bucket sort": 8,
        "partition": 24 if method == "random" else fennel,
        "route": 20 + id_bytes(num_nodes),
        "halo": 25,
        "write": 20,
    }
    return table


@dataclass(frozen=True)
class MemoryPlan:
    """Chunk sizes of every pass, planned from the budget (see the module docstring)."""

    budget: int
    baseline: int
    num_nodes: int
    node_bytes: int  # the largest entry of the per-pass table
    work: int  # bytes left for chunks

    @property
    def chunk_edges(self) -> int:
        """Input edges per chunk while the edges are scattered into buckets (the count pass uses the same)."""
        return max(self.work // SCATTER_BYTES_PER_EDGE, 256)

    def chunk_edges_for(self, reader_bytes_per_edge: int) -> int:
        return max(self.work // (SCATTER_BYTES_PER_EDGE + reader_bytes_per_edge), 256)

    @property
    def bucket_entries(self) -> int:
        return max(self.work // BUCKET_BYTES_PER_ENTRY, 256)

    @property
    def bucket_rows(self) -> int:
        return max(self.work // (2 * BUCKET_BYTES_PER_ROW), 256)

    @property
    def block_entries(self) -> int:
        return max(self.work // (2 * BLOCK_BYTES_PER_ENTRY), 256)

    @property
    def block_rows(self) -> int:
        return max(self.work // (2 * BLOCK_BYTES_PER_ROW), 256)

    @property
    def route_entries(self) -> int:
        return max(self.work // (2 * ROUTE_BYTES_PER_ENTRY), 256)

    @property
    def route_rows(self) -> int:
        return max(self.work // (2 * ROUTE_BYTES_PER_ROW), 256)

    @property
    def build_entries(self) -> int:
        return max(self.work // BUILD_BYTES_PER_ENTRY, 256)

    def write_entries(self, held: int) -> int:
        """CSR entries per step while the parts are built, when ``held`` bytes (the degrees by new id, the local
        id map and the part's own node-sized arrays) are alive; at least a few hundred."""
        room = int(self.budget * (1 - SLACK)) - self.baseline - held
        return max(room // BUILD_BYTES_PER_ENTRY, 256)

    def check_write(self, held: int, largest_part_nodes: int, part_bytes_per_node: int) -> None:
        """Refuse, before any part is written, a budget that the largest part's own arrays (inner + halo nodes,
        known once the halos are swept) would overrun: ``held`` bytes of per-node arrays stay alive meanwhile.
        The up-front plan cannot know the halos; on a graph without locality (a random graph at K = 16: a halo of
        0.92 N per part) they take more than the per-node table allows."""
        need = self.baseline + held + largest_part_nodes * part_bytes_per_node + MIN_WORK
        if need > int(self.budget * (1 - SLACK)):
            minimum = math.ceil(need / (1 - SLACK))
            raise ConfigError(f"--memory-budget {format_bytes(self.budget)} cannot hold the largest part: its "
                              f"{largest_part_nodes:,} inner and halo nodes need {part_bytes_per_node} bytes each "
                              f"({format_bytes(largest_part_nodes * part_bytes_per_node)}) beside "
                              f"{format_bytes(held)} of per-node arrays and the process's "
                              f"{format_bytes(self.baseline)}; expected --memory-budget >= {format_bytes(minimum)} "
                              f"(or fewer --parts: smaller halos)")

    def node_rows(self, row_bytes: int) -> int:
        """Rows of a node array per chunk (read, then grouped by part: two copies)."""
        return max(self.work // (2 * max(row_bytes, 1) + 24), 64)

    def describe(self) -> str:
        return (f"budget {format_bytes(self.budget)} = process {format_bytes(self.baseline)} + {self.num_nodes:,} "
                f"nodes x {self.node_bytes} B + {format_bytes(self.work)} for chunks ({self.chunk_edges:,} edges per "
                f"input chunk, {self.bucket_entries:,} entries per bucket)")


def _budget_line(budget: int, base: int, n: int, per_node: int, at_least: bool) -> str:
    need = math.ceil((base + n * per_node + MIN_WORK) / (1 - SLACK))
    if n == 0:  # no node read yet: the process alone is over the budget
        return (f"--memory-budget {format_bytes(budget)} is below what this process holds before reading the graph "
                f"({format_bytes(base)}, plus {format_bytes(MIN_WORK)} for chunks); expected --memory-budget >= "
                f"{format_bytes(need)}")
    count = f"at least {n:,}" if at_least else f"{n:,}"
    return (f"--memory-budget {format_bytes(budget)} cannot hold this graph: its {count} nodes need {per_node} bytes "
            f"per node ({format_bytes(n * per_node)}) in the per-node arrays, plus {format_bytes(MIN_WORK)} for "
            f"chunks, on top of the {format_bytes(base)} this process holds; expected --memory-budget >= "
            f"{format_bytes(need)}")


def plan_memory(config: OutOfCoreConfig, num_nodes: int, method: str, balance: tuple[str, ...], *,
                unknown_count: bool = False, at_least: bool = False) -> MemoryPlan:
    """The plan for ``num_nodes`` nodes; raises ``ConfigError`` (one line) when the per-node arrays cannot fit.

    Args:
        at_least: ``num_nodes`` is a lower bound seen so far (the input does not state its node count).
    """
    base = current_rss_bytes() if config.baseline is None else config.baseline
    per_node = max(node_bytes(num_nodes, method, balance, unknown_count=unknown_count).values())
    work = int(config.memory_budget * (1 - SLACK)) - base - num_nodes * per_node
    if work < MIN_WORK:
        raise ConfigError(_budget_line(config.memory_budget, base, num_nodes, per_node, at_least))
    return MemoryPlan(budget=config.memory_budget, baseline=base, num_nodes=num_nodes, node_bytes=per_node,
                      work=int(work))


def raise_open_files(needed: int) -> None:
    """Lift the soft limit on open files to what the bucket files need (up to the hard limit), or refuse."""
    try:
        import resource
    except ImportError:  # not POSIX: let open() say so if it must
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 64
    if want <= soft:
        return
    top = hard if hard != resource.RLIM_INFINITY else max(want, soft)
    if want > top:
        raise ConfigError(f"the partition needs {needed:,} temporary files open at once, over this system's limit of "
                          f"{top:,}: raise --memory-budget (fewer, larger buckets) or use fewer --parts")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, top), hard))


def buckets_needed(total_bytes: int, work: int) -> int:
    return max(1, math.ceil(total_bytes / max(work, 1)))


def disk_free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
