"""DLRM training through the embedding cache on the GPU: samples/s, hit rate and bytes moved against the whole
tables on the device, and the weights afterwards compared row for row.

The 26 Criteo Kaggle tables (33,762,577 rows, D 16: 2.16 GB of float32; ``--tiny``: capped at 4,000 rows),
haloflow's ``DLRM`` (13-512-256-64-16, 367-512-256-1), SGD lr 0.1 on the tables and the MLPs as ``bench dlrm``,
the same synthetic Zipf batches (``haloflow.data.clicks``, batch 2,048) for every contestant::

    uncached     the trainer's path (``parallelize_dlrm`` on one rank, ``train.train_step``): every table in one
                 ``BatchedTables`` on the device, SGD fused into its update (the oracle)
    1% cached    the same with ``--cache-ratio``: one ``CachedTables``, ceil(1 % of each table's rows) slots in
    5% cached    all on the device, every row in pinned host memory, its directory device tensors (LRU); the
                 next batch planned on a side stream between this batch's forward and its backward
    1% cached, lookahead / 5% cached, lookahead
                 the same under ``--cache-policy lookahead``: each batch announced 17 steps ahead, as the trainer
                 reads them (Belady within the next 16 batches, a miss cached only when used sooner than its victim)
    params       DLRM's own EmbeddingTables: the tables as parameters on the device, SGD fused into their
                 backward (for context: it adds a row's gradient one occurrence at a time, so its weights differ
                 from the stores' by rounding)

Every timed step runs under ``torch.cuda.set_sync_debug_mode("warn")``: the device-to-host synchronisations of
each contestant's steps are counted (the trainer's step should have none).

Timing: ``--warmup`` untimed steps, then R rounds of S steps per contestant, the contestants' order reversed
every other round, each round timed with CUDA events (``common.Timer``); samples/s is the median over rounds and
"x uncached" the median of per-round ratios. The last step of a round prefetches nothing, so no copy of one
contestant runs into another's round (1 step in S gathers without a prefetch). S x R is ``--steps``, cut down
to fit ``--budget-s`` (and to end ``--total-s`` after the start, set-up included) at the warm-up's last step
times. Afterwards every table row, MLP weight and step's loss of the cached runs is compared with the uncached
run's (SGD on the same floats: equality is expected; a difference fails the part).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from haloflow.bench.device.common import (Table, Timer, parse_part_args, part_parser, peak_memory_mib,
                                          reset_peak_memory, sync, write_part)
from haloflow.cache import SGD, CacheConfig, CacheStats
from haloflow.data.clicks import CHUNK, ClickLogConfig, ClickLogGenerator
from haloflow.data.jagged import ClickBatch
from haloflow.engine.dlrm.parallelize import parallelize_dlrm
from haloflow.engine.dlrm.shard_stores import ShardStores
from haloflow.engine.dlrm.train import mlp_optimizer, train_step
from haloflow.models.dlrm import DLRM, DLRMConfig, EmbeddingTables, dlrm_loss
from haloflow.partition.planner.planner import table_wise_plan

NAME = "cache_gpu"
LR = 0.1  # bench dlrm's SGD learning rate, tables and MLPs
RATIOS = (0.01, 0.05)
WINDOW = 16  # batches a lookahead cache sees ahead (``--cache-window``'s default)
KAGGLE_ROWS = 33_762_577
TINY_MAX_ROWS = 4_000
UNCACHED, PARAMS = "uncached", "params"
MB = 1e6
COMPARE_S = 8.0  # kept for flushing the caches and comparing 3 x 2.16 GB of rows after the timed steps
NOTES = (
    "identical: every table row, every MLP weight and every step's loss equal to the uncached run's (max |diff| "
    "over rows and MLP weights); params adds each occurrence's gradient to its row one at a time, the stores a "
    "row's summed gradient, so it differs by rounding and is not required to match.",
    "Hit rate: distinct ids of a batch found in a slot, over every step from empty caches (LRU, the trainer's "
    "default): a cold-start figure, below the steady state of a long run (bench cache gives hit rates against "
    "cache size). Bytes: rows the caches moved (admitted rows, write-backs); the batches sit on the device before "
    "timing. syncs: device-to-host synchronisations torch warned of in the timed steps (set_sync_debug_mode).",
    "Reference (context only, not this run): Colossal-AI reports about 0.62x at a 1 % cache on Criteo Kaggle and "
    "0.93x on Criteo 1TB against TorchRec's UVM.",
)
CPU_NOTE = ("On cpu the slots and the backing rows are both host memory and the prefetch plans in a thread; pinned "
            "rows, the side stream and the sync counter run only with --device cuda.")


@dataclass
class Contestant:
    """One configuration: its model and MLP optimizer; ``net`` the trainer's model (None: tables as parameters)."""

    name: str
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    net: object | None
    rates: list[float] = field(default_factory=list)  # samples/s per round
    losses: list[torch.Tensor] = field(default_factory=list)  # one 0-dim tensor per step, never synchronised
    step_ms: float = 0.0  # the last warm-up step, wall clock
    syncs: int | None = None  # device-to-host synchronisations seen in the timed steps (counted on CUDA only)

    sequence: list[ClickBatch] = field(default_factory=list)  # every batch, in the order the contestant trains
    sparse: list = field(default_factory=list)  # their ids (``sequence``'s ``.sparse``), what is announced
    told: int = 0  # batches of ``sequence`` announced to a lookahead cache
    trained: int = 0  # steps taken

    def step(self, batch: ClickBatch, upcoming: ClickBatch | None) -> None:
        """One training step on ``batch``; ``upcoming`` (the next batch of the same round) is planned between the
        forward and the backward, on a side stream, when the tables are cached. A lookahead cache is told the
        batches up to ``WINDOW`` + 1 ahead first, as the trainer tells it when it reads them."""
        if self.net is not None:
            emb = self.net.embeddings
            self.told = emb.announce_through(self.sparse, self.told, self.trained)
            self.trained += 1
            B = batch.batch_size
            nxt = upcoming if upcoming is not None and self.net.embeddings.can_prefetch else None
            losses = train_step(self.net, self.opt, batch, [B], [B], B, nxt, background=True)
            self.losses.append(losses.sum().detach())
            return
        self.opt.zero_grad(set_to_none=True)
        loss = dlrm_loss(self.model(batch.dense, batch.sparse), batch.labels)
        loss.backward()
        self.opt.step()
        self.losses.append(loss.detach())


