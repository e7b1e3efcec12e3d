"""What equal floats at every K cost: step time and bytes of the K-invariant path against the path it replaces.

    haloflow bench exactness [--families dlrm,gcn,tgn] [--ks 1,2] [--rounds 5] [--out bench-results/exactness.json]

Each cell is a real ``haloflow train FAMILY`` run (``--nproc K``, the command a user types), read back from its JSON
summary: seconds per unit of training (start-up and evaluation excluded) and the bytes rank 0 sent per unit. The
two paths of a family run round-robin (old, new, old, new, ...) so that drift on a busy machine hits both alike,
and the result is the median over rounds of the per-round ratio new / old::

    family  the K-invariant path (the default)                  the path it replaces
    dlrm    V = 4 logical workers: MLPs per slice, the V-tree   --no-k-invariance: V = K, one product per rank
    tgn     V = 4: each batch in 4 slices, the V-tree            --no-k-invariance
    gcn     a folder of 4 parts hosted by K ranks                at K = 1 the whole graph; at K = 2 a 2-part folder

Target (issue 33, after EasyScale's 0-7 %): new / old <= 1.05 at K = 1 and K = 2. On a 2-core machine K = 2 ranks
get one core each; the ratio is the result, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from haloflow.utils.help_format import HelpFormatter
from haloflow.utils.table import format_table

__all__ = ["main", "FAMILIES"]


def _dlrm(k: int, new: bool, tmp: Path) -> list[str]:
    return ["dlrm", "--synthetic", "--max-steps", "300", "--max-eval-batches", "1",
            *([] if new else ["--no-k-invariance"])]


def _tgn(k: int, new: bool, tmp: Path) -> list[str]:
    return ["tgn", "--synthetic", "--epochs", "1", *([] if new else ["--no-k-invariance"])]


def _gcn(k: int, new: bool, tmp: Path) -> list[str]:
    graph = ["--nodes", "20000", "--seed", "0"]
    if not new and k == 1:
        return ["gcn", "--dataset", "synthetic", *graph, "--epochs", "30"]
    parts = 4 if new else k
    folder = tmp / f"parts-{parts}"
    if not folder.exists():
        subprocess.run([sys.executable, "-m", "haloflow", "partition", "--graph", "synthetic", *graph,
                        "--parts", str(parts), "--out", str(folder)], check=True, capture_output=True)
    return ["gcn", "--partitions", str(folder), "--epochs", "30"]


FAMILIES = {"dlrm": _dlrm, "tgn": _tgn, "gcn": _gcn}
BYTES_KEYS = ("comm_bytes_per_step", "comm_bytes_per_epoch", "comm_bytes_per_batch", "bytes_per_unit")


def _run(family: str, k: int, new: bool, tmp: Path) -> dict:
    """One training run; its seconds per unit and rank 0's bytes per unit from the JSON summary."""
    log = tmp / f"{family}-{k}-{'new' if new else 'old'}.jsonl"
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "haloflow", "train", *FAMILIES[family](k, new, tmp), "--nproc", str(k),
           "--device", "cpu", "--log-jsonl", str(log)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    summary = [json.loads(line) for line in log.read_text().splitlines()][-1]
    metrics = summary["metrics"]
    sent = next((metrics[key] for key in BYTES_KEYS if key in metrics), None)
    return {"s_per_unit": 1.0 / summary["units_per_s"], "bytes_per_unit": sent,
            "logical_workers": summary.get("logical_workers"), "unit": summary["unit"]}


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--families", default="dlrm,gcn,tgn", help="which families, comma-separated")
    p.add_argument("--ks", default="1,2", help="numbers of ranks, comma-separated")
    p.add_argument("--rounds", type=int, default=5, help="round-robin rounds (the median ratio is reported)")
    p.add_argument("--out", type=Path, default=Path("bench-results/exactness.json"), help="JSON results")
    args = p.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        p.error(f"--families: expected names from {', '.join(FAMILIES)}, got {args.families!r}")
    try:
        ks = [int(x) for x in args.ks.split(",")]
    except ValueError:
        p.error(f"--ks: expected comma-separated integers like 1,2, got {args.ks!r}")
    if not ks or min(ks) < 1 or args.rounds < 1:
        p.error("--ks needs integers >= 1 and --rounds >= 1")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results, rows = [], []
    with tempfile.TemporaryDirectory(prefix="haloflow-exactness-") as tmp:
        for family in families:
            for k in ks:
                old, new = [], []
                for _ in range(args.rounds):
                    old.append(_run(family, k, False, Path(tmp)))
                    new.append(_run(family, k, True, Path(tmp)))
                ratios = [n["s_per_unit"] / o["s_per_unit"] for o, n in zip(old, new)]
                cell = {"family": family, "k": k, "unit": new[0]["unit"], "v": new[0]["logical_workers"],
                        "old_s_per_unit": statistics.median(o["s_per_unit"] for o in old),
                        "new_s_per_unit": statistics.median(n["s_per_unit"] for n in new),
                        "ratio_median": statistics.median(ratios), "ratios": ratios,
                        "old_bytes_per_unit": old[0]["bytes_per_unit"], "new_bytes_per_unit": new[0]["bytes_per_unit"]}
                results.append(cell)
                rows.append([family, k, cell["v"], f"{cell['old_s_per_unit'] * 1e3:.2f}",
                             f"{cell['new_s_per_unit'] * 1e3:.2f}", f"{cell['ratio_median']:.3f}",
                             cell["old_bytes_per_unit"], cell["new_bytes_per_unit"]])
    print(format_table(["family", "K", "V", "old ms/unit", "new ms/unit", "new/old (median)", "old bytes/unit",
                        "new bytes/unit"], rows,
                       title=f"exactness: the K-invariant path against the one it replaces ({args.rounds} rounds)"))
    args.out.write_text(json.dumps({"rounds": args.rounds, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
