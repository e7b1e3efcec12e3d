"""DLRM training benchmark: haloflow against plain PyTorch on one process, and the sharded engine on K ranks.

1. One process: training throughput (samples/s) of haloflow's ``DLRM`` (JaggedBatch input, ``dlrm_loss``,
   SGD lr 0.1, fused into the tables' backward; also through autograd's sparse gradients, as a second row)
   against a plain PyTorch DLRM written here (one ``nn.EmbeddingBag`` per table, the same MLPs,
   ids and offsets prepared ahead like a data loader would), in the same run, timed in alternating rounds so
   both see the same machine load; both start from the same weights and their losses are checked equal.
   Target: haloflow >= 0.95x plain.
   TorchRec's DLRM under ``DistributedModelParallel`` (one gloo rank, fused SGD in the tables' backward) runs in
   the same rounds as a peer process under its own torch (``haloflow/bench/peers/torchrec_dlrm.py``, built by
   ``bash scripts/setup_peers.sh torchrec``; ``--torchrec-python`` points elsewhere, ``''`` leaves it out). It
   gets the batches and the initial weights through files in a temporary folder, steps on request and times
   itself, so the pipe is not counted; its warm-up losses are compared with the plain run's.
   Target: haloflow >= 1.05x TorchRec.
   A control bounds what any contestant can reach: "the dense floor" runs the same MLPs, interaction, loss and
   MLP update on fixed pooled embeddings (no table work at all); no DLRM with these MLPs can step faster, so
   floor / TorchRec is the largest ratio the same math allows here.
2. K = 2 and 4 ranks (torchrun, gloo): the sharded DLRM on a plan from the planner; every step's bytes per
   rank must equal ``predict_step_bytes`` for the plan and the batch; throughput reported.

Synthetic Criteo-like batches (``haloflow.data.clicks``): Kaggle dims (26 tables, 13 dense, D = 16, bottom
512-256-64, top 512-256, batch 128). The tables are capped at ``--max-rows`` rows each (default 200,000;
Kaggle's three largest have 8-10 M) so that two copies fit comfortably in memory and start quickly.

    haloflow bench dlrm                       # ~2 minutes on 2 cores
    haloflow bench dlrm --ranks 2 --steps 20 --out /tmp/dlrm.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from haloflow.bench.args import at_least
from haloflow.bench.peer import PeerProcess, peer_python_flag
from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.data.jagged import ClickBatch
from haloflow.engine.runtime import shutdown
from haloflow.engine.launch import launch_torchrun
from haloflow.cache import SGD as RowSGD
from haloflow.engine.dlrm.parallelize import parallelize_dlrm
from haloflow.engine.dlrm.shard_stores import ShardStores
from haloflow.engine.dlrm.train import mlp_optimizer, train_step
from haloflow.kernels.interaction import interaction
from haloflow.models.dlrm import DLRM, DLRMConfig, EmbeddingTables, dlrm_loss
from haloflow.partition.planner.planner import table_wise_plan
from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.help_format import HelpFormatter

TARGET = 0.95
TORCHREC_TARGET = 1.05  # the issue's: haloflow >= 1.05x TorchRec 1.9 DMP, one process
# TorchRec's fused SGD adds a row's gradients up before the update, ours applies them one occurrence at a time:
# the same math, float32 rounding apart.
TORCHREC_LOSS_RTOL = 1e-4
NOT_INSTALLED = "torchrec: not installed (bash scripts/setup_peers.sh torchrec)"


# ----------------------------------------------------------------------------------- the plain peer
class PlainDLRM(nn.Module):
    """DLRM in plain PyTorch: EmbeddingBag per table, MLPs as nn.Sequential, dot interaction (no self pairs)."""

    def __init__(self, table_sizes, num_dense=13, dim=16, bottom=(512, 256, 64), top=(512, 256)):
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum", sparse=True) for n in table_sizes)
        self.bottom = self._mlp([num_dense, *bottom, dim], last_relu=True)
        T = len(table_sizes)
        self.top = self._mlp([dim + T * (T + 1) // 2, *top, 1], last_relu=False)
        li, lj = torch.tril_indices(T + 1, T + 1, offset=-1)
        self.register_buffer("li", li, persistent=False)  # buffers: they move with .to(device), as the model does
        self.register_buffer("lj", lj, persistent=False)

    @staticmethod
    def _mlp(widths, last_relu):
        layers = []
        for i, (m, n) in enumerate(zip(widths[:-1], widths[1:])):
            layers.append(nn.Linear(m, n))
            if last_relu or i < len(widths) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    def forward(self, dense, ids, offsets):
        z = self.bottom(dense)  # (B, D)
        pooled = [bag(i, o) for bag, i, o in zip(self.emb, ids, offsets)]  # T x (B, D)
        v = torch.stack([z, *pooled], dim=1)  # (B, T+1, D)
        dots = torch.bmm(v, v.transpose(1, 2))[:, self.li, self.lj]  # (B, T(T+1)/2)
        return self.top(torch.cat([z, dots], dim=1)).squeeze(1)  # (B,)


def copy_weights(src: DLRM, dst: PlainDLRM) -> None:
    with torch.no_grad():
        for bag, w in zip(dst.emb, src.embeddings.tables):
            bag.weight.copy_(w.weight)
        dst.bottom.load_state_dict(src.bottom.state_dict())
        dst.top.load_state_dict(src.top.state_dict())


def plain_inputs(sparse):
    """Per table: ids (B,) and bag offsets (B,), as the reference DLRM's loader hands them over."""
    T, B = sparse.lengths.shape
    starts = sparse.bag_offsets()[:, :-1]  # (T, B)
    bounds = sparse.feature_offsets().tolist()
    return [sparse.values[bounds[t]:bounds[t + 1]] for t in range(T)], [starts[t] for t in range(T)]


