"""torchrun script: HaloAggregator (exact, stale, sampled) forward and backward; parallelize_gcn's start-up checks.

Usage: aggregate.py OUT_DIR. Inputs are functions of the ORIGINAL node id (``inputs``), so the test can compare
each rank's rows with the dense single-device operator.
"""

import sys
from pathlib import Path

import numpy as np
import torch

from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.engine.gcn.parallelize import HaloAggregator, HaloConfig, parallelize_gcn
from haloflow.errors import DistributedError
from haloflow.models.gcn import GCN, GCNConfig

sys.path.insert(0, str(Path(__file__).parent))
from common import parts_of, small_dataset  # noqa: E402

WIDTH = 4
EPOCHS = 3


def inputs(num_nodes: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """x and the loss coefficients c of one epoch, (N, WIDTH) each, indexed by original id."""
    rng = np.random.default_rng(10 + epoch)
    return rng.standard_normal((num_nodes, WIDTH)), rng.standard_normal((num_nodes, WIDTH))


def run(agg: HaloAggregator, part, num_nodes: int, prefix: str, result: dict) -> None:
    for epoch in range(EPOCHS):
        agg.set_epoch(epoch, training=True)
        x_all, c_all = inputs(num_nodes, epoch)
        x = torch.tensor(x_all[part.orig_ids], dtype=torch.float32, requires_grad=True)  # (n_inner, F)
        y = agg.aggregate(1, x)  # (n_inner, F)
        (y * torch.tensor(c_all[part.orig_ids], dtype=torch.float32)).sum().backward()
        result[f"{prefix}_y{epoch}"] = y.detach().numpy().copy()
        result[f"{prefix}_g{epoch}"] = x.grad.numpy().copy()
        if agg.selection is not None:
            result[f"{prefix}_kept{epoch}"] = part.halo_gids[agg.selection.recv_rows.numpy()]
    agg.finish()


def main(out: Path) -> None:
    ctx = init_from_env(timeout_s=30)
    dataset = small_dataset()
    n = dataset.num_nodes
    part = parts_of(dataset, ctx.world_size, method="random", seed=1)[ctx.rank]
    result = {}
    for norm in ("gcn", "mean"):
        run(HaloAggregator(part, ctx.group, norm=norm), part, n, f"exact_{norm}", result)
    run(HaloAggregator(part, ctx.group, config=HaloConfig(staleness=1)), part, n, "stale", result)
    run(HaloAggregator(part, ctx.group, config=HaloConfig(halo_keep=0.5, seed=4)), part, n, "sampled", result)

    # start-up check: weights that differ across ranks are refused on every rank
    model = GCN(GCNConfig(in_dim=6, out_dim=3, seed=ctx.rank))
    try:
        parallelize_gcn(model, part, ctx.group)
        result["mismatch_error"] = np.array("")
    except DistributedError as err:
        result["mismatch_error"] = np.array(str(err))
    np.savez(out / f"rank{ctx.rank}.npz", **result)
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
