"""torchrun script: 200 epochs of GCN on Cora, exact, stale (PipeGCN) and sampled (BNS-GCN, p = 0.5).

Usage: cora.py PARTITIONS OUT_DIR. Rank 0 writes the final test accuracy of each mode to OUT_DIR/cora.json.
"""

import json
import sys
from pathlib import Path

from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.engine.gcn.parallelize import HaloConfig
from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
from haloflow.engine.runtime import RuntimeConfig

MODES = {"exact": HaloConfig(), "stale": HaloConfig(staleness=1), "sampled": HaloConfig(halo_keep=0.5)}


def main(partitions: str, out: Path) -> None:
    ctx = init_from_env(timeout_s=120)
    results = {}
    for name, halo in MODES.items():
        result = train_gcn(GCNTrainConfig(partitions=partitions, halo=halo, runtime=RuntimeConfig(progress=False)))
        results[name] = {"test_acc": result.final.test_acc, "val_acc": result.final.val_acc,
                         "epoch_s": sum(e.epoch_s for e in result.history) / len(result.history)}
    if ctx.rank == 0:
        (out / "cora.json").write_text(json.dumps(results, indent=1))
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
