"""torchrun script (2 ranks): ``ShardedMemory`` fetches and applies a fixed sequence of updates; every rank saves
what it fetched, the gathered whole state after each step, and its byte counts, to OUT_DIR/rank<r>.npz/.json.

Usage: sharded_memory.py OUT_DIR. The inputs are pure functions of (step, rank) (``update``, ``QUERIES``,
``owners``), so the test replays them on one ``TGNMemoryState``, the single-process oracle. Sequence, the same on
every rank (fetch and apply are collectives):

    fetch QUERIES[0]   (nothing applied yet: empty rows)
    apply update(0, r) (nodes touched on both ranks and twice on one rank; event ids unique)
    fetch QUERIES[1]   (rank 1 asks for nothing)
    gather_all         -> state0
    apply update(1, r) (rank 1 sends nothing)
    fetch QUERIES[2]
    gather_all         -> state1
    reset, gather_all  -> state2 (empty again)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from haloflow.engine.comm import CommStats
from haloflow.engine.tgn.memory import NodeOwners, ShardedMemory
from haloflow.models.tgn_memory import MemoryRows, MemoryUpdate, TGNMemoryState

N, M, F = 11, 3, 2  # nodes, memory width, edge features
OWNER = [1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0]  # interleaved, as a partition would give: not contiguous blocks
QUERIES = [  # per step, per rank: node ids in no particular order, from both owners
    ([9, 3, 0, 10, 4, 7], [6, 1]),
    ([5, 2, 8, 1, 3], []),
    ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [10, 4, 6]),
]
SIZES = [(7, 6), (5, 0)]  # update rows per step, per rank
FIELDS = ("memory", "last_update", "mail_other", "mail_feat", "mail_t", "mail_eid")


def owners(owner: list[int] = OWNER, k: int = 2) -> NodeOwners:
    """Node v's row is its place among its owner's nodes, in id order."""
    owner_arr = np.asarray(owner, dtype=np.int64)
    row = np.zeros_like(owner_arr)
    for p in range(k):
        mine = np.flatnonzero(owner_arr == p)
        row[mine] = np.arange(mine.size)
    return NodeOwners(owner_arr, row, tuple(int((owner_arr == p).sum()) for p in range(k)))


def update(step: int, rank: int, num_nodes: int = N) -> MemoryUpdate:
    """Rank ``rank``'s messages of step ``step``: random rows (exact in their dtypes) for seeded node ids with
    repeats; node 3 always appears (so both ranks write it); event ids unique over ranks and steps."""
    n = SIZES[step][rank]
    g = torch.Generator().manual_seed(100 * step + rank)
    ids = torch.randint(0, num_nodes, (n,), generator=g)
    if n:
        ids[n // 2] = 3
    eid = 1000 * step + 2 * torch.randperm(n, generator=g) + rank  # unique; the newest is not the last written
    rows = MemoryRows(
        memory=torch.randn(n, M, generator=g), last_update=torch.rand(n, generator=g, dtype=torch.float64) * 50,
        mail_other=torch.randn(n, M, generator=g), mail_feat=torch.randn(n, F, generator=g),
        mail_t=torch.rand(n, generator=g, dtype=torch.float64) * 50 + 50, mail_eid=eid,
    )
    return MemoryUpdate(ids, rows)


def arrays(state: TGNMemoryState) -> dict[str, np.ndarray]:
    return {name: getattr(state, name).numpy().copy() for name in FIELDS}


def main(out: Path) -> None:
    from haloflow.engine.runtime import init_from_env, shutdown

    ctx = init_from_env(timeout_s=30, device="cpu")
    r = ctx.rank
    stats = CommStats()
    mem = ShardedMemory(owners(), memory_dim=M, edge_dim=F, group=ctx.group, stats=stats)
    saved, counted = {}, {}

    def fetch(step: int) -> None:
        rows = mem.fetch(torch.tensor(QUERIES[step][r], dtype=torch.int64)).wait()
        saved.update({f"fetch{step}.{name}": getattr(rows, name).numpy() for name in FIELDS})

    def gather(i: int) -> None:
        saved.update({f"state{i}.{k}": v for k, v in arrays(mem.gather_all()).items()})

    fetch(0)
    counted["fetch0"] = dict(stats.bytes)
    stats.reset()
    mem.apply(update(0, r))
    counted["apply0"] = dict(stats.bytes)
    stats.reset()
    fetch(1)
    gather(0)
    mem.apply(update(1, r))
    fetch(2)
    gather(1)
    mem.reset()
    gather(2)
    np.savez(out / f"rank{r}.npz", **saved)
    (out / f"rank{r}.json").write_text(json.dumps(counted))
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
