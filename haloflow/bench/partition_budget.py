"""Does ``--memory-budget`` hold? Peak RSS of the whole ``haloflow partition`` process, from the OS, at each budget.

For each budget B an edge file at least ``--ratio`` (default 4) times B is generated once into ``--work``: int64
pairs ``(E, 2)`` in a ``.npy``, each edge joining a node to one at most 50 ids away (the locality of a mesh or a road
network numbered along its geometry), N = nodes chosen so that the per-node arrays take about a tenth of B. Then
``python -m haloflow partition FILE --method fennel --parts K --memory-budget B`` runs as a child process; its peak
RSS is GNU time's ``%M`` (``ru_maxrss`` from ``wait4``: the kernel's high-water mark of that process, interpreter,
libraries and every page it touched), and its estimate is the line it prints before reading the graph.

    haloflow bench partition-budget                              # 256 MiB, 384 MiB, 1 GiB (about 20 min, 13 GB disk)
    haloflow bench partition-budget --budgets 256MiB --ratio 4   # one row

Targets (issue 35, acceptance 3): peak <= B at every budget; the printed estimate within 15 % of the peak.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.memory import format_bytes, parse_bytes

__all__ = ["main", "edge_file", "measure"]

TIME = "/usr/bin/time"  # GNU time: the peak RSS of the run as the OS counts it (%M, KiB)
_ESTIMATE = re.compile(r"estimate before reading: peak memory about ([0-9.]+ [KMGT]?i?B)")


@dataclass
class Run:
    budget: int
    file_bytes: int
    edges: int
    nodes: int
    parts: int
    peak_rss: int
    estimate: int
    seconds: float
    exit_status: int

    @property
    def holds(self) -> bool:
        return self.exit_status == 0 and self.peak_rss <= self.budget

    @property
    def estimate_error(self) -> float:
        return self.estimate / max(self.peak_rss, 1) - 1


def edge_file(path: Path, edges: int, nodes: int, seed: int = 0) -> Path:
    """int64 (E, 2) local edges (|u - v| <= 50, mod N), written in chunks (module docstring); kept if present."""
    if path.exists():
        return path
    tmp = path.with_suffix(".part.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(edges, 2))
    rng = np.random.default_rng(seed)
    step = 1 << 23
    for lo in range(0, edges, step):
        hi = min(edges, lo + step)
        src = rng.integers(0, nodes, hi - lo)  # (c,)
        out[lo:hi, 0] = src
        out[lo:hi, 1] = (src + rng.integers(-50, 51, hi - lo)) % nodes
    out.flush()
    del out
    tmp.rename(path)
    return path


def measure(path: Path, budget: int, parts: int, out_dir: Path, tmp_dir: Path) -> tuple[int, int, float, int]:
    """(peak RSS bytes, printed estimate bytes, seconds, exit status) of one partition run in a child process."""
    cmd = [sys.executable, "-m", "haloflow", "partition", str(path), "--method", "fennel", "--parts", str(parts),
           "--memory-budget", str(budget), "--out", str(out_dir), "--tmp-dir", str(tmp_dir), "--overwrite"]
    # Through /usr/bin/time, not os.wait4 of our own child: a forked child's ru_maxrss starts at its parent's
    # resident set (the page tables are copied), so wait4 reported this benchmark's 352 MiB for a run /usr/bin/time
    # measured at 180 MiB. /usr/bin/time forks the run from its own small process and reads wait4 of that.
    log_out, log_err = out_dir.with_suffix(".stdout"), out_dir.with_suffix(".stderr")
    t0 = time.perf_counter()
    with open(log_out, "w") as fo, open(log_err, "w") as fe:
        code = subprocess.run([TIME, "-f", "MAXRSS_KIB %M", *cmd], stdout=fo, stderr=fe).returncode
    seconds = time.perf_counter() - t0
    err = log_err.read_text()
    peak = int(re.findall(r"MAXRSS_KIB (\d+)", err)[-1]) * 1024
    match = _ESTIMATE.search(log_out.read_text())
    estimate = parse_bytes(match.group(1).replace(" ", "")) if match else 0
    if code != 0:
        print(err.strip(), file=sys.stderr)
    return peak, estimate, seconds, code


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="256MiB,384MiB,1GiB", help="comma-separated budgets (default: %(default)s)")
    ap.add_argument("--ratio", type=float, default=4.0, help="edge file size / budget (default: %(default)s)")
    ap.add_argument("--parts", type=int, default=16, help="parts K of every run (default: %(default)s)")
    ap.add_argument("--work", default="bench-work/partition-budget", help="where inputs, outputs and temporary "
                    "files go (default: %(default)s)")
    ap.add_argument("--out", default="bench-results/partition_budget.json",
                    help="where the JSON results go (default: %(default)s)")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for text in args.budgets.split(","):
        budget = parse_bytes(text)
        edges = int(np.ceil(args.ratio * budget / 16))  # 16 bytes per int64 pair
        nodes = max(budget // 10 // 25, 1000)  # the per-node arrays (25 B per node) take a tenth of the budget
        path = edge_file(work / f"edges-{edges}-{nodes}.npy", edges, nodes)
        print(f"{format_bytes(budget)}: {edges:,} edges over {nodes:,} nodes ({format_bytes(path.stat().st_size)})",
              file=sys.stderr, flush=True)
        peak, estimate, seconds, status = measure(path, budget, args.parts, work / "out", work)
        runs.append(Run(budget, path.stat().st_size, edges, nodes, args.parts, peak, estimate, seconds, status))
    print("| budget | edge file | edges | nodes | K | peak RSS (OS) | peak / budget | printed estimate | "
          "estimate / peak | time s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {format_bytes(r.budget)} | {format_bytes(r.file_bytes)} | {r.edges:,} | {r.nodes:,} | {r.parts} | "
              f"{format_bytes(r.peak_rss)} | {r.peak_rss / r.budget:.3f} | {format_bytes(r.estimate)} | "
              f"{r.estimate / max(r.peak_rss, 1):.3f} | {r.seconds:.0f} |")
    verdicts = [f"{'PASS' if r.holds and abs(r.estimate_error) <= 0.15 else 'MISS'} {format_bytes(r.budget)}: peak "
                f"{r.peak_rss / r.budget:.3f}x the budget, estimate {r.estimate_error:+.1%} (targets <= 1, +-15 %)"
                for r in runs]
    print("\n".join([""] + verdicts))
    out = atomic_write_text(args.out, json.dumps({"runs": [asdict(r) for r in runs], "targets": verdicts}, indent=1))
    print(f"\nwrote {out}")
    return 0 if all(r.holds for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
