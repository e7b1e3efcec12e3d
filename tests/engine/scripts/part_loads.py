"""torchrun script: train GCN, then TGN, on partition folders and record which parts each rank loaded.

Usage: part_loads.py GCN_PARTS TGN_PARTS EVENTS_CSV OUT_DIR. Every rank writes OUT_DIR/rank<r>.json:
``{"gcn": {part: loads}, "tgn": {part: loads}}``, counted by ``haloflow.partition.format.part_loads`` around each
trainer call (the counter lives in each rank's own process, so it sees that rank's loads only).
"""

import json
import sys
from pathlib import Path

from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
from haloflow.engine.runtime import RuntimeConfig, init_from_env, shutdown
from haloflow.engine.tgn.train import TGNTrainConfig, train_tgn
from haloflow.partition.format import part_loads, reset_part_loads

RUNTIME = RuntimeConfig(device="cpu", timeout_s=60, progress=False)


def main(gcn_parts: str, tgn_parts: str, events: str, out: Path) -> None:
    layout = init_from_env(timeout_s=60, device="cpu")  # one group for both trainers (they leave it alone)
    loads = {}
    reset_part_loads()
    train_gcn(GCNTrainConfig(partitions=gcn_parts, epochs=2, hidden_dim=8, runtime=RUNTIME))
    loads["gcn"] = part_loads(gcn_parts)
    reset_part_loads()
    train_tgn(TGNTrainConfig(events=events, partitions=tgn_parts, batch_size=64, memory_dim=8, time_dim=4,
                             embedding_dim=8, num_neighbors=3, max_train_batches=2, eval=False, runtime=RUNTIME))
    loads["tgn"] = part_loads(tgn_parts)
    (out / f"rank{layout.rank}.json").write_text(json.dumps(loads))
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]))