# -------------------------------------------------------------------------------- the TorchRec peer
def write_peer_inputs(folder: Path, model: DLRM, batches: list[ClickBatch]) -> dict:
    """Tables, MLPs and batches in the layout of ``peers/torchrec_dlrm.py``'s docstring; returns the setup."""
    (folder / "tables").mkdir()
    for t, bag in enumerate(model.embeddings.tables):  # one .npy a table: the peer memory-maps them
        np.save(folder / "tables" / f"C{t + 1}.npy", bag.weight.detach().cpu().numpy())
    linears = {name: [m for m in mlp if isinstance(m, nn.Linear)] for name, mlp in (("bottom", model.bottom),
                                                                                    ("top", model.top))}
    np.savez(folder / "mlp.npz", **{f"{name}.{i}.{k}": getattr(lin, k).detach().cpu().numpy()
                                    for name, layers in linears.items() for i, lin in enumerate(layers)
                                    for k in ("weight", "bias")})
    values = [b.sparse.values.cpu().numpy() for b in batches]
    np.savez(folder / "batches.npz",
             dense=torch.stack([b.dense for b in batches]).cpu().numpy(),  # (N, B, 13)
             labels=torch.stack([b.labels for b in batches]).cpu().numpy(),  # (N, B)
             lengths=torch.stack([b.sparse.lengths.reshape(-1) for b in batches]).cpu().numpy(),  # (N, T*B)
             values=np.concatenate(values), value_offsets=np.cumsum([0] + [len(v) for v in values]))
    config = model.config
    return {"folder": str(folder), "table_sizes": list(config.table_sizes), "dim": config.embedding_dim,
            "dense_in": config.num_dense, "bottom": [*config.bottom_mlp, config.embedding_dim],
            "top": [*config.top_mlp, 1]}


@contextmanager
def torchrec_peer(python: Path, model: DLRM, batches: list[ClickBatch], threads: int) -> Iterator[PeerProcess]:
    """The TorchRec peer, set up from ``model``'s weights; its input folder goes when the peer does."""
    with tempfile.TemporaryDirectory(prefix="haloflow-torchrec-") as folder:
        setup = write_peer_inputs(Path(folder), model, batches)
        with PeerProcess(python, "torchrec_dlrm", {**setup, "lr": 0.1, "threads": threads}, threads=threads) as peer:
            yield peer


