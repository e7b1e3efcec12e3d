"""torchrun script: train_gcn on a partition folder; saves each rank's logits, losses and weights.

Usage: train_parity.py PARTITIONS OUT_DIR CONV. Trains the exact run of ``config(...)`` (the test repeats it
single-process), then 3 epochs each of the stale and the sampled modes.
"""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from haloflow.engine.runtime import init_from_env, shutdown
from haloflow.engine.gcn.parallelize import HaloConfig
from haloflow.engine.gcn.train import GCNTrainConfig, train_gcn
from haloflow.engine.runtime import RuntimeConfig

EPOCHS = 5


def config(source: dict, conv: str) -> GCNTrainConfig:
    return GCNTrainConfig(**source, epochs=EPOCHS, conv=conv, num_layers=3, hidden_dim=8, dropout=0.5, seed=5,
                          lr=0.05, runtime=RuntimeConfig(timeout_s=60, progress=False))


def main(partitions: str, out: Path, conv: str) -> None:
    cfg = config({"partitions": partitions}, conv)
    init_from_env(timeout_s=cfg.runtime.timeout_s)  # one group for the three runs below (train_gcn leaves it alone)
    result = train_gcn(cfg)
    if result.devices.get("halo_buffers") != {"cpu"} or any(v != {"cpu"} for v in result.devices.values()):
        raise AssertionError(f"tensors off the configured device: {result.devices}")
    saved = {"logits": result.logits.numpy(), "node_ids": result.node_ids.numpy(),
             "loss": np.array([e.loss for e in result.history]),
             "acc": np.array([[e.train_acc, e.val_acc, e.test_acc] for e in result.history]),
             "halo_bytes": np.array([e.halo_bytes for e in result.history]),
             "grad_bytes": np.array([e.grad_bytes for e in result.history]),
             "buckets_in_backward": np.array([e.grad_buckets_in_backward for e in result.history])}
    saved.update({f"w_{k}": v.numpy() for k, v in result.state_dict.items()})
    for name, halo in (("stale", HaloConfig(staleness=1)), ("sampled", HaloConfig(halo_keep=0.5))):
        approx = train_gcn(replace(cfg, epochs=3, halo=halo))
        saved[f"{name}_loss"] = np.array([e.loss for e in approx.history])
        saved[f"{name}_halo_bytes"] = np.array([e.halo_bytes for e in approx.history])
    np.savez(out / f"rank{result.rank}.npz", **saved)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
