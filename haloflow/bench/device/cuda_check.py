"""``scripts/cuda_check.py`` under torchrun (one rank, NCCL): its OK / FAIL lines as a table.

The checks: an NCCL group, pinned host memory copied on a side stream, an asynchronous NCCL all-to-all, the sharded
DLRM on NCCL against one device, the halo exchange on CUDA forward and backward, GCN and DLRM training on CUDA
against the CPU. They need CUDA: with ``--device cpu`` the part records that it did not run (and passes).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from haloflow.bench.device.common import Table, parse_part_args, part_parser, write_part

NAME = "cuda_check"
SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "cuda_check.py"


def main(argv: list[str] | None = None) -> int:
    p = part_parser(f"python -m haloflow.bench.device.{NAME}", __doc__.splitlines()[0])
    args, _ = parse_part_args(p, argv)
    table = Table("scripts/cuda_check.py (torchrun, 1 rank)", ["check and detail", "result"])
    if args.device.type != "cuda":
        table.rows.append(["(all): they need CUDA, this dry run has none", "not run"])
        return write_part(args, NAME, [table], {"ran": False}, ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(SCRIPT)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=110)  # under the runner's 120 s for this part
    for line in proc.stdout.splitlines():
        if line.startswith(("OK  ", "FAIL")):
            table.rows.append([line[5:].strip(), line[:4].strip()])
    ok = proc.returncode == 0 and table.rows and all(r[1] == "OK" for r in table.rows)
    notes = [] if ok else [f"exit {proc.returncode}; output tail:\n```\n{(proc.stdout + proc.stderr)[-3000:]}\n```"]
    return write_part(args, NAME, [table], {"ran": True, "returncode": proc.returncode}, ok=bool(ok), notes=notes)


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