# ------------------------------------------------------------------------------------ one process
Runner = Callable[[int, int], tuple[float, list[float]]]  # steps on batches lo..hi-1 -> (seconds, losses)


def single_process(args, sizes, torchrec: Path | None = None) -> dict:
    """haloflow's DLRM with SGD fused into the tables' backward (``EmbeddingTables(fused_sgd_lr=...)``, TorchRec's
    fused-optimizer style), the same model through autograd's sparse gradients and ``torch.optim.SGD`` (the path
    of earlier releases), the plain peer and, with ``torchrec`` (the peer's Python), TorchRec's DMP in a peer
    process: the same batches and weights, rounds in rotating order."""
    dev = torch.device(args.device)
    gen = ClickLogGenerator(ClickLogConfig(max_rows=args.max_rows or None, seed=0))
    batches = [b.to(dev) for b in gen.batches(args.batch_size, args.steps + args.warmup)]
    plain_batches = [plain_inputs(b.sparse) for b in batches]
    config = DLRMConfig(table_sizes=sizes)
    fused = DLRM(config, embeddings=EmbeddingTables(config.table_sizes, config.embedding_dim, config.seed,
                                                    fused_sgd_lr=0.1)).to(dev)
    model = DLRM(config).to(dev)
    plain = PlainDLRM(sizes).to(dev)
    copy_weights(model, plain)
    trainer = parallelize_dlrm(config, table_wise_plan(sizes, config.embedding_dim, 1), None, device=dev,
                               stores=ShardStores(optimizer=RowSGD(lr=0.1), device=dev))  # same seed: same weights
    trainer.embeddings.check_ids = False  # the generator's ids are in range
    floor = nn.ModuleDict({"bottom": copy.deepcopy(model.bottom), "top": copy.deepcopy(model.top)})  # own MLPs
    floor_pooled = torch.randn(args.batch_size, len(sizes), config.embedding_dim, device=dev, requires_grad=True)
    opts = {"dense-floor": torch.optim.SGD(floor.parameters(), lr=0.1, fused=dev.type == "cpu"),
            "haloflow-trainer": mlp_optimizer(trainer, "sgd", 0.1),
            "haloflow": torch.optim.SGD(fused.parameters(), lr=0.1),  # the tables get no .grad: the MLPs only
            "haloflow-autograd": torch.optim.SGD(model.parameters(), lr=0.1),
            "plain": torch.optim.SGD(plain.parameters(), lr=0.1)}

    def step(name, b, inputs):
        opt = opts[name]
        if name == "haloflow-trainer":  # the trainer's own step: one lookup and one update for all tables
            B = b.batch_size
            return train_step(trainer, opt, b, [B], [B], B).sum().detach()
        opt.zero_grad(set_to_none=True)
        if name == "dense-floor":  # the MLPs, interaction, loss and MLP update alone, on fixed pooled rows
            pooled = floor_pooled[:b.batch_size]
            loss = dlrm_loss(floor["top"](interaction(floor["bottom"](b.dense), pooled)).squeeze(1), b.labels)
            loss.backward()
            opt.step()
            return loss.detach()
        if name == "plain":
            loss = nn.functional.binary_cross_entropy_with_logits(plain(b.dense, *inputs), b.labels)
        else:
            loss = dlrm_loss((fused if name == "haloflow" else model)(b.dense, b.sparse), b.labels)
        loss.backward()
        opt.step()
        return loss.detach()

    def local(name) -> Runner:
        def run(lo, hi):
            t0 = time.perf_counter()
            losses = [step(name, batches[i], plain_batches[i]) for i in range(lo, hi)]
            if dev.type == "cuda":
                torch.cuda.synchronize()  # the clock stops when the device has finished
            return time.perf_counter() - t0, [float(x) for x in losses]  # read after the clock stops
        return run

    runs: dict[str, Runner] = {name: local(name) for name in opts}
    with ExitStack() as stack:
        info = None
        if torchrec is not None:
            peer = stack.enter_context(torchrec_peer(torchrec, model, batches, args.threads))
            info = peer.info

            def remote(lo, hi):  # the peer's own clock: the pipe and the JSON are not counted
                reply = peer.call("steps", lo=lo, hi=hi)
                return reply["seconds"], reply["losses"]
            runs["torchrec"] = remote
        losses, rates, chunk = race(runs, args)

    def agree(name, tol):  # within tol of the plain run, step for step
        return all(abs(a - b) <= tol * max(1.0, abs(b)) for a, b in zip(losses[name], losses["plain"]))

    def ratio(name, ref="plain"):  # the median of per-round ratios
        return statistics.median(a / b for a, b in zip(rates[name], rates[ref]))

    result = {"trainer_samples_per_s": statistics.median(rates["haloflow-trainer"]),
              "trainer_ratio": ratio("haloflow-trainer"), "trainer_losses_equal": agree("haloflow-trainer", 1e-5),
              "trainer_ratio_vs_torchrec": None,
              "haloflow_samples_per_s": statistics.median(rates["haloflow"]),
              "autograd_samples_per_s": statistics.median(rates["haloflow-autograd"]),
              "plain_samples_per_s": statistics.median(rates["plain"]), "ratio": ratio("haloflow"),
              "autograd_ratio": ratio("haloflow-autograd"), "target": TARGET,
              "meets_target": ratio("haloflow") >= TARGET,
              "warmup_losses_equal": agree("haloflow", 1e-5) and agree("haloflow-autograd", 1e-5),
              "torchrec_samples_per_s": None, "ratio_vs_torchrec": None, "torchrec_target": TORCHREC_TARGET,
              "meets_torchrec_target": None, "torchrec_losses_equal": None, "torchrec_info": info,
              "dense_floor_samples_per_s": statistics.median(rates["dense-floor"]),
              "dense_floor_ratio": ratio("dense-floor"), "dense_floor_ratio_vs_torchrec": None,
              "warmup_losses": losses, "rounds": args.rounds, "steps_per_round": chunk}
    if "torchrec" in runs:
        result.update(torchrec_samples_per_s=statistics.median(rates["torchrec"]),
                      ratio_vs_torchrec=ratio("haloflow", "torchrec"),
                      trainer_ratio_vs_torchrec=ratio("haloflow-trainer", "torchrec"),
                      dense_floor_ratio_vs_torchrec=ratio("dense-floor", "torchrec"),
                      meets_torchrec_target=ratio("haloflow", "torchrec") >= TORCHREC_TARGET,
                      torchrec_losses_equal=agree("torchrec", TORCHREC_LOSS_RTOL))
    return result


