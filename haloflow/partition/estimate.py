"""The estimate every partition run prints before it reads the graph: peak memory and temporary disk.

::

    input ----(header or a 1 MiB sample, never the whole file)----> E, the edges it holds (an estimate for text)
      .npy / arrays folder   the array's shape in the .npy header                       exact
      .parquet               the row count in the Parquet footer                        exact
      METIS .graph           the header line "n m"                                      exact
      SNAP / PACE / .mtx     the file's size / the mean line length of its first MiB    (compressed: x the sample's
                                                                                         compression ratio)
    in memory      peak = process + bytes per entry x 2E (symmetrised entries; per method, measured below)
                   temporary disk: kaminpar's ParHiP file (and auto's, when it may run kaminpar), 8 x 2E
    --memory-budget B   peak = min(B x (1 - SLACK), the in-memory fennel estimate): the pipeline sizes its chunks
                        to fill the budget; temporary disk = the on-disk CSR and the part buckets, 16.5 B per edge

Bytes per symmetrised entry of the in-memory runs, measured with ``/usr/bin/time`` (peak RSS of the whole process)
on 2026-12-06 at K = 16, minus the process's 110 MiB::

    input                                  entries   metis   fennel   kaminpar
    Delaunay 1M nodes (.npy)               6.0M      75      68       97
    USA-road-NE 1.5M nodes (.gr.xz text)   3.9M      130     119      156

The table ``IN_MEMORY_BYTES_PER_ENTRY`` takes about their mean, so the in-memory estimate is good to about +-30 %
(a graph with many nodes per edge, as a road network, costs more per entry: its per-node arrays weigh more; the
node count is not known before reading). random, kahip and mtkahypar were not measured: their entries are
guesses from their copies of the graph. The out-of-core estimate is what ``--memory-budget`` is held to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from haloflow.utils.memory import format_bytes

__all__ = ["Estimate", "input_edges", "estimate_in_memory", "estimate_out_of_core"]

PROCESS_BYTES = 110 << 20  # `haloflow partition`'s own RSS before it reads (NumPy, numba, SciPy imported)
OOC_PROCESS_BYTES = 165 << 20  # the same with the out-of-core pipeline's numba kernels loaded
IN_MEMORY_BYTES_PER_ENTRY = {"metis": 100, "fennel": 95, "random": 80, "kahip": 125, "mtkahypar": 200,
                             "kaminpar": 125, "auto": 125}  # auto: METIS, and KaMinPar's copy when it has time
OOC_TEMP_BYTES_PER_EDGE = 16.5  # measured: 1.03 GiB of temporary files for 67.1M input edges
_SAMPLE = 1 << 20


@dataclass(frozen=True)
class Estimate:
    peak_bytes: int
    temp_bytes: int
    edges: int | None  # input edges it is based on (None: not known before reading)
    basis: str  # where ``edges`` came from

    def line(self) -> str:
        if self.edges is None:
            return f"estimate before reading: unknown ({self.basis})"
        return (f"estimate before reading: peak memory about {format_bytes(self.peak_bytes)}, temporary disk about "
                f"{format_bytes(self.temp_bytes)} ({self.edges:,} edges, {self.basis})")


def input_edges(path: str | os.PathLike, fmt: str) -> tuple[int | None, str]:
    """(E, how E was found) for the input, reading only headers or a sample; (None, why) when not possible."""
    from haloflow.data.textscan import is_pipe

    path = Path(path)
    if is_pipe(path):  # read once, by the reader: a sample taken here would be missing from the graph
        return None, "a pipe is not sampled before it is read"
    try:
        if fmt == "arrays":
            path = path / "edges.npy"
            fmt = "npy" if path.is_file() else "parquet-folder"
        if fmt == "npy":
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape = read(f)[0]
            rows = shape[0] if len(shape) == 2 and shape[1] == 2 else shape[-1]
            return int(rows), "from the .npy header"
        if fmt == "parquet" and path.is_file():
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(path).metadata.num_rows), "from the Parquet footer"
        if fmt == "metis":
            from haloflow.data.textscan import open_decompressed

            with open_decompressed(path) as f:
                for raw in f:
                    line = raw.strip()
                    if line and not line.startswith(b"%"):
                        return int(line.split()[1]), "from the METIS header"
        if fmt in ("snap", "pace", "mtx"):
            return _sampled_lines(path), "from the file size and its first MiB's lines"
    except Exception:  # noqa: BLE001 - advisory only: a damaged input is the reader's to report, in its own words
        pass
    return None, f"format {fmt!r} does not state its edge count before it is read"


def _sampled_lines(path: Path) -> int:
    from haloflow.data.textscan import _decompressor, _open_codec

    size = path.stat().st_size
    with open(path, "rb") as raw:
        cls = _decompressor(path)
        f = _open_codec(cls, raw)
        sample = f.read(_SAMPLE)
        ratio = len(sample) / max(raw.tell(), 1) if cls is not None else 1.0  # decompressed / compressed bytes
    lines = sample.count(b"\n")
    if len(sample) < _SAMPLE:  # the whole file was read
        return lines
    return int(size * ratio * lines / max(len(sample), 1))


def estimate_in_memory(path, fmt: str, method: str) -> Estimate:
    edges, basis = input_edges(path, fmt)
    if edges is None:
        return Estimate(0, 0, None, basis)
    entries = 2 * edges
    peak = PROCESS_BYTES + IN_MEMORY_BYTES_PER_ENTRY.get(method, 130) * entries
    temp = 8 * entries if method in ("kaminpar", "auto") else 0
    return Estimate(int(peak), int(temp), edges, basis)


def estimate_out_of_core(path, fmt: str, budget: int) -> Estimate:
    from haloflow.partition.ooc.budget import SLACK

    edges, basis = input_edges(path, fmt)
    if edges is None:
        return Estimate(int(budget * (1 - SLACK)), 0, None, basis)
    peak = min(budget * (1 - SLACK), OOC_PROCESS_BYTES + IN_MEMORY_BYTES_PER_ENTRY["fennel"] * 2 * edges)
    return Estimate(int(peak), int(OOC_TEMP_BYTES_PER_EDGE * edges), edges, basis)
