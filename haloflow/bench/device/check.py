"""The device check: every GPU path of haloflow run and measured on one machine, part by part, in one command.

    bash scripts/device_check.sh OUT                   # on a GPU machine: every part, about 6 minutes on one H200
                                                       # (the parts' limits allow 15: --total-s S fits a call)
    bash scripts/device_check.sh OUT --parts gcn_gpu   # some parts
    python -m haloflow.bench.device.check --device cpu --tiny --out OUT   # a dry run of every part on a CPU

Parts, in the order they run (each in its own process, with its own time limit, so that a crash, a hang or an
out-of-memory in one leaves the rest running; a failing part is reported and the next one starts):

    cuda_check     scripts/cuda_check.py: NCCL, pinned memory on a side stream, the halo exchange, training on CUDA
    train_parity   `haloflow train gcn / dlrm / tgn --device cuda` (and the cached DLRM) against --device cpu
    gcn_gpu        GCN epochs against PyG's GCNConv on the device; peak memory; SpMM bandwidth against copy bandwidth
    dlrm_gpu       DLRM on the full Kaggle tables against plain PyTorch on the device, batch 2,048 and 16,384
    cache_gpu      the embedding cache: tables in pinned host memory, 1 % and 5 % of rows on the device
    tgn_gpu        TGN against PyG's TGN on the device: events/s and AP on Wikipedia
    cpu_scaling    the machine's CPU cores: `bench gcn-dist` at K = 1, 2, 4 and `bench tgn`'s distributed rows

Each part writes ``<part>.json`` and ``<part>.md``; its output goes to ``<part>.log``. After every part the runner
rewrites ``summary.md`` (the status of every part and every part's tables) and ``device_check.tar.gz`` (all of the
above) in OUT, so whatever finished comes back even if the whole command is stopped early.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.table import format_table

__all__ = ["PARTS", "main"]


@dataclass(frozen=True)
class Part:
    name: str
    limit_s: int  # its time limit at full size on one H200 (--tiny: TINY_LIMIT_S)


PARTS = (Part("cuda_check", 120), Part("train_parity", 180), Part("gcn_gpu", 120), Part("dlrm_gpu", 120),
         Part("cache_gpu", 100), Part("tgn_gpu", 100), Part("cpu_scaling", 170))
TINY_LIMIT_S = 240  # a 2-core CPU running the suite beside it
STOP_GRACE_S = 25  # after SIGTERM: launch_torchrun's own grace for its ranks (10 s) and torchrun's, then SIGKILL


@dataclass
class Outcome:
    name: str
    status: str  # "ok", "failed" (a comparison failed), "error" (it crashed), "timeout", "skipped"
    seconds: float
    detail: str = ""


def run_part(part: Part, args, work: Path, limit_s: float) -> Outcome:
    cmd = [sys.executable, "-m", f"haloflow.bench.device.{part.name}", "--device", args.device, "--out", str(work)]
    if args.tiny:
        cmd.append("--tiny")
    log = work / f"{part.name}.log"
    for ext in ("json", "md"):  # a part that dies must not be reported with an earlier call's tables
        (work / f"{part.name}.{ext}").unlink(missing_ok=True)
    print(f"=== {part.name} (limit {limit_s:.0f} s): {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            stop(proc)
            return Outcome(part.name, "timeout", time.perf_counter() - t0, f"stopped after {limit_s:.0f} s")
    seconds = time.perf_counter() - t0
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    if rc == 0:
        return Outcome(part.name, "ok", seconds)
    status = "failed" if rc == 1 and (work / f"{part.name}.json").exists() else "error"
    return Outcome(part.name, status, seconds, f"exit {rc}: {tail[0][:200]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the part's process group first: a torchrun it started (in a session of its own, as are its ranks)
    hears it through `launch_torchrun`'s forwarding and stops its ranks; SIGKILL to the group after a grace."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def write_summary(out: Path, work: Path, outcomes: list[Outcome], args) -> None:
    rows = [[o.name, o.status, o.seconds, o.detail] for o in outcomes]
    status = format_table(["part", "status", "seconds", "detail"], rows, float_fmt=["", "", ".1f", ""],
                          title=f"device check, --device {args.device}{' --tiny' if args.tiny else ''}")
    blocks = [f"# haloflow device check ({time.strftime('%Y-%m-%d %H:%M %Z')})", f"```\n{status}\n```"]
    for o in outcomes:
        md = work / f"{o.name}.md"
        if md.exists():
            blocks.append(md.read_text())
        elif o.status != "skipped":
            log = work / f"{o.name}.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            blocks.append(f"## {o.name}\n\n{o.status}: {o.detail}\n\n```\n{tail}\n```\n")
    atomic_write_text(out / "summary.md", "\n\n".join(blocks) + "\n")
    atomic_write_text(out / "summary.json", json.dumps([o.__dict__ for o in outcomes], indent=2) + "\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted(work.iterdir()):
            if f.is_file():
                tar.add(f, arcname=f"device_check/{f.name}")
    tmp = out / ".device_check.tar.gz.tmp"
    tmp.write_bytes(buf.getvalue())
    tmp.replace(out / "device_check.tar.gz")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m haloflow.bench.device.check", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--out", type=Path, required=True, help="folder for summary.md, summary.json, device_check.tar.gz")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny: a dry run)")
    p.add_argument("--tiny", action="store_true", help="small sizes, every part in well under a minute on a CPU")
    p.add_argument("--work", type=Path, default=None,
                   help="folder for every part's json, md and log (default: OUT/device_check)")
    p.add_argument("--parts", default=",".join(x.name for x in PARTS),
                   help="comma-separated parts to run (default: all, in the order above)")
    p.add_argument("--total-s", type=float, default=None,
                   help="stop starting parts once this many seconds have passed; a part's limit is cut to what is "
                        "left (default: none)")
    args = p.parse_args(argv)
    wanted = [s.strip() for s in args.parts.split(",") if s.strip()]
    known = {x.name: x for x in PARTS}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        p.error(f"--parts: unknown part(s) {', '.join(unknown)}; the parts are {', '.join(known)}")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or args.out / "device_check"
    work.mkdir(parents=True, exist_ok=True)
    start, outcomes = time.perf_counter(), []
    for name in wanted:
        part = known[name]
        limit = TINY_LIMIT_S if args.tiny else part.limit_s
        if args.total_s is not None:
            left = args.total_s - (time.perf_counter() - start)
            if left < 20:
                outcomes.append(Outcome(name, "skipped", 0.0, f"--total-s {args.total_s:.0f} reached"))
                continue
            limit = min(limit, left)
        outcomes.append(run_part(part, args, work, limit))
        print(f"--- {name}: {outcomes[-1].status} in {outcomes[-1].seconds:.1f} s {outcomes[-1].detail}", flush=True)
        write_summary(args.out, work, outcomes, args)
    write_summary(args.out, work, outcomes, args)
    print((args.out / "summary.md").read_text(), flush=True)
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