def draw_batches(config: ClickLogConfig, batch: int, count: int, workers: int) -> list[ClickBatch]:
    """``count`` consecutive batches of the synthetic log, drawn in ``workers`` threads (each a generator of its
    own over a contiguous range of whole chunks: sample i is the same whoever draws it)."""
    per_chunk = max(1, CHUNK // batch)
    span = math.ceil(math.ceil(count / workers) / per_chunk) * per_chunk  # batches per thread, whole chunks

    def draw(lo: int) -> list[ClickBatch]:
        return list(ClickLogGenerator(config).batches(batch, min(span, count - lo), start=lo * batch))

    with ThreadPoolExecutor(workers) as pool:
        return [b for part in pool.map(draw, range(0, count, span)) for b in part]


def build(sizes: tuple[int, ...], dev: torch.device, seed: int) -> dict[str, Contestant]:
    """Every contestant, from the same initial rows and MLP weights (``keyed_uniform_rows``, ``DLRMConfig.seed``)."""
    config = DLRMConfig(table_sizes=sizes, seed=seed)
    plan = table_wise_plan(sizes, config.embedding_dim, 1)
    t0 = time.perf_counter()
    out = {}
    caches = [(UNCACHED, None), *((_cached(r), CacheConfig(ratio=r)) for r in RATIOS),
              *((_cached(r) + ", lookahead", CacheConfig(ratio=r, policy="lookahead", window=WINDOW, admit_all=False))
                for r in RATIOS)]
    for name, cache in caches:
        stores = ShardStores(optimizer=SGD(lr=LR), cache=cache, device=dev)
        net = parallelize_dlrm(config, plan, None, stores=stores, device=dev)
        net.embeddings.check_ids = False  # the generator's ids are in range
        out[name] = Contestant(name, net, mlp_optimizer(net, "sgd", LR), net)
    print(f"[{NAME}] tables built in {time.perf_counter() - t0:.1f} s", flush=True)
    tables = EmbeddingTables(sizes, config.embedding_dim, seed, fused_sgd_lr=LR)
    model = DLRM(config, embeddings=tables).to(dev)
    out[PARAMS] = Contestant(PARAMS, model, torch.optim.SGD(model.dense_parameters(), lr=LR), None)
    return out


def _cached(ratio: float) -> str:
    return f"{ratio:.0%} cached"


def run_round(c: Contestant, batches: list[ClickBatch], timer: Timer | None) -> float | None:
    """``c`` trains on ``batches`` in order, prefetching each next one but after the last; the milliseconds of
    the round when ``timer`` is given."""
    if timer is not None:
        timer.start()
    with counting_syncs(c, timer is not None and batches[0].dense.device.type == "cuda"):
        for i, b in enumerate(batches):
            c.step(b, batches[i + 1] if i + 1 < len(batches) else None)
    return timer.stop() if timer is not None else None


@contextmanager
def counting_syncs(c: Contestant, on: bool):
    """Count in ``c.syncs`` the device-to-host synchronisations torch warns of (``set_sync_debug_mode``)."""
    if not on:
        yield
        return
    c.syncs = c.syncs or 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    c.syncs += sum("synchroniz" in str(w.message) for w in seen)


def warm_up(runs: dict[str, Contestant], batches: list[ClickBatch], dev: torch.device) -> None:
    """The first steps of every contestant, untimed (cuBLAS handles, numba compilation, the caches' first
    loads); the last one timed alone on the wall clock, to size the rounds."""
    for c in runs.values():
        run_round(c, batches[:-1], None)
        sync(dev)
        t = time.perf_counter()
        run_round(c, batches[-1:], None)
        sync(dev)
        c.step_ms = (time.perf_counter() - t) * 1e3


@torch.no_grad()
def compare(ref: Contestant, other: Contestant) -> dict:
    """Every table row, every MLP weight and every step's loss of ``other`` against ``ref``: equal, max |diff|."""
    ref_rows = [s.state_dict() for s in ref.net.embeddings.slot_stores()]
    if other.net is not None:  # flushed: the backing rows are complete
        rows = [s.state_dict()["weight"] for s in other.net.embeddings.slot_stores()]
    else:
        rows = [bag.weight.detach() for bag in other.model.embeddings.tables]
    tables_equal, table_diff = True, 0.0
    for r, w in zip(ref_rows, rows):
        a, b = r["weight"], w.to(r["weight"].device)  # (n, D) each; the cached rows come from host memory
        tables_equal &= torch.equal(a, b)
        table_diff = max(table_diff, float((a - b).abs().max()))
    mlp_equal, mlp_diff = True, 0.0
    for a, b in zip(ref.model.dense_parameters(), other.model.dense_parameters()):
        mlp_equal &= torch.equal(a, b)
        mlp_diff = max(mlp_diff, float((a - b).abs().max()))
    la, lb = torch.stack(ref.losses), torch.stack(other.losses)  # (steps,)
    return {"tables_equal": bool(tables_equal), "tables_max_abs_diff": table_diff, "mlp_equal": bool(mlp_equal),
            "mlp_max_abs_diff": mlp_diff, "losses_equal": bool(torch.equal(la, lb)),
            "losses_max_abs_diff": float((la - lb).abs().max())}


def cache_stats(c: Contestant) -> CacheStats:
    return c.net.embeddings.cache_stats() if c.net is not None else CacheStats()


def device_bytes(c: Contestant) -> int:
    """Bytes of table rows (or cache slots and directory) the contestant holds on the device."""
    if c.net is None:
        return sum(bag.weight.numel() * bag.weight.element_size() for bag in c.model.embeddings.tables)
    return int(c.net.embeddings.storage().device)


def time_rounds(runs: dict[str, Contestant], timed: list[ClickBatch], rounds: int, dev: torch.device) -> None:
    """``rounds`` rounds over consecutive slices of ``timed``, every contestant in each, the order reversed every
    other round; each contestant's samples/s per round goes to its ``rates``."""
    S, timer, order = len(timed) // rounds, Timer(dev), list(runs)
    for r in range(rounds):
        part = timed[r * S:(r + 1) * S]
        for name in (order if r % 2 == 0 else order[::-1]):
            ms = run_round(runs[name], part, timer)
            runs[name].rates.append(len(part) * part[0].batch_size / (ms * 1e-3))
        print(f"[{NAME}] round {r + 1}/{rounds}: " + ", ".join(f"{c.name} {c.rates[-1]:.0f}/s"
                                                              for c in runs.values()), flush=True)


def summarise(runs: dict[str, Contestant], stats: dict[str, CacheStats], steps: int) -> tuple[list[list], dict, bool]:
    """Table rows, the JSON per contestant, and whether every cached run equals the uncached one exactly (every
    table row, MLP weight and loss); ``stats`` taken before the comparison flushed the slots, over ``steps``."""
    ref, params = runs[UNCACHED], runs[PARAMS]
    ok, rows, configs = True, [], {}
    for name, c in runs.items():
        s, held = stats[name], device_bytes(c)
        cmp = compare(ref, c) if name != UNCACHED else None
        exact = cmp is not None and cmp["tables_equal"] and cmp["mlp_equal"] and cmp["losses_equal"]
        if name not in (UNCACHED, PARAMS):
            ok &= exact
        rate = statistics.median(c.rates)
        x = statistics.median(a / b for a, b in zip(c.rates, ref.rates))
        diff = None if cmp is None else max(cmp["tables_max_abs_diff"], cmp["mlp_max_abs_diff"])
        rows.append([name, rate, x, s.hit_rate if s.lookups else None, s.bytes_to_device / steps / MB,
                     s.bytes_to_host / steps / MB, s.bytes_to_device / MB, s.bytes_to_host / MB, held / MB,
                     {UNCACHED: "(ref)", PARAMS: "n/a"}.get(name, exact), diff, c.syncs])
        configs[name] = {"samples_per_s": rate, "x_uncached": x, "rates": c.rates,
                         "x_params": statistics.median(a / b for a, b in zip(c.rates, params.rates)),
                         "warmup_step_ms": c.step_ms, "stats": s.as_dict(), "device_table_bytes": held,
                         "bytes_to_device_per_step": s.bytes_to_device / steps,
                         "bytes_to_host_per_step": s.bytes_to_host / steps, "identical": exact, "comparison": cmp,
                         "syncs_in_timed_steps": c.syncs}
    return rows, configs, ok


def main(argv: list[str] | None = None) -> int:
    p = part_parser(f"python -m haloflow.bench.device.{NAME}", __doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=None, help="samples per step (default 2048; --tiny 256)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per contestant (default 120; --tiny 6)")
    p.add_argument("--rounds", type=int, default=None, help="rounds the timed steps are split into (6; --tiny 2)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--budget-s", type=float, default=20.0, help="timed steps cut to fit this many seconds")
    p.add_argument("--total-s", type=float, default=60.0, help="... and to end by this many seconds after the "
                   f"part started, less {COMPARE_S:g} s kept for the comparison")
    args, ns = parse_part_args(p, argv)
    t_start, dev = time.perf_counter(), args.device
    B = ns.batch_size or (256 if args.tiny else 2048)
    rounds = ns.rounds or (2 if args.tiny else 6)
    steps_max = max(rounds, ns.steps or (6 if args.tiny else 120))
    config = ClickLogConfig(max_rows=TINY_MAX_ROWS if args.tiny else None, seed=args.seed)
    sizes = config.sizes
    if not args.tiny and sum(sizes) != KAGGLE_ROWS:
        raise AssertionError(f"Kaggle tables sum to {sum(sizes):,} rows, expected {KAGGLE_ROWS:,}")
    batches = [b.to(dev) for b in draw_batches(config, B, ns.warmup + steps_max, workers=8)]  # on the device
    print(f"[{NAME}] {len(batches)} batches of {B} drawn in {time.perf_counter() - t_start:.1f} s", flush=True)
    reset_peak_memory(dev)
    runs = build(sizes, dev, args.seed)
    for c in runs.values():  # warm-up, then the rounds' slices: every contestant trains the batches in this order
        c.sequence, c.sparse = batches, [b.sparse for b in batches]
    warm = batches[:ns.warmup]
    warm_up(runs, warm, dev)
    print(f"[{NAME}] warm-up step ms: " + ", ".join(f"{c.name} {c.step_ms:.1f}" for c in runs.values()), flush=True)

    # rounds x S steps fit the budget at the warm-up's step times (the caches only get warmer: fewer misses)
    t_timed = time.perf_counter()
    budget = min(ns.budget_s, ns.total_s - COMPARE_S - (t_timed - t_start))
    per_step_s = sum(c.step_ms for c in runs.values()) / 1e3
    S = max(1, min(steps_max // rounds, int(budget / max(per_step_s, 1e-9) / rounds)))
    time_rounds(runs, batches[ns.warmup:ns.warmup + S * rounds], rounds, dev)
    steps = len(warm) + S * rounds
    stats = {name: cache_stats(c) for name, c in runs.items()}  # before the comparison flushes the slots
    rows, configs, ok = summarise(runs, stats, steps)

    title = (f"DLRM, {len(sizes)} tables of {sum(sizes):,} rows (D 16), batch {B}, SGD lr {LR}: {rounds} rounds "
             f"x {S} steps (+{len(warm)} warm-up), order alternating; samples/s median, x: median of per-round "
             f"ratios; bytes over all {steps} steps")
    table = Table(title, ["config", "samples/s", "x uncached", "hit rate", "H2D MB/step", "D2H MB/step",
                          "H2D MB", "D2H MB", "device MB", "identical", "max |diff|", "syncs"],
                  float_fmt=[".0f", ".0f", ".3f", ".3f", ".3f", ".3f", ".1f", ".1f", ".1f", "", ".3g", ""], rows=rows)
    notes = [*NOTES,
             f"Steps: {S * rounds} timed of {steps_max} asked ({budget:.1f} s left for them at the warm-up's step "
             f"times; set-up took {t_timed - t_start:.1f} s, the whole part {time.perf_counter() - t_start:.1f} s)."]
    if dev.type != "cuda":
        notes.append(CPU_NOTE)
    result = {"configs": configs, "table_sizes": list(sizes), "rows": sum(sizes), "batch_size": B, "rounds": rounds,
              "steps_per_round": S, "warmup": len(warm), "peak_memory_mib": peak_memory_mib(dev),
              "seconds": time.perf_counter() - t_start}
    return write_part(args, NAME, [table], result, ok=ok, notes=notes)


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