def race(runs: dict[str, Runner], args) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Warm-up steps one at a time (losses kept), then ``args.rounds`` timed rounds of ``steps // rounds`` steps,
    each contestant in turn, the order rotating. Returns (warm-up losses, samples/s per round, steps per round)."""
    names = list(runs)
    losses = {name: [] for name in names}
    for i in range(args.warmup):  # same batches, same weights: every contestant must agree step for step
        for name in names:
            losses[name] += runs[name](i, i + 1)[1]
    rates = {name: [] for name in names}
    chunk = max(1, args.steps // args.rounds)
    for r in range(args.rounds):  # rotate, so a burst of load on the shared machine hits every contestant
        lo = args.warmup + r * chunk
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            seconds, _ = runs[name](lo, lo + chunk)
            rates[name].append(chunk * args.batch_size / seconds)
    return losses, rates, chunk


# ------------------------------------------------------------------------------------- K ranks
def launch(args, k: int) -> dict:
    out = Path(args.out).with_name(f".dlrm-k{k}-{os.getpid()}.json")
    worker_argv = ["-m", "haloflow.bench.dlrm", "--worker", "--out", out, "--steps", args.steps,
                   "--warmup", args.warmup, "--max-rows", args.max_rows, "--batch-size", args.batch_size,
                   "--memory-factor", args.memory_factor]
    proc = launch_torchrun(k, worker_argv, threads_per_rank=1, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"K={k} workers failed:\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    out.unlink()
    return result


def worker(args) -> None:
    import torch.distributed as dist

    from haloflow.data.jagged import split_sizes
    from haloflow.engine.runtime import init_from_env
    from haloflow.engine.dlrm.embedding_layout import predict_step_bytes
    from haloflow.engine.dlrm.sharding import shard_dlrm
    from haloflow.partition.planner.planner import plan_tables
    from haloflow.partition.planner.types import TableSpec, Topology

    ctx = init_from_env(timeout_s=120, device="cpu")
    gen = ClickLogGenerator(ClickLogConfig(max_rows=args.max_rows or None, seed=0))
    sizes = gen.sizes
    specs = [TableSpec(name=f"C{t + 1}", num_rows=n, dim=16) for t, n in enumerate(sizes)]
    # A budget below "every table on every rank" makes the planner shard the large tables.
    table_bytes = 4 * 16 * sum(sizes)
    budget = args.memory_factor * table_bytes / ctx.world_size
    plan = plan_tables(specs, Topology(world_size=ctx.world_size, memory_per_rank=budget))
    model = shard_dlrm(DLRM(DLRMConfig(table_sizes=sizes)), plan, ctx.group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n_dense = model.dense_buckets
    batches = list(gen.batches(args.batch_size, args.steps + args.warmup))
    # Predicted from the plan and each global batch alone, before the clock starts.
    predicted = [predict_step_bytes(model.embeddings.layout, b.sparse, split_sizes(b.batch_size, ctx.world_size),
                                    dense_buckets=n_dense)[ctx.rank] for b in batches]
    mismatches, step_bytes = 0, []
    t0 = None
    for i, b in enumerate(batches):
        if i == args.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        bs = split_sizes(b.batch_size, ctx.world_size)
        mine = b.split_batch(bs)[ctx.rank]
        model.stats.reset()
        opt.zero_grad(set_to_none=True)
        loss = dlrm_loss(model(mine.dense, mine.sparse, bs), mine.labels, global_batch_size=b.batch_size)
        loss.backward()
        model.finish_grad_sync()
        opt.step()
        got = model.stats.snapshot()
        mismatches += got != predicted[i]
        step_bytes.append(sum(got.values()))
    dist.barrier()
    seconds = time.perf_counter() - t0
    per_rank = [None] * ctx.world_size
    dist.all_gather_object(per_rank, {"bytes_per_step": statistics.mean(step_bytes), "mismatches": mismatches})
    if ctx.rank == 0:
        kinds = {}
        for tp in plan.tables:
            kinds[tp.sharding.value] = kinds.get(tp.sharding.value, 0) + 1
        Path(args.out).write_text(json.dumps({
            "world_size": ctx.world_size, "samples_per_s": args.steps * args.batch_size / seconds,
            "bytes_per_step_per_rank": [r["bytes_per_step"] for r in per_rank],
            "bytes_checked_steps": len(batches),
            "bytes_equal_prediction": all(r["mismatches"] == 0 for r in per_rank), "plan_kinds": kinds,
        }))
    shutdown()



def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--steps", type=at_least(1), default=60, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps (one process: losses compared on these)")
    p.add_argument("--rounds", type=int, default=6, help="alternating timing rounds (one process)")
    p.add_argument("--batch-size", type=int, default=128, help="samples per step")
    p.add_argument("--max-rows", type=int, default=200_000,
                   help="cap on a table's rows (Kaggle scaled down); 0: the full Kaggle sizes")
    p.add_argument("--device", default="cpu", help="device of the one-process runs (the K-rank runs use gloo on CPU)")
    p.add_argument("--ranks", type=int, nargs="*", default=[2, 4],
        help="rank counts of the sharded runs (none: one process only)")
    p.add_argument("--memory-factor", type=float, default=1.2,
                   help="planner's memory per rank = this x (all tables' bytes / K)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the one-process runs (each of the K ranks uses one)")
    p.add_argument("--torchrec-python", default=None, metavar="PATH",
                   help="Python of the TorchRec peer (default: the venv `bash scripts/setup_peers.sh torchrec` "
                   "builds, if there); '' leaves TorchRec out")
    p.add_argument("--out", default="bench-results/dlrm.json", help="where the JSON results go")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    torchrec = peer_python_flag(args.torchrec_python, "torchrec")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    sizes = ClickLogConfig(max_rows=args.max_rows or None).sizes
    cap = f"capped at {args.max_rows:,} rows" if args.max_rows else "uncapped"
    print(f"tables: 26 Kaggle cardinalities {cap} ({sum(sizes):,} rows in all), D=16, batch {args.batch_size}, "
          f"one-process runs on {args.device} with {torch.get_num_threads()} torch threads")
    single = single_process(args, sizes, torchrec)
    dist_results = [launch(args, k) for k in args.ranks]
    print(f"{'run':<22} {'samples/s':>10} {'vs plain':>9}  notes (sharded rows: vs the one-process plain run)")
    print(f"{'plain PyTorch (K=1)':<22} {single['plain_samples_per_s']:>10.0f} {1.0:>9.2f}")
    print(f"{'haloflow DLRM (K=1)':<22} {single['haloflow_samples_per_s']:>10.0f} {single['ratio']:>9.2f}  "
          f"SGD fused into the tables' backward; target >= {TARGET}: {'met' if single['meets_target'] else 'NOT met'}; "
          f"losses equal: {single['warmup_losses_equal']}")
    print(f"{'  autograd sparse path':<22} {single['autograd_samples_per_s']:>10.0f} {single['autograd_ratio']:>9.2f}  "
          "sparse gradients + torch.optim.SGD, as the peer")
    vs_tr = single["trainer_ratio_vs_torchrec"]
    print(f"{'  the trainer step':<22} {single['trainer_samples_per_s']:>10.0f} {single['trainer_ratio']:>9.2f}  "
          "train dlrm's step: one lookup and one fused update for all tables"
          + (f"; / TorchRec {vs_tr:.2f}" if vs_tr is not None else "")
          + f"; losses within 1e-5: {single['trainer_losses_equal']}")
    vs_tr = single["dense_floor_ratio_vs_torchrec"]
    print(f"{'  the dense floor':<22} {single['dense_floor_samples_per_s']:>10.0f} {single['dense_floor_ratio']:>9.2f}  "
          "control: the MLPs, interaction, loss and MLP update on fixed pooled rows, no table work: the bound"
          + (f"; / TorchRec {vs_tr:.2f} (no DLRM with these MLPs is faster here)" if vs_tr is not None else ""))
    if single["torchrec_samples_per_s"] is None:
        print(NOT_INSTALLED if args.torchrec_python is None else "torchrec: left out (--torchrec-python '')")
    else:
        tr, kernels = single["torchrec_samples_per_s"], single["torchrec_info"]["sharding"]
        met = "met" if single["meets_torchrec_target"] else "NOT met"
        print(f"{'TorchRec DMP (K=1)':<22} {tr:>10.0f} {tr / single['plain_samples_per_s']:>9.2f}  "
              f"haloflow / TorchRec {single['ratio_vs_torchrec']:.2f}, target >= {TORCHREC_TARGET}: {met}; "
              f"losses equal: {single['torchrec_losses_equal']}; tables "
              + ", ".join(f"{kind} x{len(names)}" for kind, names in kernels.items()))
    for r in dist_results:
        print(f"{'sharded K=' + str(r['world_size']):<22} {r['samples_per_s']:>10.0f} "
              f"{r['samples_per_s'] / single['plain_samples_per_s']:>9.2f}  bytes/step/rank "
              f"{[round(b) for b in r['bytes_per_step_per_rank']]} = prediction: {r['bytes_equal_prediction']}; "
              f"plan {r['plan_kinds']}")
    result = {"benchmark": "dlrm", "max_rows": args.max_rows, "device": args.device, "table_rows_total": sum(sizes),
              "batch_size": args.batch_size, "single_process": single, "sharded": dist_results}
    out = atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    ok = (single["warmup_losses_equal"] and single["torchrec_losses_equal"] is not False  # None: TorchRec not run
          and all(r["bytes_equal_prediction"] for r in dist_results))
    return 0 if ok else 1


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
