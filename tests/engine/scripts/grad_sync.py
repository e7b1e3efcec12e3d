"""torchrun script: bucketed gradient sync over two steps; saves each rank's synchronised gradients.

Usage: grad_sync.py OUT_DIR. Rank r's gradient of parameter i at step s is ``coef(r, s, i)`` (see ``coef``);
the last parameter gets a gradient only on rank 0 (the others count as zero).
"""

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.engine.grad_sync import BucketedGradSync, GradSyncConfig
from haloflow.engine.comm import CommStats

SHAPES = [(7, 3), (3,), (20, 5), (5,), (4, 4)]


def coef(rank: int, step: int, i: int) -> torch.Tensor:
    rng = np.random.default_rng(1000 * step + 10 * rank + i)
    return torch.tensor(rng.standard_normal(SHAPES[i]), dtype=torch.float32)


def main(out: Path) -> None:
    ctx = init_from_env(timeout_s=30)
    params = nn.ParameterList(nn.Parameter(torch.zeros(s)) for s in SHAPES)
    stats = CommStats()
    sync = BucketedGradSync(params, ctx.group, GradSyncConfig(bucket_bytes=128), stats)
    result = {"num_buckets": np.array(len(sync.buckets))}
    for step in range(2):
        for p in params:
            p.grad = None
        used = range(len(SHAPES)) if ctx.rank == 0 else range(len(SHAPES) - 1)
        loss = sum((params[i] * coef(ctx.rank, step, i)).sum() for i in used)
        loss.backward()
        sync.wait()
        for i, p in enumerate(params):
            result[f"step{step}_p{i}"] = p.grad.numpy().copy()
    result["grad_bytes"] = np.array(stats.grad_bytes)
    result["bucket_sizes"] = np.array(sync.bucket_sizes)
    np.savez(out / f"rank{ctx.rank}.npz", **result)
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
