"""TorchRec's DLRM under DistributedModelParallel on one rank: the "torchrec" peer of ``haloflow bench dlrm``.

Runs under the Python that ``scripts/setup_peers.sh torchrec`` builds (TorchRec 1.9, fbgemm-gpu-cpu 1.9, its own
torch); imports nothing from haloflow. Speaks ``haloflow/bench/peer.py``'s protocol, one JSON object a line:

    {"setup": {"folder": F, "table_sizes": [...], "dim": 16, "dense_in": 13, "bottom": [512, 256, 64, 16],
               "top": [512, 256, 1], "lr": 0.1, "threads": 1}}
                          -> {"ready": true, "info": {"torchrec": ..., "torch": ..., "sharding": {...}}}
    {"cmd": "steps", "lo": 0, "hi": 5}
                          -> {"seconds": 0.41, "losses": [0.69, ...]}     training steps on batches lo .. hi-1
    {"cmd": "exit"}       -> (exits 0)

Anything that fails -> {"error": "one line"} and a non-zero exit. The folder holds what the benchmark wrote:

    F/tables/C1.npy ... C26.npy   float32 (rows_t, D), memory-mapped and copied into DMP's tables in slices
    F/mlp.npz    bottom.{i}.weight / .bias   haloflow's bottom MLP, layer i (ReLU after every layer)
                 top.{i}.weight / .bias      top MLP (ReLU after all but the last); top.0's columns are
                                             [z (D) | dots of pairs i > j, row-major]  (haloflow's order)
    F/batches.npz  dense (N, B, 13) f32, labels (N, B) f32, lengths (N, T*B) i64 keys-major (TorchRec's KJT
                   layout: table 0's B lengths, then table 1's ...), values (nnz all,) i64, value_offsets (N+1,)

TorchRec's ``InteractionArch`` takes the pairs i < j of ``triu_indices(offset=1)``, row-major, where haloflow
takes i > j of ``tril_indices(offset=-1)``: the same dots in another order, so top.0's columns are permuted.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

COPY_ROWS = 1 << 20  # rows per slice copied from a memory-mapped table: ~64 MB in flight, never a second table


def build(setup: dict, store_dir: str):
    """The model as a TorchRec user writes it; returns (dmp, optimizer, the ready reply's info)."""
    try:
        import torch.distributed as dist
        import torchrec
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.types import ShardingEnv
        from torchrec.models.dlrm import DLRM
        from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
        from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
        from torchrec.optim.optimizers import in_backward_optimizer_filter
    except ImportError as e:
        raise RuntimeError(f"torchrec does not import under {sys.executable} ({e}); build its peer with "
                           "bash scripts/setup_peers.sh torchrec") from e

    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(store_dir, "store"), 1), rank=0, world_size=1)
    D, lr = setup["dim"], setup["lr"]
    tables = [torchrec.EmbeddingBagConfig(name=f"C{t + 1}", embedding_dim=D, num_embeddings=n,
                                          feature_names=[f"C{t + 1}"], pooling=torchrec.PoolingType.SUM)
              for t, n in enumerate(setup["table_sizes"])]
    # On the meta device: DMP allocates each table once, where its plan puts it.
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=setup["dense_in"],
                 dense_arch_layer_sizes=setup["bottom"], over_arch_layer_sizes=setup["top"])
    apply_optimizer_in_backward(torch.optim.SGD, model.sparse_arch.parameters(), {"lr": lr})
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"))
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda params: torch.optim.SGD(params, lr=lr))
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense_opt])  # as TorchRec's examples combine them

    sharding: dict[str, list[str]] = {}  # what DMP's planner chose, e.g. {"table_wise/fused": ["C1", ...]}
    for plan in dmp.plan.plan.values():
        for name, ps in plan.items():
            sharding.setdefault(f"{ps.sharding_type}/{ps.compute_kernel}", []).append(name)
    info = {"torchrec": torchrec.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "sharding": sharding}
    return dmp, optimizer, info


