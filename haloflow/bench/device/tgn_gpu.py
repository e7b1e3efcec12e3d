"""TGN on one device against PyG's TGN on the same device: training events/s, validation and test AP, peak memory.

The JODIE Wikipedia stream (``$HALOFLOW_DATA/temporal/jodie_wikipedia_edges.csv``; ``--tiny``: its first 3,000
events) with ``haloflow bench tgn``'s protocol and pieces: TGN's inductive split (the training events of 10 % held-out
nodes removed), batch 200, the same training negatives (keyed by event id and epoch) and the same fixed evaluation
negatives, AP over validation then test with the memory following the stream. Each side, alone on the device:

    warm-up    haloflow: the first W = 10 (--tiny: 3) training batches on the device and, from the same initial
               weights, on the CPU; their losses must agree to LOSS_RTOL (the device path computes the CPU path's
               math). PyG: W batches of a throwaway model. Both compile and cache what their first batches need
               (numba, cuBLAS, kernels).
    haloflow   ``TGNFamily`` on the device, a fresh model: ``--epochs`` epochs (default 1: what fits the part's 100 s
               on an H200 beside start-up and evaluation) over the training split, each from an empty memory and
               timed alone with CUDA events, then validation and test (``TGNFamily.evaluate``)
    pyg        ``bench.tgn.PygTGN`` (PyG's examples/tgn.py) on the device: the same, with ``pyg_train_epoch`` and
               ``pyg_evaluate``

Peak memory is what the side's setup, training and evaluation allocated above what was resident before it. The two
are different TGN variants (PyG's example embeds with a ``TransformerConv`` and has no merge layer), so their losses
cannot be compared; they are compared as ``bench tgn`` compares them, on AP over the same events and negatives (the
check: haloflow's test AP at least PyG's, at full size only: a few tiny batches decide nothing).
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from haloflow.bench.device.common import (PartArgs, Table, Timer, parse_part_args, part_parser, peak_memory_mib,
                                          reset_peak_memory, sync, write_part)
from haloflow.bench.tgn import DEFAULT_EVENTS, PygTGN, pyg_evaluate, pyg_train_epoch
from haloflow.data.temporal import TemporalEvents, chronological_split, inductive_nodes
from haloflow.data.temporal_sampler import NegativeSampler
from haloflow.engine.runtime import Runtime, RuntimeConfig
from haloflow.engine.tgn.train import TGNFamily, TGNTrainConfig, read_events
from haloflow.engine.trainer import RunInfo

NAME = "tgn_gpu"
BATCH = 200  # bench tgn's batch (and PygTGN's, fixed there)
TINY_EVENTS = 3_000
LOSS_RTOL = 1e-3  # float32 through the GRU memory and attention: train_parity's TGN tolerance
_T0 = time.perf_counter()
TGLITE_NOTE = ("context, not this run: TGLite reports about 16k training events/s for TGN on Wikipedia on an A100 "
               "(its own setup, not the same events, batches or machine).")


def say(msg: str) -> None:
    """A progress line with the seconds since this module loaded (a timeout's log still shows how far it got)."""
    print(f"[{NAME} {time.perf_counter() - _T0:5.1f}s] {msg}", flush=True)


def events_path(ns: argparse.Namespace) -> Path:
    """``--events``, else bench tgn's default under the data root ($HALOFLOW_DATA, else ../shared/data)."""
    if ns.events is not None:
        return Path(ns.events)
    from haloflow.data.paths import data_root

    return data_root() / DEFAULT_EVENTS


def head(events: TemporalEvents, n: int) -> TemporalEvents:
    """The first ``n`` events of the stream (every node id kept, so the memory has the same rows)."""
    return TemporalEvents(src=events.src[:n], dst=events.dst[:n], t=events.t[:n], num_nodes=events.num_nodes,
                          label=None if events.label is None else events.label[:n],
                          edge_feat=None if events.edge_feat is None else events.edge_feat[:n])


def _resident(dev: torch.device) -> float:
    """MiB allocated now, after freeing what earlier runs left (0 on a CPU)."""
    gc.collect()
    if dev.type != "cuda":
        return 0.0
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(dev) / 2**20


def _peak_above(dev: torch.device, base: float) -> float | None:
    peak = peak_memory_mib(dev)
    return None if peak is None else peak - base


def _tgn_config(dev: torch.device, seed: int, max_batches: int | None = None) -> TGNTrainConfig:
    # no MRR: AP only (the MRR's 20 extra passes over 2,000 test events would double the evaluation)
    return TGNTrainConfig(events="-", batch_size=BATCH, seed=seed, mrr_negatives=0, max_train_batches=max_batches,
                          runtime=RuntimeConfig(device=dev.type, progress=False))


def haloflow_losses(events: TemporalEvents, dev: torch.device, seed: int, batches: int) -> list[float]:
    """The losses of the first ``batches`` training batches of a fresh haloflow TGN on ``dev`` (also a warm-up)."""
    cfg = _tgn_config(dev, seed, batches)
    with Runtime.start(cfg.runtime, join=False) as rt:
        fam = TGNFamily(cfg, events=events)
        fam.setup(rt)
        fam.begin(0)
        for i in range(len(fam.batches)):
            fam.train_unit(i)
        return list(fam.batch_losses)


def haloflow_run(events: TemporalEvents, dev: torch.device, seed: int, epochs: int) -> dict:
    """A fresh haloflow TGN on ``dev``: ``epochs`` timed epochs, then validation and test AP; peak memory."""
    base = _resident(dev)
    reset_peak_memory(dev)
    cfg = _tgn_config(dev, seed)
    timer = Timer(dev)
    with Runtime.start(cfg.runtime, join=False) as rt:
        fam = TGNFamily(cfg, events=events)
        fam.setup(rt)
        fam.begin(0)
        nb = len(fam.batches)
        epoch_ms, losses = [], []
        for epoch in range(epochs):
            sync(dev)
            timer.start()
            for i in range(epoch * nb, (epoch + 1) * nb):  # train_unit resets the memory at an epoch's first batch
                fam.train_unit(i)
            epoch_ms.append(timer.stop())
            losses.append(fam.epoch_losses[-1])
            say(f"haloflow epoch {epoch + 1}: {epoch_ms[-1] / 1e3:.2f} s")
        timer.start()
        metrics = fam.evaluate(RunInfo(rt=rt, total=epochs * nb, resumed_at=0, train_s=sum(epoch_ms) / 1e3))
        eval_ms = timer.stop()
        train_ids = fam.train_ids
    return {"train_ids": train_ids, "epoch_ms": epoch_ms, "epoch_loss": losses, "eval_ms": eval_ms,
            "val_ap": metrics["val_ap"], "test_ap": metrics["test_ap"],
            "test_inductive_ap": metrics["test_inductive_ap"], "peak_mib": _peak_above(dev, base)}


def pyg_run(events: TemporalEvents, dev: torch.device, seed: int, epochs: int, train_ids: np.ndarray, train_neg,
            eval_parts: dict, eval_neg) -> dict:
    """A fresh PyG TGN on ``dev``: ``epochs`` timed epochs, then validation and test AP; peak memory."""
    base = _resident(dev)
    reset_peak_memory(dev)
    model = PygTGN(events, seed, device=dev)
    timer = Timer(dev)
    epoch_ms = []
    for epoch in range(epochs):
        sync(dev)
        timer.start()
        pyg_train_epoch(model, train_ids, train_neg, epoch)
        epoch_ms.append(timer.stop())
        say(f"pyg epoch {epoch + 1}: {epoch_ms[-1] / 1e3:.2f} s")
    timer.start()
    scores = pyg_evaluate(model, events, eval_parts, eval_neg, mrr_events=0)
    eval_ms = timer.stop()
    return {"epoch_ms": epoch_ms, "eval_ms": eval_ms, "val_ap": scores["val_ap"], "test_ap": scores["test_ap"],
            "test_inductive_ap": scores["test_inductive_ap"], "peak_mib": _peak_above(dev, base)}


def pyg_warmup(events: TemporalEvents, dev: torch.device, seed: int, train_ids: np.ndarray, train_neg,
               batches: int) -> None:
    """``batches`` training batches of a throwaway PyG TGN (the first kernels and allocations, off the clock)."""
    model = PygTGN(events, seed, device=dev)
    model.reset()
    model.train()
    for s in range(0, min(batches * BATCH, train_ids.shape[0]), BATCH):
        ids = train_ids[s:s + BATCH]
        model.batch(ids, train_neg.sample(ids), True)
    sync(dev)


def report(args: PartArgs, result: dict) -> tuple[Table, Table]:
    """The part's two tables: each side's speed, AP and memory; the checks behind ``ok``."""
    dev, warm, c = args.device, result["warmup_batches"], result["checks"]
    ours, theirs = result["haloflow"], result["pyg"]
    stream = f"Wikipedia (first {TINY_EVENTS:,} events)" if args.tiny else "Wikipedia"
    speed = Table(f"TGN on {dev.type}, {stream}, batch {BATCH}, {result['epochs']} epoch(s), "
                  f"{result['train_events']:,} training events; a fresh model per side after a {warm}-batch warm-up",
                  ["model", "epoch", "train s", "train events/s", "eval events/s", "val AP", "test AP",
                   "test inductive AP", "peak MiB"],
                  float_fmt=["", "", ".2f", ".0f", ".0f", ".4f", ".4f", ".4f", ".1f"])
    for name, side in (("haloflow", ours), ("pyg", theirs)):
        for e, ms in enumerate(side["epoch_ms"]):
            last = e == len(side["epoch_ms"]) - 1  # AP, evaluation and peak memory: after the last epoch
            speed.rows.append([name, e + 1, ms / 1e3, side["events_per_s"][e],
                               side["eval_events_per_s"] if last else None, side["val_ap"] if last else None,
                               side["test_ap"] if last else None, side["test_inductive_ap"] if last else None,
                               side["peak_mib"] if last else None])
    checks = Table("checks", ["check", "measured", "needed", "passed"], float_fmt=".3g")
    checks.rows = [
        [f"haloflow {dev.type} vs cpu: first {warm} batch losses, max relative diff", result["warmup_loss_max_rel"],
         f"<= {LOSS_RTOL:g}", c["same_math"]],
        ["both sides train on the same events", result["train_events"], "TGNFamily's == bench tgn's",
         c["same_events"]],
        ["val and test AP finite, both sides", "", "", c["aps_finite"]],
        ["haloflow test AP - PyG's", ours["test_ap"] - theirs["test_ap"],
         ">= 0" if c["ap_checked"] else "(not checked at tiny sizes)",
         c["ap_at_least_pyg"] if c["ap_checked"] else None],
        ["haloflow / PyG training events/s (last epoch)", result["ratio_events_per_s"], "(reported)", None],
    ]
    return speed, checks


def main(argv: list[str] | None = None) -> int:
    p = part_parser(NAME, __doc__.splitlines()[0])
    p.add_argument("--events", default=None, help=f"JODIE CSV (default: $HALOFLOW_DATA/{DEFAULT_EVENTS})")
    p.add_argument("--epochs", type=int, default=1, help="timed epochs per side")
    args, ns = parse_part_args(p, argv)
    if ns.epochs < 1:
        p.error(f"--epochs must be >= 1, got {ns.epochs}")
    path = events_path(ns)
    if not path.is_file():
        msg = (f"[{NAME}] the event stream {path} does not exist: set HALOFLOW_DATA to the folder holding "
               f"{DEFAULT_EVENTS}, or pass --events")
        print(msg, file=sys.stderr, flush=True)
        return write_part(args, NAME, [], {"events": str(path), "error": "missing data"}, ok=False, notes=[msg])
    return run(args, path, epochs=ns.epochs)


def run(args: PartArgs, path: Path, *, epochs: int) -> int:
    dev, seed = args.device, args.seed
    events = read_events(path)
    if args.tiny:
        events = head(events, TINY_EVENTS)
    warm = 3 if args.tiny else 10
    # the splits and negatives exactly as `bench tgn` builds them (TGNFamily builds the same from the config)
    split = chronological_split(events)
    ind = inductive_nodes(events, split, 0.1, seed=seed)
    train_ids = ind.train_ids
    train_neg = NegativeSampler.from_destinations(events, train_ids, seed=seed)
    eval_neg = NegativeSampler.from_destinations(events, seed=seed + 1)
    eval_parts = {"val": (split.ids("val"), ind.new_node_val_mask), "test": (split.ids("test"), ind.new_node_test_mask)}
    say(f"{events}; {train_ids.size:,} training events ({-(-train_ids.size // BATCH)} batches of {BATCH}), "
        f"{epochs} epoch(s) per side on {dev}")

    say(f"warm-up: haloflow {warm} batches on {dev} and on cpu")
    on_dev = haloflow_losses(events, dev, seed, warm)
    on_cpu = haloflow_losses(events, torch.device("cpu"), seed, warm)
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(on_dev, on_cpu))
    same_math = len(on_dev) == len(on_cpu) == warm and loss_rel <= LOSS_RTOL
    say(f"warm-up: pyg {warm} batches")
    pyg_warmup(events, dev, seed, train_ids, train_neg, warm)

    say("haloflow: training")
    ours = haloflow_run(events, dev, seed, epochs)
    same_events = bool(np.array_equal(ours.pop("train_ids"), train_ids))
    say("pyg: training")
    theirs = pyg_run(events, dev, seed, epochs, train_ids, train_neg, eval_parts, eval_neg)

    n_train, n_eval = train_ids.size, sum(ids.size for ids, _ in eval_parts.values())
    for side in (ours, theirs):
        side["events_per_s"] = [n_train / (ms / 1e3) for ms in side["epoch_ms"]]
        side["eval_events_per_s"] = n_eval / (side["eval_ms"] / 1e3)
    checks = {"same_math": same_math, "same_events": same_events,
              "aps_finite": all(math.isfinite(s[k]) for s in (ours, theirs) for k in ("val_ap", "test_ap")),
              "ap_at_least_pyg": ours["test_ap"] >= theirs["test_ap"], "ap_checked": not args.tiny}
    ok = (checks["same_math"] and checks["same_events"] and checks["aps_finite"]
          and (checks["ap_at_least_pyg"] or not checks["ap_checked"]))
    notes = [f"haloflow warm-up losses on {dev.type}: {', '.join(f'{x:.5f}' for x in on_dev)}; on cpu: "
             f"{', '.join(f'{x:.5f}' for x in on_cpu)}",
             "PyG: its examples/tgn.py (TransformerConv embedding, identity message, last aggregator) -- a different "
             "TGN variant, compared on AP, not on losses. Peak MiB: above what was resident before the side's setup "
             "(setup, training and evaluation; none on a CPU).",
             TGLITE_NOTE]
    result = {"events": str(path), "num_events": events.num_events, "train_events": int(n_train),
              "eval_events": int(n_eval), "epochs": epochs, "batch": BATCH, "warmup_batches": warm,
              "warmup_losses": {"device": on_dev, "cpu": on_cpu}, "warmup_loss_max_rel": loss_rel,
              "haloflow": ours, "pyg": theirs,
              "ratio_events_per_s": ours["events_per_s"][-1] / theirs["events_per_s"][-1], "checks": checks}
    return write_part(args, NAME, list(report(args, result)), result, ok=ok, notes=notes)


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    raise SystemExit(main())
