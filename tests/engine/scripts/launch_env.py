"""torchrun script (or ``-m tests.engine.scripts.launch_env``): what a rank sees of its launch.

Usage: launch_env.py OUT_DIR MODE [ARGS...]. Every rank that gets as far writes OUT_DIR/rank<r>.json with the
launch variables it sees (``VARS``) and its arguments. MODE:

    ok      write and exit 0
    fail    rank 0 exits 0; rank 1 waits until rank 0 has gone (so the failure is the only one), then exits 3
    flaky   rank 1 exits 3 in the first attempt, before writing; after a restart every rank writes
"""

import json
import os
import select
import sys
from pathlib import Path

VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS", "HALOFLOW_TEST_VALUE", "TORCHELASTIC_RESTART_COUNT")
FAIL_CODE = 3


def main(out: Path, mode: str, args: list[str]) -> None:
    rank = int(os.environ["RANK"])
    if mode == "flaky" and rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        sys.exit(FAIL_CODE)
    record = {"env": {k: os.environ.get(k) for k in VARS}, "args": args}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    if mode == "fail":
        _fail_after_rank0(rank)


def _fail_after_rank0(rank: int) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    # torchrun's own rendezvous store: rank 1 learns rank 0's pid from it (get blocks until it is set)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=30))
    if rank == 0:
        store.set("launch_env/pid0", str(os.getpid()))
        os._exit(0)
    pid0 = int(store.get("launch_env/pid0"))
    try:
        gone = os.pidfd_open(pid0)
    except ProcessLookupError:  # already exited and reaped
        os._exit(FAIL_CODE)
    poll = select.poll()
    poll.register(gone, select.POLLIN)  # readable once rank 0 has exited
    poll.poll(30_000)
    os._exit(FAIL_CODE)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
