"""torchrun script: every rank builds its DLRM shards in place from (config, plan); none holds a whole table.

Usage: dlrm_init.py OUT_DIR. Rank r writes OUT_DIR/rank<r>.json: the bytes of its embedding storage, the bytes the
plan gives it, and whether the gathered tables and the MLPs equal ``DLRM(config)``'s bit for bit.
"""

import json
import sys
from pathlib import Path

import torch

from haloflow.engine.dlrm.sharding import build_sharded_dlrm
from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.models.dlrm import DLRM

sys.path.insert(0, str(Path(__file__).parent))
from dlrm_common import mixed_plan, small_model  # noqa: E402


def main(out: Path) -> None:
    ctx = init_from_env(timeout_s=30, device="cpu")
    config = small_model().config
    plan = mixed_plan(ctx.world_size)
    model = build_sharded_dlrm(config, plan, ctx.group)
    planned = sum(4 * s.num_rows * s.num_cols for _, s in plan.shards_on(ctx.rank))
    allocated = model.embeddings.storage_bytes()
    full = model.to_dlrm()  # a collective: every rank gathers every table (for this check only)
    ref = DLRM(config)
    equal = all(torch.equal(a.weight, b.weight) for a, b in zip(full.embeddings.tables, ref.embeddings.tables))
    mlps = all(torch.equal(full.state_dict()[k], ref.state_dict()[k]) for k in ref.state_dict() if "embeddings" not in k)
    (out / f"rank{ctx.rank}.json").write_text(json.dumps({"planned": planned, "allocated": allocated,
                                                          "tables_equal": equal, "mlps_equal": mlps}))
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
