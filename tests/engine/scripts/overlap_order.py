"""torchrun script: the order of a halo exchange's events and the inner SpMM, forward and backward, per schedule.

Usage: overlap_order.py OUT_DIR. Each rank runs one aggregation of layer 1 (forward and backward) under the
overlapped schedule and under the control ("wait_first"), with the aggregator's trace on, and writes
OUT_DIR/rank<r>.json: {schedule: [events in order]}, and the results of both (they must be equal).
"""

import json
import sys
from pathlib import Path

import torch

from haloflow.engine.gcn.parallelize import HaloAggregator, HaloConfig
from haloflow.engine.runtime import init_from_env, shutdown

sys.path.insert(0, str(Path(__file__).parent))
from common import parts_of, small_dataset  # noqa: E402


def main(out: Path) -> None:
    ctx = init_from_env(timeout_s=30, device="cpu")
    part = parts_of(small_dataset(), ctx.world_size, method="random", seed=1)[ctx.rank]
    record = {}
    for schedule in ("overlap", "wait_first"):
        agg = HaloAggregator(part, ctx.group, config=HaloConfig(schedule=schedule))
        agg.trace = []
        x = torch.arange(part.n_inner * 3, dtype=torch.float32).reshape(-1, 3).div(7).requires_grad_()
        y = agg.aggregate(1, x)
        agg.trace.append("-- backward --")
        (y * y).sum().backward()
        record[schedule] = agg.trace
        record[f"{schedule}_y"] = y.detach().tolist()
        record[f"{schedule}_grad"] = x.grad.tolist()
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(record))
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
