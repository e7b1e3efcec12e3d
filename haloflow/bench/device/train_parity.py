"""``haloflow train gcn / dlrm / tgn --device cuda`` against the same command with ``--device cpu``: the same losses.

Each pair runs the real CLI twice (two processes, side by side: the CPU run on the cores, the other on the device),
reads both ``--log-jsonl`` streams and compares the loss of every
logged unit (GCN: each epoch on Cora; DLRM: each step on the synthetic click log; TGN: the epoch's mean loss over
the first batches of Wikipedia), and reports each side's units per second. Tolerances, relative to the loss:

    dlrm-float64      1e-9   float64 end to end: only the order of additions differs between MKL and cuBLAS/cuSPARSE
    gcn, dlrm, cache  1e-4   float32: each GEMM or sparse product rounds differently by ~1e-7 relative on each side,
                             and 60-100 optimizer steps carry it forward (a ReLU input within rounding of 0 can flip;
                             the float64 row shows the math is the same)
    tgn               1e-3   the mean loss of the first 10 batches. Past ~10 batches float32 TGN training drifts
                             apart on the CPU alone: 1 thread against 2 (the attention's GEMMs sum in another order)
                             gave 60-batch means 4.5e-3 apart and 10-batch means 3.5e-8 apart (2-core VM,
                             2026-12-04); on the H200 the 60-batch mean read 1.5e-5 from the CPU's in one run and
                             2.4e-3 in the next, and the device check's tgn_gpu part compares the first 10 batches
                             one by one

``dlrm-cached`` trains with ``--cache-ratio 0.05`` on both sides (on the device: 5 % of each table's rows in device
slots over host memory; on the CPU: the cache's host path). Its reference is the cached CPU run, not the uncached
one: without a cache the trainer's tables are parameters updated one occurrence at a time, through a cache each row
gets its summed gradient, so those two differ by rounding from the first step (seen on the CPU alone: 1e-7 at step
1, 1.7e-3 by step 40 of the synthetic log; the cache_gpu part compares the cache with the same row stores
uncached, bit for bit).
``--tiny`` runs both sides on the CPU with fewer units (a dry run of the comparison itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from haloflow.bench.device.common import Table, parse_part_args, part_parser, write_part

NAME = "train_parity"
ROOT = Path(__file__).resolve().parents[3]
TINY_PAIR_S = 100.0  # a 2-core CPU, the suite beside it, numba compiling from cold in a fresh clone
PAIR_S = 34.0  # one pair side by side (10-24 s on the H200 machine): five pairs within the runner's 180 s


def data_dir() -> Path:
    return Path(os.environ.get("HALOFLOW_DATA", ROOT.parent / "shared" / "data"))


def runs(tiny: bool) -> list[tuple[str, list[str], float]]:
    """(name, the CLI's arguments without --device, relative tolerance)."""
    data = data_dir()
    epochs, steps, batches = (5, 8, 5) if tiny else (100, 60, 10)
    dlrm = ["train", "dlrm", "--synthetic", "--max-steps", str(steps), "--log-every", "1", "--max-eval-batches", "2"]
    return [
        ("gcn", ["train", "gcn", "--dataset", str(data / "planetoid"), "--epochs", str(epochs)], 1e-4),
        ("dlrm", dlrm, 1e-4),
        ("dlrm-float64", [*dlrm[:4], str(min(steps, 50)), *dlrm[5:], "--dtype", "float64"], 1e-9),
        ("dlrm-cached", [*dlrm, "--cache-ratio", "0.05"], 1e-4),
        ("tgn", ["train", "tgn", "--events", str(data / "temporal" / "jodie_wikipedia_edges.csv"), "--epochs", "1",
                 "--max-batches", str(batches), "--no-eval"], 1e-3),
    ]


def start_cli(args: list[str], device: str, folder: Path, tag: str) -> tuple[subprocess.Popen, Path, list[str]]:
    log = folder / f"{tag}-{device}.jsonl"
    cmd = [sys.executable, "-m", "haloflow", *args, "--device", device, "--log-jsonl", str(log), "--no-progress"]
    with open(folder / f"{tag}-{device}.out", "w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True), log, cmd


def finish_cli(started: tuple[subprocess.Popen, Path, list[str]], timeout_s: float) -> list[dict]:
    """The CLI's JSON records once it exits 0; RuntimeError with its output's tail otherwise."""
    proc, log, cmd = started
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = "killed (time limit)"
    if rc != 0:
        tail = log.with_suffix(".out").read_text(errors="replace")[-2500:]
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}:\n{tail}")
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records if r.get("kind") in ("epoch", "train") and "loss" in r]


def summary(records: list[dict]) -> dict:
    return next((r for r in records if r.get("kind") == "summary"), {})


def main(argv: list[str] | None = None) -> int:
    p = part_parser(f"python -m haloflow.bench.device.{NAME}", __doc__.splitlines()[0])
    args, _ = parse_part_args(p, argv)
    other = args.device.type  # the device side; the reference is always the CPU
    pair_s = TINY_PAIR_S if args.tiny else PAIR_S
    table = Table(f"haloflow train on {other} against cpu: every logged loss compared",
                  ["run", "units", f"{other} units/s", "cpu units/s", "max rel diff", "tolerance", "same", "wall s"],
                  float_fmt=["", "", ".1f", ".1f", ".2e", ".0e", "", ".1f"])
    result, ok = {}, True
    with tempfile.TemporaryDirectory(prefix="haloflow-parity-") as tmp:
        for name, cli, tol in runs(args.tiny):
            print(f"[{NAME}] {name}: cpu and {other} side by side", flush=True)
            t0 = time.perf_counter()
            both = [start_cli(cli, "cpu", Path(tmp), name), start_cli(cli, other, Path(tmp), name + "-dev")]
            try:  # side by side: the reference on the CPU cores, the other on the device
                ref, dev = (finish_cli(s, max(1.0, pair_s - (time.perf_counter() - t0))) for s in both)
            except RuntimeError as e:
                for proc, _, _ in both:
                    proc.kill()
                    proc.wait()
                print(f"[{NAME}] {name} FAILED: {e}", flush=True)
                table.rows.append([name, None, None, None, None, tol, "FAILED", time.perf_counter() - t0])
                result[name] = {"error": str(e)}
                ok = False
                continue
            a, b = losses(ref), losses(dev)
            diff = (max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)) if a and len(a) == len(b)
                    else float("inf"))
            same = diff <= tol
            ok &= same
            rate = (summary(dev).get("units_per_s"), summary(ref).get("units_per_s"))
            table.rows.append([name, len(a), rate[0], rate[1], diff, tol, same, time.perf_counter() - t0])
            result[name] = {"cpu_losses": a, f"{other}_losses": b, "max_rel_diff": diff, "tolerance": tol,
                            "same": same, "units_per_s": {other: rate[0], "cpu": rate[1]},
                            "device_summary": summary(dev)}
    notes = ["units/s is the trainer's own summary (units_trained / train_s) of each run, the two runs side by side: "
             "Cora and the scaled-down synthetic tables are small, so these rates show launch overhead, not the "
             "device's capacity."]
    return write_part(args, NAME, [table], {"runs": result}, ok=ok, notes=notes)


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
