"""torchrun script: 20 TGN training batches with the node memory owned by partition; saves what the test compares.

Usage: tgn_parity.py OUT_DIR [overlap|wait_first]. The stream is generated (``stream()``), so the single-process
reference in the test sees the same events. Every rank writes OUT_DIR/rank<r>.npz: the global batch losses, the
whole memory state gathered from its owners, and the weights.
"""

import sys
from pathlib import Path

import numpy as np

from haloflow.data.temporal import TemporalEvents
from haloflow.engine.runtime import RuntimeConfig, init_from_env, shutdown
from haloflow.engine.tgn.train import TGNTrainConfig, train_tgn

BATCHES = 20


def stream(num_events: int = 6000, users: int = 150, items: int = 60, feat: int = 3, seed: int = 0) -> TemporalEvents:
    """A bipartite user -> item stream with repeat visits (so memory matters), times ascending, edge features."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, users, num_events)
    dst = users + np.minimum(rng.zipf(1.5, num_events) - 1 + (src % 7) * 5, items - 1)
    t = np.cumsum(rng.integers(0, 5, num_events))
    return TemporalEvents(src=src, dst=dst, t=t, num_nodes=users + items,
                          edge_feat=rng.standard_normal((num_events, feat)).astype(np.float32))


def config(schedule: str = "overlap") -> TGNTrainConfig:
    return TGNTrainConfig(events="generated", batch_size=64, memory_dim=16, time_dim=8, embedding_dim=16,
                          num_neighbors=5, lr=1e-3, max_train_batches=BATCHES, eval=False, schedule=schedule,
                          runtime=RuntimeConfig(device="cpu", timeout_s=60, progress=False))


def main(out: Path, schedule: str) -> None:
    ctx = init_from_env(timeout_s=60, device="cpu")  # one group for training and the gather below
    result = train_tgn(config(schedule), events=stream())
    full = result.memory.gather_all()
    np.savez(out / f"rank{ctx.rank}.npz", losses=np.array(result.batch_losses),
             memory=full.memory.numpy(), last_update=full.last_update.numpy(), mail_eid=full.mail_eid.numpy(),
             mail_other=full.mail_other.numpy(), fetch_bytes=np.array(result.fetch_bytes_per_batch),
             **{f"w_{k}": v.numpy() for k, v in result.state_dict.items()})
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "overlap")
