"""DLRM on one device, the full Kaggle tables, against plain PyTorch on the same device; the lookup's bandwidth.

The 26 Criteo Kaggle tables at full size (33,762,577 rows, D = 16: 2.16 GB of float32; ``--tiny``: capped at 1,000
rows), 13 dense features, bottom MLP 512-256-64, top 512-256, SGD lr 0.1, synthetic Zipf batches
(``haloflow.data.clicks``). Contestants (the same weights, the same batches, rounds in rotating order, samples/s of
each round; ratio = median of per-round ratios against plain):

    haloflow-trainer   the trainer's step (``train.train_step``): every table in one ``BatchedTables``, one lookup
                       and one fused SGD update for all of them, the MLPs' SGD fused; nothing read back in a step
    haloflow           DLRM with SGD fused into each table's backward (no table gradient is built)
    haloflow-autograd  the same model through autograd's sparse gradients and torch.optim.SGD
    plain              plain PyTorch: one nn.EmbeddingBag(sparse=True) per table, the same MLPs, torch.optim.SGD

at batch 2,048 and 16,384. Warm-up losses must agree step for step (within 1e-5, relative to the loss where it is
above 1): the same math. The lookup row
times haloflow's pooled lookup alone (forward, no grad) at the larger batch and counts the bytes it must move (each
looked-up row and id read once, the pooled output written once) against the copy bandwidth measured in this run.
"""

from __future__ import annotations

import statistics
import sys
from argparse import Namespace

import torch

from haloflow.bench.device.common import (Table, Timer, copy_bandwidth, parse_part_args, part_parser, peak_memory_mib,
                                          reset_peak_memory, time_ms, write_part)
from haloflow.bench.dlrm import PlainDLRM, copy_weights, plain_inputs, race
from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.cache import SGD
from haloflow.engine.dlrm.parallelize import parallelize_dlrm
from haloflow.engine.dlrm.shard_stores import ShardStores
from haloflow.engine.dlrm.train import mlp_optimizer, train_step
from haloflow.models.dlrm import DLRM, DLRMConfig, EmbeddingTables, dlrm_loss
from haloflow.partition.planner.planner import table_wise_plan

NAME = "dlrm_gpu"
LOSS_RTOL = 1e-5
LR = 0.1


def build(sizes: tuple[int, ...], dev: torch.device) -> dict:
    """The three contestants on ``dev``, from one set of initial weights."""
    config = DLRMConfig(table_sizes=sizes)
    fused = DLRM(config, embeddings=EmbeddingTables(config.table_sizes, config.embedding_dim, config.seed,
                                                    fused_sgd_lr=LR)).to(dev)
    autograd = DLRM(config).to(dev)  # haloflow's keyed initialisation runs on the host
    with torch.device(dev):  # nn.EmbeddingBag draws its own initial rows on the device, then `reset` copies ours
        plain = PlainDLRM(sizes)
    stores = ShardStores(optimizer=SGD(lr=LR), device=dev)
    trainer = parallelize_dlrm(config, table_wise_plan(sizes, config.embedding_dim, 1), None, stores=stores,
                               device=dev)
    trainer.embeddings.check_ids = False  # the generator's ids are in range
    return {"haloflow-trainer": trainer, "haloflow": fused, "haloflow-autograd": autograd, "plain": plain}


@torch.no_grad()
def reset(models: dict) -> None:
    """Every contestant back to the fused model's current weights (so the next batch size starts level)."""
    src = models["haloflow"]
    copy_weights(src, models["plain"])
    models["haloflow-autograd"].load_state_dict(src.state_dict())
    trainer = models["haloflow-trainer"]
    for store, bag in zip(trainer.embeddings.slot_stores(), src.embeddings.tables):
        store.load_state_dict({"weight": bag.weight.detach()})
    trainer.model.bottom.load_state_dict(src.bottom.state_dict())
    trainer.model.top.load_state_dict(src.top.state_dict())


def runners(models: dict, batches: list, dev: torch.device) -> dict:
    plain_batches = [plain_inputs(b.sparse) for b in batches]
    opts = {name: torch.optim.SGD(m.parameters(), lr=LR) for name, m in models.items() if name != "haloflow-trainer"}
    opts["haloflow-trainer"] = mlp_optimizer(models["haloflow-trainer"], "sgd", LR)

    def step(name, i):
        b = batches[i]
        if name == "haloflow-trainer":
            B = b.batch_size
            return train_step(models[name], opts[name], b, [B], [B], B).sum().detach()
        opts[name].zero_grad(set_to_none=True)
        if name == "plain":
            loss = torch.nn.functional.binary_cross_entropy_with_logits(models[name](b.dense, *plain_batches[i]),
                                                                        b.labels)
        else:
            loss = dlrm_loss(models[name](b.dense, b.sparse), b.labels)
        loss.backward()
        opts[name].step()
        return loss.detach()

    def local(name):
        def run(lo, hi):
            timer = Timer(dev)  # CUDA events on a GPU: the device's time for the chunk of steps
            timer.start()
            losses = [step(name, i) for i in range(lo, hi)]
            seconds = timer.stop() / 1e3
            return seconds, [float(x) for x in losses]  # read after the clock stops
        return run

    return {name: local(name) for name in models}


