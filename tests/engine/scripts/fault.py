"""torchrun script: rank 1 dies ("killed") or stops answering ("stalled") in epoch 2 of train_gcn.

Usage: fault.py PARTITIONS OUT_DIR MODE TIMEOUT_S. The other ranks must fail with a DistributedError; each
writes what it saw to OUT_DIR/rank<r>.json.
"""

import json
import os
import sys
import time
from pathlib import Path

import haloflow.engine.gcn.train as trainer
from haloflow.engine.runtime import RuntimeConfig, init_from_env
from haloflow.errors import DistributedError


def main(partitions: str, out: Path, mode: str, timeout_s: float) -> None:
    ctx = init_from_env(timeout_s=timeout_s)
    loss_fn, calls = trainer.gcn_loss, [0]

    fault_t = [None]

    def faulty_loss(*args, **kwargs):  # the fault, injected at a point every rank reaches
        calls[0] += 1
        if calls[0] == 3:
            fault_t[0] = time.perf_counter()  # rank 0: from here on, its peer is gone
            if ctx.rank == 1:
                if mode == "stalled":
                    time.sleep(timeout_s + 15)  # silent for well over the others' timeout
                os._exit(0)
        return loss_fn(*args, **kwargs)

    trainer.gcn_loss = faulty_loss
    t0 = time.perf_counter()
    record = {"error": None, "type": None}
    try:
        trainer.train_gcn(trainer.GCNTrainConfig(partitions=partitions, epochs=6,
                                                 runtime=RuntimeConfig(timeout_s=timeout_s, progress=False)))
    except DistributedError as err:
        record = {"error": str(err), "type": type(err).__name__}
    record["elapsed_s"] = time.perf_counter() - t0
    record["after_fault_s"] = time.perf_counter() - fault_t[0] if fault_t[0] is not None else None
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(record))
    os._exit(0)  # the group is broken; skip its teardown


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
