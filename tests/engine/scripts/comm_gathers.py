"""torchrun script: the gathers of ``haloflow.engine.comm`` on K ranks with uneven (and empty) blocks.

Usage: comm_gathers.py OUT_DIR. Rank r's inputs are pure functions of (r, K) (``row``, ``ints``, ``floats``,
``block``), so the test builds every expected answer itself. Each rank saves what it got to OUT_DIR/rank<r>.npz
and its ``CommStats`` to OUT_DIR/rank<r>.json.

At K = 2 the script ends with a lost peer: rank 1 exits after a barrier; rank 0 waits until the process is gone
(a pidfd becomes readable when it exits: no sleeping, no race) and then gathers, which must fail at once with a
``DistributedError`` naming rank 1 and its pid; rank 0 writes the message to OUT_DIR/lost_peer.txt.
"""

from __future__ import annotations

import json
import os
import select
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from haloflow.engine.comm import CommStats, all_gather_cat, all_gather_rows, all_gather_uneven, register_peers
from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.errors import DistributedError

SIZES = (3, 0, 5)  # rank r's block of ``ints`` / ``block`` has SIZES[r] elements (rank 1's is empty)


def row(rank: int, world: int) -> list[float]:
    return [rank, 10 * rank + 0.5, world]


def ints(rank: int) -> torch.Tensor:
    return 100 * rank + torch.arange(SIZES[rank], dtype=torch.int64)


def floats(rank: int) -> torch.Tensor:
    return torch.arange(rank + 1, dtype=torch.float32) / 4 - rank  # rank + 1 elements, exact in float32


def block(rank: int) -> torch.Tensor:
    return torch.arange(SIZES[rank], dtype=torch.float64) * 1.5 + 1000 * rank


def main(out: Path) -> None:
    ctx = init_from_env(timeout_s=30, device="cpu")
    r, K, g = ctx.rank, ctx.world_size, ctx.group
    stats = CommStats()
    result = {
        "rows": all_gather_rows(row(r, K), g, "test rows").numpy(),
        "ints": all_gather_cat(ints(r), g).numpy(),
        "floats": all_gather_cat(floats(r), g).numpy(),
        "nothing": all_gather_cat(torch.zeros(0, dtype=torch.float32), g).numpy(),  # every rank's block empty
    }
    handle = all_gather_uneven(block(r), [SIZES[p] for p in range(K)], group=g, stats=stats, kind="gather_test")
    result["uneven"] = handle.wait().numpy()
    result["uneven_again"] = handle.wait().numpy()  # a second wait returns the same output, sends nothing
    np.savez(out / f"rank{r}.npz", **result)
    (out / f"rank{r}.json").write_text(json.dumps({"bytes": dict(stats.bytes), "calls": dict(stats.calls),
                                                   "blocked": sorted(stats.blocked)}))
    if K != 2:
        shutdown()
        return

    register_peers(g)  # every rank's pid, so that a failed collective can name the rank gone
    peer = int(all_gather_rows([os.getpid()], g, "pids")[1 - r, 0])
    gone = os.pidfd_open(peer) if r == 0 else None  # opened while rank 1 surely runs
    dist.barrier(group=g)
    if r == 1:
        os._exit(0)
    poll = select.poll()
    poll.register(gone, select.POLLIN)
    if not poll.poll(30_000):
        raise SystemExit("rank 1 did not exit within 30 s")
    try:
        all_gather_rows([1.0], g, "exchanging losses")
        message = "no error"
    except DistributedError as err:
        message = str(err)
    (out / "lost_peer.txt").write_text(f"{peer}\n{message}")
    os._exit(0)  # the group is broken; skip its teardown


if __name__ == "__main__":
    main(Path(sys.argv[1]))