def load_weights(dmp, setup: dict) -> None:
    """Copy the benchmark's initial weights into the sharded model (in place, so the fused kernels see them)."""
    folder, D = setup["folder"], setup["dim"]
    params = dict(dmp.named_parameters())
    with torch.no_grad():
        for t, n in enumerate(setup["table_sizes"]):
            # One rank holds every table whole (table-wise or data-parallel); the parameter is a view of the
            # table's rows inside the batched kernel's weights.
            w = params[f"sparse_arch.embedding_bag_collection.embedding_bags.C{t + 1}.weight"]
            src = np.load(os.path.join(folder, "tables", f"C{t + 1}.npy"), mmap_mode="r")
            if tuple(w.shape) != (n, D) or src.shape != (n, D):
                raise ValueError(f"table C{t + 1}: expected ({n}, {D}), DMP holds {tuple(w.shape)} and "
                                 f"the file {src.shape}")
            for lo in range(0, n, COPY_ROWS):
                w[lo:lo + COPY_ROWS].copy_(torch.from_numpy(np.array(src[lo:lo + COPY_ROWS])))  # a writable copy
        mlp = np.load(os.path.join(folder, "mlp.npz"))
        bottom = [p._linear for p in dmp.module.dense_arch.model._mlp]
        over = dmp.module.over_arch.model
        top = [p._linear for p in over[0]._mlp] + [over[1]]
        for name, layers in (("bottom", bottom), ("top", top)):
            for i, lin in enumerate(layers):
                lin.weight.copy_(torch.from_numpy(mlp[f"{name}.{i}.weight"]))
                lin.bias.copy_(torch.from_numpy(mlp[f"{name}.{i}.bias"]))
        n = len(setup["table_sizes"]) + 1
        top[0].weight.copy_(top[0].weight[:, _pair_columns(n, D)])  # the RHS is gathered (a copy) before the write


def _pair_columns(n: int, D: int) -> torch.Tensor:
    """For each of TorchRec's interaction columns, the column of haloflow's layout holding the same value."""
    li, lj = torch.tril_indices(n, n, offset=-1).tolist()  # haloflow: pairs i > j, row-major
    ours = {(i, j): D + k for k, (i, j) in enumerate(zip(li, lj))}
    ti, tj = torch.triu_indices(n, n, offset=1).tolist()  # TorchRec: pairs i < j, row-major
    return torch.tensor(list(range(D)) + [ours[(j, i)] for i, j in zip(ti, tj)])


def load_batches(folder: str, num_tables: int):
    """(dense, kjt, labels) per batch, the KJTs built ahead as TorchRec's Criteo loader hands them over."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    data = np.load(os.path.join(folder, "batches.npz"))
    dense, labels, lengths, values, offs = (data[k] for k in ("dense", "labels", "lengths", "values",
                                                              "value_offsets"))
    keys = [f"C{t + 1}" for t in range(num_tables)]
    B = dense.shape[1]
    return [(torch.from_numpy(dense[i]), KeyedJaggedTensor.from_lengths_sync(
                keys=keys, values=torch.from_numpy(values[offs[i]:offs[i + 1]]),
                lengths=torch.from_numpy(lengths[i]), stride=B), torch.from_numpy(labels[i]))
            for i in range(dense.shape[0])]


def steps(dmp, optimizer, batches, lo: int, hi: int) -> dict:
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses = []
    t0 = time.perf_counter()
    for dense, kjt, labels in batches[lo:hi]:
        optimizer.zero_grad()
        loss = loss_fn(dmp(dense, kjt).squeeze(-1), labels)
        loss.backward()  # the tables' SGD runs here, fused into their backward
        optimizer.step()
        losses.append(loss.detach())
    seconds = time.perf_counter() - t0  # the losses are read after the clock stops
    return {"seconds": seconds, "losses": [float(x) for x in losses]}


def serve(lines, reply) -> None:
    setup = json.loads(next(lines))["setup"]
    torch.set_num_threads(setup["threads"])
    with tempfile.TemporaryDirectory(prefix="torchrec-peer-") as store_dir:
        dmp, optimizer, info = build(setup, store_dir)
        load_weights(dmp, setup)
        batches = load_batches(setup["folder"], len(setup["table_sizes"]))
        reply({"ready": True, "info": info})
        for line in lines:
            msg = json.loads(line)
            if msg.get("cmd") == "exit":
                break
            if msg.get("cmd") != "steps":
                raise ValueError(f"unknown command {msg!r}; expected steps or exit")
            reply(steps(dmp, optimizer, batches, int(msg["lo"]), int(msg["hi"])))
        torch.distributed.destroy_process_group()


def main() -> int:
    # The protocol keeps the real stdout; anything a library prints goes to stderr instead of into a reply.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # Known notices of DMP on one CPU rank (deprecations, planner hints) would bury the benchmark's table. The
    # data-parallel tables' CPU lookup has no autograd kernel and warns so at every backward; their rows are
    # updated all the same (checked by hand, and the benchmark compares every warm-up loss).
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*an autograd kernel was not registered")
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("torch.fx").setLevel(logging.ERROR)  # "is_fx_tracing will return true ..." at every step

    def reply(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")

    try:
        serve(iter(sys.stdin), reply)
    except BaseException as e:  # noqa: BLE001 - every failure becomes the one-line reply the protocol promises
        reply({"error": f"{type(e).__name__}: {e}".splitlines()[0]})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
