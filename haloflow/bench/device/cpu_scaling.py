"""Multi-rank CPU scaling on the lent machine's cores: distributed GCN at K = 1, 2, 4 and TGN's distributed step.

The GPU stays idle here: every rank runs gloo on the CPU (``--device`` is only noted). The lent machine is the one
place with enough cores for K ranks of several threads each without starving them (the development VM has 2).

    GCN   ``haloflow bench gcn-dist`` (``haloflow.bench.gcn_dist.main``) at K = 1, 2, 4 with the same threads per rank
          at every K: epoch time (overlapped schedule) and its speed-up over K = 1, the wait-first control and the
          overlap ratio, halo bytes against their prediction (must be equal), and the cost model's predicted epoch
          time against the measured one (target: within 10 %; K = 1 is the model's calibration point, so K = 2, 4
          are the real predictions). A missed target is reported, not failed.
    TGN   the distributed rows of ``haloflow bench tgn`` at K = 2, 4 (its ``--worker`` under torchrun, one thread per
          rank as there, a few batches): step time of both schedules, fetch and sampling alone, overlap, memory-row
          bytes fetched against their prediction (must be equal). Needs ``$HALOFLOW_DATA/temporal/
          jodie_wikipedia_edges.csv``; without it the rows fail with the path and the GCN rows still run.

The benchmark's one-process TGN comparison (an evaluated epoch, EdgeBank) is not run: it is not about scaling and
costs more than this part's budget, so the workers are launched the way ``tgn.main`` launches them.

Partitioning: METIS where pymetis imports (``scripts/device_check.sh`` installs a carried wheel), else streaming Fennel
(numba; its cuts are heavier, so the halos and the K = 4 speed-up read worse). A part fails
(exit 1) only on an error or a broken comparison (bytes that differ from the prediction), never on a missed target.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from haloflow.bench.device.common import Table, parse_part_args, part_parser, write_part
from haloflow.utils.cores import cores_here

NAME = "cpu_scaling"
MODEL_TOLERANCE = 0.10  # the cost model's target: predicted epoch time within 10 % of the measured one
TGN_TIMEOUT_S = 50  # one K of the TGN workers (~10 s on 16 cores); a hang must not eat the part's 170 s


@dataclass(frozen=True)
class Sizes:
    scale: int  # GCN graph of 2^scale nodes
    epochs: int  # timed GCN epochs per schedule (after one warm-up each)
    threads: int  # torch threads per GCN rank, the same at every K
    ks: tuple[int, ...]  # GCN rank counts; the first must be 1 (the speed-up's base)
    tgn_ks: tuple[int, ...]
    tgn_batches: int  # TGN batches per schedule; the worker drops the first 2 (kernel compilation)


# Full size, 16 cores, 4 threads per rank. Measured on the 2-core VM with 1 thread: a training step of the default
# model (feat 64, hidden 64, 3 layers, degree 10) takes ~1.0 s at 2^18 nodes, so ~2 s at 2^19 and ~0.6-0.7 s on
# 4 threads. Per K the worker runs 2 warm-up + 2 x epochs timed + 1 counting step, and the driver one process's
# ~4 steps + the rates at K = 1's cost, so 5 epochs cost ~13 x (T1 + T2 + T4) + 3 x 5 x T1 ~ 40 x T1 ~ 30 s, plus
# three torchrun starts (~4 s each), Fennel (~4 s per K > 1 at 2^19) and the graph (~1-3 s): ~60 s. 2^20 would be
# ~2x that, more than this part's 170 s limit leaves beside TGN and numba's first compilations.
FULL = Sizes(scale=19, epochs=5, threads=4, ks=(1, 2, 4), tgn_ks=(2, 4), tgn_batches=20)
TINY = Sizes(scale=12, epochs=1, threads=1, ks=(1, 2), tgn_ks=(2,), tgn_batches=4)


# ------------------------------------------------------------------------------------------------ GCN

def partition_method() -> str:
    """gcn-dist's METIS where pymetis imports, else Fennel (no pymetis on the lent machine without the wheel)."""
    return "metis" if _importable("pymetis") else "fennel"

