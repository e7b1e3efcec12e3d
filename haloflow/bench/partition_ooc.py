"""Out-of-core partitioning benchmark: an R-MAT graph larger than the memory budget, partitioned by
``--memory-budget``, beside the in-memory pipeline and METIS on a graph both can take.

Every run is a child process (the partition CLI's imports loaded: NumPy, numba, SciPy, not torch, as ``haloflow
partition`` has them); its peak RSS comes from the OS (``os.wait4``'s ``ru_maxrss`` of that child). Reported per
run: wall time per pass, the peak RSS against the budget, temporary disk, edge cut and balance, and input edges per
second of each streaming pass. The load average is recorded before and after each run: on a shared 2-core machine a
run beside other jobs measures them too.

    haloflow bench partition-ooc                                   # R-MAT 25, 16 parts, 3 GiB (about 45 GB disk)
    haloflow bench partition-ooc --scale 20 --budget 600MiB --compare-scale 18 --features 16    # a quick look

Inputs are generated once into ``--work`` (an ``arrays`` folder: edges.npy int32 (E, 2), features.npy float32)
and kept for the next run unless ``--clean``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from haloflow.bench.args import at_least, byte_size
from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.memory import format_bytes, parse_bytes
from haloflow.utils.help_format import HelpFormatter

__all__ = ["main"]


@dataclass
class Run:
    label: str
    scale: int
    nodes: int = 0
    entries: int = 0
    input_bytes: int = 0  # edges.npy + features.npy
    budget: int = 0  # 0: in memory
    peak_rss: int = 0  # bytes, ru_maxrss of the child
    wall_s: float = 0.0
    stages: dict = field(default_factory=dict)
    temp_peak: int = 0
    edge_cut: float = 0.0
    node_balance: float = 0.0
    edge_balance: float = 0.0
    load_before: str = ""
    load_after: str = ""
    ok: bool = True
    note: str = ""


def generate(folder: Path, scale: int, edge_factor: int, features: int, seed: int = 0) -> Path:
    """R-MAT ``scale`` (Graph500 parameters, ids scrambled) as an ``arrays`` folder, written chunk by chunk."""
    from haloflow.data.generators import RMATConfig, rmat_chunks
    from haloflow.utils.mapped import NpyWriter

    stamp = folder / "done.json"
    spec = {"scale": scale, "edge_factor": edge_factor, "features": features, "seed": seed}
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cfg = RMATConfig(scale=scale, edge_factor=edge_factor, seed=seed)
    t0 = time.perf_counter()
    with NpyWriter(folder / "edges.npy", np.int32, (cfg.total_edges, 2)) as out:
        for src, dst in rmat_chunks(cfg):
            out.write(np.stack([src, dst], axis=1).astype(np.int32))
    if features:
        rng = np.random.default_rng(seed)
        n, step = cfg.num_nodes, 1 << 18
        with NpyWriter(folder / "features.npy", np.float32, (n, features)) as out:
            for lo in range(0, n, step):
                out.write(rng.standard_normal((min(step, n - lo), features), dtype=np.float32))
    print(f"generated R-MAT {scale} in {folder} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    stamp.write_text(json.dumps(spec))
    return folder


def _child(kind: str, spec: dict) -> None:
    """One measured run (``--child``): load what the partition CLI loads, partition, write the result JSON."""
    from haloflow.cli import build_parser

    build_parser("partition")  # the CLI's imports: the footprint a user of `haloflow partition` has
    from haloflow.partition.api import PartitionConfig

    config = PartitionConfig(num_parts=spec["parts"], method=spec["method"], seed=0, passes=spec["passes"],
                             fennel_start="stream", fennel_order="natural")
    out = Path(spec["out"])
    if kind == "ooc":
        from haloflow.data.streamed import open_streamed
        from haloflow.partition.ooc import OutOfCoreConfig, partition_out_of_core

        source, nodes = open_streamed(spec["input"], progress=False)
        summary = partition_out_of_core(source, config, OutOfCoreConfig(memory_budget=spec["budget"],
                                                                        tmp_dir=spec.get("tmp")),
                                        out, nodes=nodes, progress=False)
        extra = {"temp_peak": summary.temp_peak_bytes, "nodes": summary.num_nodes, "entries": summary.num_entries}
    else:
        from dataclasses import replace

        from haloflow.partition.pipeline import partition_dataset, read_input

        t0 = time.perf_counter()
        dataset = read_input(spec["input"])
        read_s = time.perf_counter() - t0
        if kind == "metis":
            config = replace(config, method="metis")
        summary = partition_dataset(dataset, config, out, progress=False)
        summary.stage_times["read + symmetrise"] = read_s
        extra = {"temp_peak": 0, "nodes": dataset.num_nodes, "entries": dataset.graph.num_edges}
    stats = summary.stats
    Path(spec["result"]).write_text(json.dumps({
        "stages": summary.stage_times, "edge_cut": stats.edge_cut, "node_balance": stats.balance["nodes"],
        "edge_balance": stats.balance["edges"], **extra}))


def measure(kind: str, label: str, scale: int, folder: Path, out: Path, work: Path, **spec) -> Run:
    """Run one child; its peak RSS from wait4, its own figures from its result file."""
    result = work / f"result-{label.replace(' ', '_')}-{scale}.json"
    result.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    spec = {**spec, "input": str(folder), "out": str(out), "result": str(result)}
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "haloflow.bench.partition_ooc", "--child", kind, json.dumps(spec)])
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    run = Run(label=label, scale=scale, budget=spec.get("budget", 0), peak_rss=usage.ru_maxrss * 1024, wall_s=wall,
              load_before=" ".join(load_before), load_after=" ".join(Path("/proc/loadavg").read_text().split()[:3]),
              input_bytes=sum(p.stat().st_size for p in folder.glob("*.npy")))
    if proc.returncode != 0 or not result.exists():
        run.ok, run.note = False, f"exit {proc.returncode}"
        return run
    r = json.loads(result.read_text())
    run.stages, run.temp_peak, run.nodes, run.entries = r["stages"], r["temp_peak"], r["nodes"], r["entries"]
    run.edge_cut, run.node_balance, run.edge_balance = r["edge_cut"], r["node_balance"], r["edge_balance"]
    shutil.rmtree(out, ignore_errors=True)
    return run


def table(runs: list[Run]) -> str:
    head = ("| run | scale | nodes | entries | input | budget | peak RSS | wall s | temp disk | cut | balance n/e | "
            "load before / after |")
    lines = [head, "|" + "---|" * 12]
    for r in runs:
        lines.append(
            f"| {r.label} | {r.scale} | {r.nodes:,} | {r.entries:,} | {format_bytes(r.input_bytes)} | "
            f"{format_bytes(r.budget) if r.budget else 'in memory'} | {format_bytes(r.peak_rss)} | {r.wall_s:.0f} | "
            f"{format_bytes(r.temp_peak) if r.temp_peak else '-'} | {r.edge_cut:.4f} | "
            f"{r.node_balance:.3f}/{r.edge_balance:.3f} | {r.load_before} / {r.load_after} |"
            + (f" FAILED {r.note}" if not r.ok else ""))
    lines.append("")
    lines.append("| run | scale | " + "seconds per stage (M input edges per second for the streaming passes) |")
    lines.append("|---|---|---|")
    for r in runs:
        edges = r.entries / 2 if r.entries else 0
        parts = []
        for name, secs in r.stages.items():
            rate = f" ({edges / secs / 1e6:.1f} M/s)" if name in ("count", "bucket sort") or name.startswith(
                "fennel pass") else ""
            parts.append(f"{name} {secs:.1f}{rate}")
        lines.append(f"| {r.label} | {r.scale} | {', '.join(parts)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:
        _child(argv[1], json.loads(argv[2]))
        return 0
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--scale", type=at_least(1, 40), default=25, help="R-MAT scale of the out-of-core run (default 25)")
    ap.add_argument("--edge-factor", type=int, default=16, help="R-MAT edges per node")
    ap.add_argument("--features", type=int, default=64, help="float32 features per node (default 64)")
    ap.add_argument("--parts", type=int, default=16, help="parts of each partition")
    ap.add_argument("--passes", type=int, default=4, help="Fennel passes (default 4: one stream, 3 restreams)")
    ap.add_argument("--budget", type=byte_size, default="3GiB",
                    help="--memory-budget of the out-of-core run (default 3GiB)")
    ap.add_argument("--compare-scale", type=int, default=22,
                    help="scale for the side-by-side runs: in memory, METIS, and out of core (default 22; 0 = none)")
    ap.add_argument("--compare-budget", type=byte_size, default="1GiB",
                    help="budget of the out-of-core run at --compare-scale "
                    "(default 1GiB: the CLI's own imports take about 320 MiB of it)")
    ap.add_argument("--skip", default="", help="comma-separated runs to leave out: big, memory, metis, ooc-compare")
    ap.add_argument("--work", default="bench-results/ooc-work", help="where inputs, outputs and temporary files go")
    ap.add_argument("--clean", action="store_true", help="remove the generated inputs at the end")
    ap.add_argument("--out", default="bench-results/partition_ooc.json", help="where the JSON results go")
    args = ap.parse_args(argv)
    work = Path(args.work).absolute()
    work.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    common = {"parts": args.parts, "passes": args.passes, "method": "fennel", "tmp": str(work)}
    runs: list[Run] = []

    def report(run: Run) -> None:
        runs.append(run)
        print(f"  {run.label} scale {run.scale}: {run.wall_s:.0f} s, peak {format_bytes(run.peak_rss)}, cut "
              f"{run.edge_cut:.4f}{'' if run.ok else ' FAILED ' + run.note}", file=sys.stderr, flush=True)

    if args.compare_scale:
        small = generate(work / f"rmat-{args.compare_scale}", args.compare_scale, args.edge_factor, args.features)
        budget = parse_bytes(args.compare_budget)
        if "ooc-compare" not in skip:
            report(measure("ooc", "fennel out of core", args.compare_scale, small, work / "out-small", work,
                           budget=budget, **common))
        if "memory" not in skip:
            report(measure("memory", "fennel in memory", args.compare_scale, small, work / "out-small", work,
                           **common))
        if "metis" not in skip:
            report(measure("metis", "metis in memory", args.compare_scale, small, work / "out-small", work,
                           **common))
    if "big" not in skip:
        big = generate(work / f"rmat-{args.scale}", args.scale, args.edge_factor, args.features)
        report(measure("ooc", "fennel out of core", args.scale, big, work / "out-big", work,
                       budget=parse_bytes(args.budget), **common))
    print(table(runs))
    if args.clean:
        for d in work.glob("rmat-*"):
            shutil.rmtree(d, ignore_errors=True)
    out = atomic_write_text(args.out, json.dumps({"runs": [asdict(r) for r in runs], "args": vars(args)}, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
