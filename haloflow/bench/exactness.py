"""What equal floats at every K cost: step time and bytes of the K-invariant path against the path it replaces.

    haloflow bench exactness [--families dlrm,gcn,tgn] [--ks 1,2] [--rounds 5] [--units N] [--out FILE.json]

Each cell is a real ``haloflow train FAMILY`` run (``--nproc K``, the command a user types), read back from its JSON
summary: seconds per unit of training (start-up and evaluation excluded) and the bytes rank 0 sent per unit. The
two paths of a family run round-robin (old, new, old, new, ...) so that drift on a busy machine hits both alike,
and the result is the median over rounds of the per-round ratio new / old::

    family  the K-invariant path (the default)                  the path it replaces
    dlrm    V = 4 logical workers: MLPs per slice, the V-tree   --no-k-invariance: V = K, one product per rank
    tgn     V = 4: each batch in 4 slices, the V-tree            --no-k-invariance: V = K
    gcn     a folder of 4 parts hosted by K ranks                a folder of K parts (one product per rank)

DLRM: the synthetic log, 300 steps; TGN: the JODIE Wikipedia stream ($HALOFLOW_DATA), 120 batches of one epoch,
no evaluation; GCN: a generated 20,000-node graph, 60 epochs.

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

from haloflow.bench.args import at_least, k_list, names
from haloflow.data.paths import data_root
from haloflow.utils.help_format import HelpFormatter
from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.table import format_table

__all__ = ["main", "FAMILIES"]


def _dlrm(k: int, new: bool, tmp: Path, units: int | None) -> list[str]:
    return ["dlrm", "--synthetic", "--max-steps", str(units or 300), "--max-eval-batches", "1",
            *([] if new else ["--no-k-invariance"])]


def _wikipedia() -> Path:
    return data_root() / "temporal" / "jodie_wikipedia_edges.csv"


def _tgn(k: int, new: bool, tmp: Path, units: int | None) -> list[str]:
    return ["tgn", "--events", str(_wikipedia()), "--epochs", "1", "--max-batches", str(units or 120), "--no-eval",
            *([] if new else ["--no-k-invariance"])]


def _gcn(k: int, new: bool, tmp: Path, units: int | None) -> list[str]:
    """A generated graph of 20,000 nodes: the new path trains its 4-part folder at K; the old one trains the K-part
    folder at K (one product over each process's rows, as before V existed)."""
    parts = 4 if new else k
    folder = tmp / f"gcn-parts-{parts}"
    if not folder.exists():
        import dataclasses

        import numpy as np

        from haloflow.data.generators import sbm_dataset
        from haloflow.partition.pipeline import PartitionConfig, partition_dataset

        data = sbm_dataset(num_nodes=20_000, seed=3)
        data = dataclasses.replace(data, features=np.abs(data.features))
        partition_dataset(data, PartitionConfig(num_parts=parts), folder, progress=False)
    return ["gcn", "--partitions", str(folder), "--epochs", str(units or 60)]


FAMILIES = {"dlrm": _dlrm, "tgn": _tgn, "gcn": _gcn}
# bytes per unit: DLRM and TGN report rank 0's bytes of every collective a step; GCN's epoch records hold the halo
# and gradient bytes all ranks sent in the epoch
BYTES_KEYS = ("comm_bytes_per_step", "comm_bytes_per_batch")


def _run(family: str, k: int, new: bool, tmp: Path, units: int | None = None) -> dict:
    """One training run; its seconds per unit and rank 0's bytes per unit from the JSON summary."""
    log = tmp / f"{family}-{k}-{'new' if new else 'old'}.jsonl"
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "haloflow", "train", *FAMILIES[family](k, new, tmp, units), "--nproc", str(k),
           "--device", "cpu", "--log-jsonl", str(log)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    summary, metrics = records[-1], records[-1]["metrics"]
    sent = next((metrics[key] for key in BYTES_KEYS if key in metrics), None)
    if sent is None:  # GCN: the epochs' halo and gradient bytes
        epochs = [r for r in records if r.get("kind") == "epoch" and "halo_bytes" in r]
        sent = statistics.mean(r["halo_bytes"] + r["grad_bytes"] for r in epochs) if epochs else None
    return {"s_per_unit": 1.0 / summary["units_per_s"], "bytes_per_unit": sent,
            "logical_workers": summary.get("logical_workers"), "unit": summary["unit"]}


def _bytes(n: float | None) -> str:
    return "-" if n is None else f"{n:,.0f}"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--families", type=names(tuple(FAMILIES)), default="dlrm,gcn,tgn",
                   help="which families, comma-separated (default: dlrm,gcn,tgn)")
    p.add_argument("--ks", type=k_list, default="1,2", help="numbers of ranks, comma-separated; each must divide 4 "
                   "(V) by a power of two (default: 1,2)")
    p.add_argument("--rounds", type=at_least(1, 1000), default=5,
                   help="round-robin rounds; the median per-round ratio is reported (default: 5)")
    p.add_argument("--units", type=at_least(2, 10**6), default=None, metavar="N",
                   help="units of training per run, for a quick look (default: DLRM 300 steps, TGN 120 batches, GCN "
                   "60 epochs)")
    p.add_argument("--out", type=Path, default=Path("bench-results/exactness.json"),
                   help="JSON results (default: bench-results/exactness.json)")
    args = p.parse_args(argv)
    families = args.families.split(",")
    ks = [int(x) for x in args.ks.split(",")]
    if any(k not in (1, 2, 4) for k in ks):
        p.error(f"argument --ks: each K must host V = 4 logical workers (1, 2 or 4), got {args.ks!r}")
    if "tgn" in families and not _wikipedia().is_file():
        p.error(f"tgn needs {_wikipedia()}: set HALOFLOW_DATA, or leave tgn out of --families")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results, rows = [], []
    with tempfile.TemporaryDirectory(prefix="haloflow-exactness-") as tmp:
        for family in families:
            for k in ks:
                old, new = [], []
                for _ in range(args.rounds):
                    old.append(_run(family, k, False, Path(tmp), args.units))
                    new.append(_run(family, k, True, Path(tmp), args.units))
                ratios = [n["s_per_unit"] / o["s_per_unit"] for o, n in zip(old, new)]
                cell = {"family": family, "k": k, "unit": new[0]["unit"], "v": new[0]["logical_workers"],
                        "old_s_per_unit": statistics.median(o["s_per_unit"] for o in old),
                        "new_s_per_unit": statistics.median(n["s_per_unit"] for n in new),
                        "ratio_median": statistics.median(ratios), "ratios": ratios,
                        "old_bytes_per_unit": old[0]["bytes_per_unit"], "new_bytes_per_unit": new[0]["bytes_per_unit"]}
                results.append(cell)
                rows.append([family, k, cell["v"], f"{cell['old_s_per_unit'] * 1e3:.2f}",
                             f"{cell['new_s_per_unit'] * 1e3:.2f}", f"{cell['ratio_median']:.3f}",
                             _bytes(cell["old_bytes_per_unit"]), _bytes(cell["new_bytes_per_unit"])])
    print(format_table(["family", "K", "V", "old ms/unit", "new ms/unit", "new/old (median)", "old bytes/unit",
                        "new bytes/unit"], rows,
                       title=f"exactness: the K-invariant path against the one it replaces ({args.rounds} rounds)"))
    result = {"benchmark": "exactness", "rounds": args.rounds, "units": args.units, "results": results}
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