def run_gcn(sizes: Sizes, threads: int, out: Path) -> tuple[Table, dict, list[str]]:
    """gcn-dist at every K of ``sizes`` with ``threads`` per rank; the table, its JSON and the failures."""
    from haloflow.bench import gcn_dist

    out_json = out / "gcn_dist.json"
    argv = ["--scale", str(sizes.scale), "--ks", ",".join(map(str, sizes.ks)), "--epochs", str(sizes.epochs),
            "--threads", str(threads), "--method", partition_method(), "--device", "cpu", "--out", str(out_json)]
    print(f"[{NAME}] gcn-dist {' '.join(argv)}", flush=True)
    torch_threads = torch.get_num_threads()  # gcn_dist's rate measurements set this process's threads
    try:
        code = gcn_dist.main(argv)
    except SystemExit as e:  # a K whose ranks failed: gcn_dist exits with their stderr
        code = e.code
    finally:
        torch.set_num_threads(torch_threads)
    table = Table(f"GCN epoch (gcn-dist), 2^{sizes.scale} nodes, {threads} thread(s) per rank, gloo on the CPU, "
                  f"{partition_method()} parts; overlap = (control - overlapped) / min(exchange, inner)",
                  ["K", "thr/rank", "wait-first s", "overlapped s", "speed-up", "overlap", "exchange s", "inner s",
                   "model s", "model err %", "within 10 %", "halo bytes", "= predicted"],
                  float_fmt=[".0f", ".0f", ".3f", ".3f", ".2f", ".2f", ".3f", ".3f", ".3f", "+.1f", "s", ".0f", "s"])
    if code not in (0, None):
        return table, {"error": str(code)}, [f"gcn-dist failed: {str(code)[-2000:]}"]
    result = json.loads(out_json.read_text())
    failures = []
    for run in result["runs"]:
        err = run["predicted_epoch_s"] / run["epoch_s"] - 1
        run["model_error"], run["model_within_target"] = err, abs(err) <= MODEL_TOLERANCE
        table.rows.append([run["k"], run["threads_per_rank"], run["control_epoch_s"], run["epoch_s"],
                           run["speedup_vs_k1"], run["overlap"], run["exchange_alone_s"] if run["k"] > 1 else None,
                           run["inner_alone_s"], run["predicted_epoch_s"], 100 * err,
                           "yes" if run["model_within_target"] else "no", run["halo_bytes"], run["bytes_match"]])
        if not run["bytes_match"]:
            failures.append(f"GCN K={run['k']}: halo bytes {run['halo_bytes']} != predicted "
                            f"{run['halo_bytes_predicted']}")
        if run["threads_per_rank"] != threads:
            failures.append(f"GCN K={run['k']}: ranks ran {run['threads_per_rank']} threads, asked {threads}")
    got = [run["k"] for run in result["runs"]]
    if got != list(sizes.ks):
        failures.append(f"GCN: rows for K = {got}, expected {list(sizes.ks)}")
    return table, result, failures


# ------------------------------------------------------------------------------------------------ TGN
def tgn_summary(k: int, per_rank: list[dict]) -> tuple[list, dict]:
    """One K's table row and record from the workers' rows, as ``haloflow.bench.tgn.main`` summarises them: the
    slowest rank's times, overlap = (control - overlapped) / min(fetch, sampling), bytes summed over ranks."""
    slow = {key: max(r[key] for r in per_rank) for key in ("overlap", "wait_first", "fetch_s", "sample_s")}
    hide = min(slow["fetch_s"], slow["sample_s"])
    overlap = (slow["wait_first"] - slow["overlap"]) / hide if hide > 0 else None
    got = [sum(b) for b in zip(*(r["bytes"] for r in per_rank))]  # per batch, all ranks
    want = [sum(b) for b in zip(*(r["bytes_predicted"] for r in per_rank))]
    events_per_s = min(r["events_per_s"] for r in per_rank)
    row = [k, events_per_s, 1e3 * slow["wait_first"], 1e3 * slow["overlap"], 1e3 * slow["fetch_s"],
           1e3 * slow["sample_s"], overlap, statistics.mean(got) / k, got == want, "ok" if got == want else "bytes"]
    record = {"k": k, "events_per_s": events_per_s, "control_s": slow["wait_first"],
              "overlapped_s": slow["overlap"], "fetch_s": slow["fetch_s"], "sample_s": slow["sample_s"],
              "overlap_ratio": overlap, "bytes_per_batch": got, "bytes_predicted": want, "bytes_match": got == want,
              "per_rank": per_rank}
    return row, record