def lookup_row(name: str, model, batch, dev: torch.device, copy_gbs: float, repeats: int) -> list:
    sparse = batch.sparse
    T, B = sparse.lengths.shape
    D = 16
    nnz = int(sparse.values.numel())
    with torch.no_grad():
        ms = statistics.median(time_ms(lambda: model.embeddings(sparse), dev, warmup=3, repeats=repeats))
    nbytes = nnz * (D * 4 + sparse.values.element_size()) + B * T * D * 4 + sparse.lengths.numel() * 8
    gbs = nbytes / (ms * 1e-3) / 1e9
    return [name, B, nnz, ms, nbytes / 1e9, gbs, gbs / copy_gbs]


def main(argv: list[str] | None = None) -> int:
    p = part_parser(f"python -m haloflow.bench.device.{NAME}", __doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[2048, 16384])
    args, ns = parse_part_args(p, argv)
    dev = args.device
    batch_sizes = [64, 256] if args.tiny else ns.batch_sizes
    steps, warmup, rounds = (4, 2, 2) if args.tiny else (60, 3, 5)
    gen = ClickLogGenerator(ClickLogConfig(max_rows=1000 if args.tiny else None, seed=args.seed))
    sizes = tuple(gen.sizes)
    copy_gbs = copy_bandwidth(dev, nbytes=(1 << 24) if args.tiny else (1 << 31))
    print(f"[{NAME}] {len(sizes)} tables, {sum(sizes):,} rows: building the four models on {dev}", flush=True)
    reset_peak_memory(dev)
    models = build(sizes, dev)
    reset(models)
    resident = torch.cuda.memory_allocated(dev) / 2**20 if dev.type == "cuda" else None
    table = Table(f"DLRM training on {dev.type}, Kaggle tables {sum(sizes):,} rows x 16 ({rounds} rounds of "
                  f"{steps // rounds} steps; ratio = median of per-round ratios against plain)",
                  ["batch", "contestant", "samples/s", "ratio", "warm-up losses equal"],
                  float_fmt=["", "", ",.0f", ".3f", ""])
    lookup = Table(f"haloflow's pooled lookup alone (forward; copy bandwidth {copy_gbs:.0f} GB/s)",
                   ["lookup", "batch", "ids", "ms", "GB moved (min)", "GB/s", "of copy bw"],
                   float_fmt=["", "", ",", ".3f", ".4f", ".0f", ".1%"])
    results, ok = [], True
    for b in batch_sizes:
        print(f"[{NAME}] batch {b}: {steps + warmup} batches, {rounds} rounds", flush=True)
        batches = [x.to(dev) for x in gen.batches(b, steps + warmup)]
        reset(models)
        race_args = Namespace(warmup=warmup, steps=steps, rounds=rounds, batch_size=b)
        losses, rates, chunk = race(runners(models, batches, dev), race_args)
        for name in models:
            ratio = statistics.median(a / r for a, r in zip(rates[name], rates["plain"]))
            equal = all(abs(x - y) <= LOSS_RTOL * max(1.0, abs(y)) for x, y in zip(losses[name], losses["plain"]))
            ok &= equal
            table.rows.append([b, name, statistics.median(rates[name]), ratio, equal])
        for name, label in (("haloflow", "a bag per table"), ("haloflow-trainer", "one for all tables")):
            lookup.rows.append(lookup_row(label, models[name], batches[0], dev, copy_gbs, 5 if args.tiny else 20))
        results.append({"batch_size": b, "samples_per_s": {k: statistics.median(v) for k, v in rates.items()},
                        "rates": rates, "warmup_losses": losses, "steps_per_round": chunk})
    notes = [f"Device memory: {resident:.0f} MiB resident for the four models, peak {peak_memory_mib(dev):.0f} MiB."
             if resident is not None else "No device memory counters on a CPU."]
    return write_part(args, NAME, [table, lookup], {"copy_gbs": copy_gbs, "table_rows": sum(sizes),
                                                    "batches": results}, ok=ok, notes=notes)


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
