"""torchrun script: exact and sampled halo exchanges, forward and backward; saves each rank's results.

Usage: halo_exchange.py OUT_DIR. Row g of the inputs is a function of the new global id g, so the test can
rebuild the expected halo rows and gradients from the full graph.
"""

import sys
from pathlib import Path

import numpy as np
import torch

from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.engine.comm import CommStats
from haloflow.engine.gcn.halo import HaloExchange, HaloSelection

sys.path.insert(0, str(Path(__file__).parent))
from common import parts_of, small_dataset  # noqa: E402

WIDTH = 5


def inputs(num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((num_nodes, WIDTH)), rng.standard_normal((num_nodes, WIDTH))  # x, c by new gid


def main(out: Path) -> None:
    ctx = init_from_env(timeout_s=30)
    dataset = small_dataset()
    part = parts_of(dataset, ctx.world_size)[ctx.rank]
    x_all, c_all = inputs(dataset.num_nodes)
    stats = CommStats()
    ex = HaloExchange.from_part(part, ctx.group, stats=stats)
    result = {}
    for name, keep in (("exact", 1.0), ("sampled", 0.5)):
        sel = None
        if keep < 1.0:
            sel = HaloSelection.sample(rank=ctx.rank, send_gids=part.inner_gids[part.send_ids],
                                       send_offsets=part.send_offsets, halo_gids=part.halo_gids,
                                       halo_offsets=part.halo_offsets, keep=keep, seed=3, epoch=7)
        x = torch.tensor(x_all[part.inner_gids], dtype=torch.float32, requires_grad=True)  # (n_inner, F)
        stats.reset()
        handle = ex.start(x, sel)
        other = x * 2.0  # work done while the exchange is in flight
        halo = handle.wait()  # (n_halo, F)
        coef = torch.tensor(c_all[part.halo_gids] * (ctx.rank + 1), dtype=torch.float32)
        ((halo * coef).sum() + other.sum()).backward()
        result[f"{name}_halo"] = halo.detach().numpy().copy()
        result[f"{name}_grad"] = (x.grad - 2.0).numpy()
        result[f"{name}_bytes"] = np.array(stats.halo_bytes)
    np.savez(out / f"rank{ctx.rank}.npz", **result)
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
