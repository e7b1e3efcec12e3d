"""What every part of the device check shares: its arguments, a CUDA-aware timer, the measured ceilings, its output.

A part is a module ``haloflow.bench.device.<name>`` with ``main(argv) -> int``. It is started in its own process by
``haloflow.bench.device.check`` (so that a crash or an out-of-memory in one part leaves the others running) as::

    python -m haloflow.bench.device.<name> --device cuda --out DIR [--tiny]

``--tiny`` shrinks every size so that the part runs on a 2-core CPU in well under a minute (the slow test suite runs
the whole check that way with ``--device cpu``). The part writes ``DIR/<name>.json`` and ``DIR/<name>.md`` through
`write_part` and exits 0 when everything it compared agreed, 1 when a comparison failed (it still writes both files).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.table import format_table

__all__ = ["PartArgs", "part_parser", "parse_part_args", "Timer", "time_ms", "copy_bandwidth", "Table", "write_part",
           "device_name", "peak_memory_mib", "reset_peak_memory", "sync"]


@dataclass(frozen=True)
class PartArgs:
    device: torch.device
    out: Path
    tiny: bool
    seed: int


def part_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments every part takes; a part adds its own to the parser it gets back."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--device", default="cuda", help="cuda (the GPU run) or cpu (a dry run at --tiny sizes)")
    p.add_argument("--out", type=Path, required=True, help="folder for <part>.json and <part>.md")
    p.add_argument("--tiny", action="store_true", help="small sizes: a dry run of the code paths on a CPU")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_part_args(p: argparse.ArgumentParser, argv: list[str] | None) -> tuple[PartArgs, argparse.Namespace]:
    ns = p.parse_args(argv)
    device = torch.device(ns.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (use --device cpu --tiny for a dry run)")
    ns.out.mkdir(parents=True, exist_ok=True)
    return PartArgs(device=device, out=ns.out, tiny=ns.tiny, seed=ns.seed), ns


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Milliseconds of the work between ``start()`` and ``stop()``: CUDA events on a GPU, the wall clock on a CPU."""

    def __init__(self, device: torch.device):
        self.device = device

    def start(self) -> None:
        if self.device.type == "cuda":
            self._a, self._b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._a.record()
        else:
            self._t = time.perf_counter()

    def stop(self) -> float:
        if self.device.type == "cuda":
            self._b.record()
            self._b.synchronize()
            return float(self._a.elapsed_time(self._b))
        return (time.perf_counter() - self._t) * 1e3


def time_ms(fn: Callable[[], object], device: torch.device, *, warmup: int = 2, repeats: int = 5) -> list[float]:
    """Each of ``repeats`` calls of ``fn`` timed alone (after ``warmup`` untimed calls), in milliseconds."""
    for _ in range(warmup):
        fn()
    sync(device)
    timer, out = Timer(device), []
    for _ in range(repeats):
        timer.start()
        fn()
        out.append(timer.stop())
    return out


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written, the ceiling of a memory-bound kernel)."""
    n = nbytes // 4
    a = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    b = torch.empty_like(a)
    ms = statistics.median(time_ms(lambda: b.copy_(a), device, warmup=2, repeats=repeats))
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device: torch.device) -> float | None:
    """Peak device memory allocated by torch since the last reset (None on a CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return None


@dataclass
class Table:
    """One printed table of a part: headers, rows, one float format per column or one for all."""

    title: str
    headers: list[str]
    rows: list[list] = field(default_factory=list)
    float_fmt: str | list[str] = ".3f"

    def text(self) -> str:
        return format_table(self.headers, self.rows, float_fmt=self.float_fmt, title=self.title)


def write_part(args: PartArgs, name: str, tables: list[Table], result: dict, *, ok: bool,
               notes: list[str] = ()) -> int:
    """Print the tables, write ``<name>.json`` (``result`` + ok + device + notes) and ``<name>.md``; return the
    exit code (0 when ``ok``)."""
    header = f"device: {device_name(args.device)}; torch {torch.__version__}{'; tiny sizes' if args.tiny else ''}"
    blocks = [header] + [t.text() for t in tables] + list(notes)
    text = "\n\n".join(blocks)
    print(text, flush=True)
    payload = {"part": name, "ok": ok, "device": str(args.device), "device_name": device_name(args.device),
               "torch": torch.__version__, "tiny": args.tiny, "notes": list(notes),
               "tables": [{"title": t.title, "headers": t.headers, "rows": t.rows} for t in tables], **result}
    atomic_write_text(args.out / f"{name}.json", json.dumps(payload, indent=2, default=str) + "\n")
    atomic_write_text(args.out / f"{name}.md", f"## {name}\n\n{header}\n\n"
                      + "\n\n".join(f"```\n{t.text()}\n```" for t in tables)
                      + "".join(f"\n\n{n}" for n in notes) + "\n")
    return 0 if ok else 1