def run_tgn(sizes: Sizes, events: Path) -> tuple[Table, list[dict], list[str]]:
    """TGN's distributed step at every K of ``sizes`` (one thread per rank); the table, records and failures."""
    from haloflow.engine.launch import launch_torchrun

    table = Table(f"TGN distributed step (bench tgn --worker), 1 thread per rank, {sizes.tgn_batches} batches of "
                  "200 per schedule (first 2 dropped); overlap = (control - overlapped) / min(fetch, sampling)",
                  ["K", "events/s", "control ms", "overlapped ms", "fetch ms", "sampling ms", "overlap",
                   "fetch B/batch/rank", "= predicted", "status"],
                  float_fmt=[".0f", ",.0f", ".2f", ".2f", ".3f", ".3f", ".2f", ",.0f", "s", "s"])
    if not events.is_file():
        for k in sizes.tgn_ks:
            table.rows.append([k, None, None, None, None, None, None, None, None, f"failed: no {events}"])
        return table, [], [f"TGN: event stream {events} not found (set HALOFLOW_DATA)"]
    records, failures = [], []
    with tempfile.TemporaryDirectory(prefix="cpu_scaling-tgn-") as tmp:
        for k in sizes.tgn_ks:
            out = Path(tmp) / f"k{k}.json"
            t0 = time.perf_counter()
            try:
                proc = launch_torchrun(k, ["-m", "haloflow.bench.tgn", "--worker", "--events", events,
                                           "--worker-out", out, "--batches", sizes.tgn_batches],
                                       threads_per_rank=1, capture_output=True, text=True, timeout=TGN_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # a row of its own: the GCN rows already measured are kept
                table.rows.append([k, None, None, None, None, None, None, None, None, "failed: timeout"])
                failures.append(f"TGN K={k} did not finish in {TGN_TIMEOUT_S} s")
                continue
            if proc.returncode != 0:
                table.rows.append([k, None, None, None, None, None, None, None, None, f"failed: rc {proc.returncode}"])
                failures.append(f"TGN K={k} failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
                continue
            row, record = tgn_summary(k, json.loads(out.read_text()))
            table.rows.append(row)
            records.append(record)
            if not record["bytes_match"]:
                failures.append(f"TGN K={k}: fetched bytes per batch {record['bytes_per_batch']} != predicted "
                                f"{record['bytes_predicted']}")
            print(f"[{NAME}] TGN K={k}: {time.perf_counter() - t0:.1f} s, {row[1]:.0f} events/s", flush=True)
    return table, records, failures


# ------------------------------------------------------------------------------------------------ driver
def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    from haloflow.bench.tgn import DEFAULT_EVENTS
    from haloflow.data.paths import data_root

    p = part_parser(f"python -m haloflow.bench.device.{NAME}", __doc__.splitlines()[0])
    args, _ = parse_part_args(p, argv)
    sizes = TINY if args.tiny else FULL
    t_start = time.perf_counter()
    cpu_count, affinity = os.cpu_count() or 1, cores_here()
    # the same threads at every K, as long as the largest K's ranks fit on the cores
    threads = min(sizes.threads, max(1, affinity // max(sizes.ks)))
    notes = [f"cores: os.cpu_count() = {cpu_count}, sched_getaffinity = {affinity}; GCN ranks x threads: "
             + ", ".join(f"{k} x {threads}" for k in sizes.ks) + "; TGN: 1 thread per rank",
             f"partitioning: {partition_method()} (METIS where pymetis imports, else Fennel)",
             f"model err % = predicted / measured - 1 of the overlapped epoch; target within {MODEL_TOLERANCE:.0%}; "
             "K = 1 is the model's calibration point (its 'other' rate comes from a one-process step on the same "
             "threads), K > 1 are its predictions"]
    if threads < sizes.threads:
        notes.append(f"threads per rank lowered from {sizes.threads} to {threads}: only {affinity} cores here")
    if args.device.type != "cpu":
        notes.append(f"--device {args.device} noted and ignored: the ranks run gloo on the CPU")
    print(f"[{NAME}] {notes[0]}", flush=True)

    gcn_table, gcn, failures = run_gcn(sizes, threads, args.out)
    print(f"[{NAME}] GCN done at {time.perf_counter() - t_start:.1f} s", flush=True)
    events = data_root() / DEFAULT_EVENTS
    tgn_table, tgn, tgn_failures = run_tgn(sizes, events)
    failures += tgn_failures
    notes += failures
    notes.append(f"wall time of the part: {time.perf_counter() - t_start:.1f} s")
    result = {"sizes": sizes.__dict__, "cpu_count": cpu_count, "affinity_cores": affinity,
              "threads_per_rank": threads, "partition_method": partition_method(), "gcn": gcn, "tgn": tgn,
              "tgn_events": str(events), "failures": failures}
    return write_part(args, NAME, [gcn_table, tgn_table], result, ok=not failures, notes=notes)


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
