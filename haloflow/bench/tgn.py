"""TGN on the Wikipedia stream: haloflow against PyG's TGN in one run, EdgeBank, and the distributed step.

    haloflow bench tgn [--epochs 1] [--rounds 3] [--ks 2,4] [--events PATH] [--out bench-results/tgn.json]

One process (the same threads for both): haloflow's TGN and PyG's TGN example (``TGNMemory`` with
``IdentityMessage`` and ``LastAggregator``, ``LastNeighborLoader(size=10)``, a ``TransformerConv`` attention
embedding with 2 heads, the link predictor), both with memory, time and embedding widths 100, batch 200,
Adam lr 1e-4, trained on the same events (TGN's inductive protocol: the training events of 10% held-out nodes
removed) for the same epochs, then evaluated on validation and test with the same fixed negatives: test AP
(transductive, and inductive on events with a held-out node) and training events/s. The speed ratio is then taken
again over ``--rounds`` more training epochs per side in alternating order (the median of the per-round ratios), so
that a shared machine's changing load does not fall on one side only. EdgeBank (unlimited memory) gives the sanity
line: AP and MRR of "seen this pair before".

Distributed (K ranks under torchrun, one thread each, memory owned by node blocks): events/s, memory-row bytes
fetched per batch against the count predicted from the batch's owners, and the share of the fetch hidden behind
neighbour sampling, from a control that waits for the rows before sampling, interleaved in the same job:
overlap = (T_control - T_overlapped) / min(T_fetch, T_sampling), with the fetch and the sampling also timed alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from haloflow.bench.args import at_least, k_list_or_none
from haloflow.utils.help_format import HelpFormatter

DEFAULT_EVENTS = "temporal/jodie_wikipedia_edges.csv"


# ------------------------------------------------------------------------------------------------ PyG's TGN
class PygTGN:
    """PyG's examples/tgn.py on our stream: ``TGNMemory`` (identity message, last aggregator), a
    ``LastNeighborLoader(size=10)``, a 2-head ``TransformerConv`` embedding, the link predictor; Adam lr 1e-4.

    ``batch(ids, neg, train)`` is one step of the example on the events ``ids`` (stream numbering) with one
    negative destination each; ``reset()`` empties the memory and the neighbour lists (a new epoch). Everything
    lives on ``device`` (the stream's columns, the memory, the neighbour lists, the weights), as in the example.
    """

    def __init__(self, events, seed: int, *, dim: int = 100, neighbors: int = 10,
                 device: torch.device | str = "cpu"):
        from torch.nn import Linear
        from torch_geometric.nn import TransformerConv
        from torch_geometric.nn.models.tgn import IdentityMessage, LastAggregator, LastNeighborLoader, TGNMemory

        torch.manual_seed(seed)
        n = events.num_nodes
        self.device = dev = torch.device(device)
        self.msg_all = msg_all = (torch.from_numpy(events.edge_feat) if events.edge_dim
                                  else torch.zeros(events.num_events, 1)).to(dev)
        self.t_all = torch.from_numpy(events.t.astype(np.int64)).to(dev)
        self.src_all = torch.from_numpy(events.src.copy()).to(dev)
        self.dst_all = torch.from_numpy(events.dst.copy()).to(dev)

        class Embedding(torch.nn.Module):
            def __init__(self, time_enc):
                super().__init__()
                self.time_enc = time_enc
                self.conv = TransformerConv(dim, dim // 2, heads=2, dropout=0.1, edge_dim=msg_all.shape[1] + dim)

            def forward(self, x, last_update, edge_index, t, msg):
                rel_t = last_update[edge_index[0]] - t
                return self.conv(x, edge_index, torch.cat([self.time_enc(rel_t.to(x.dtype)), msg], dim=-1))

        class Predictor(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin_src, self.lin_dst, self.lin_final = Linear(dim, dim), Linear(dim, dim), Linear(dim, 1)

            def forward(self, z_src, z_dst):
                return self.lin_final((self.lin_src(z_src) + self.lin_dst(z_dst)).relu())

        raw = msg_all.shape[1]
        self.memory = TGNMemory(n, raw, dim, dim, message_module=IdentityMessage(raw, dim, dim),
                                aggregator_module=LastAggregator()).to(dev)
        self.gnn, self.pred = Embedding(self.memory.time_enc).to(dev), Predictor().to(dev)
        params = set(self.memory.parameters()) | set(self.gnn.parameters()) | set(self.pred.parameters())
        self.opt = torch.optim.Adam(params, lr=1e-4)
        self.loader = LastNeighborLoader(n, size=neighbors, device=dev)
        self.assoc = torch.empty(n, dtype=torch.long, device=dev)
        # The loader numbers events in the order they are inserted (e_id), which is not the stream's numbering once
        # training skips the held-out nodes' events: keep the map, or neighbours get other events' times.
        self.inserted = torch.empty(events.num_events, dtype=torch.long, device=dev)
        self.cursor = 0
        self.bce = torch.nn.BCEWithLogitsLoss()

    def reset(self) -> None:
        self.memory.reset_state()  # also rebuilds the message stores, on the memory's device
        self.loader.reset_state()
        self.cursor = 0

    def train(self, mode: bool = True) -> None:
        for module in (self.memory, self.gnn, self.pred):
            module.train(mode)

    def batch(self, ids: np.ndarray, neg: np.ndarray, train: bool, store: bool = True):
        """One batch: scores of (src, dst) and (src, neg); with ``train`` a loss, backward and Adam step; with
        ``store`` the batch goes into the memory and the neighbour lists. Returns (pos, neg) logits, detached, on
        the model's device."""
        idx = torch.from_numpy(ids).to(self.device)
        src, dst, t, msg = self.src_all[idx], self.dst_all[idx], self.t_all[idx], self.msg_all[idx]
        neg_t = torch.from_numpy(neg).to(self.device)
        n_id = torch.cat([src, dst, neg_t]).unique()
        n_id, edge_index, e_id = self.loader(n_id)
        self.assoc[n_id] = torch.arange(n_id.size(0), device=self.device)
        z, last_update = self.memory(n_id)
        gid = self.inserted[e_id]  # stream ids of the neighbour events
        z = self.gnn(z, last_update, edge_index, self.t_all[gid], self.msg_all[gid])
        assoc = self.assoc
        pos = self.pred(z[assoc[src]], z[assoc[dst]]).squeeze(1)
        negs = self.pred(z[assoc[src]], z[assoc[neg_t]]).squeeze(1)
        if not store:  # score only (the MRR's extra negatives): the memory and the neighbours stay as they are
            return pos.detach(), negs.detach()
        if train:
            loss = self.bce(pos, torch.ones_like(pos)) + self.bce(negs, torch.zeros_like(negs))
        self.memory.update_state(src, dst, t, msg)
        self.loader.insert(src, dst)
        self.inserted[self.cursor:self.cursor + idx.numel()] = idx
        self.cursor += idx.numel()
        if train:
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.memory.detach()
        return pos.detach(), negs.detach()


def pyg_tgn(events, train_ids, eval_parts, eval_neg, train_neg, epochs: int, seed: int, *, mrr_negatives: int = 20,
            mrr_events: int = 2000) -> dict:
    """PyG's examples/tgn.py on our stream and splits; returns events/s and AP per epoch."""
    model = PygTGN(events, seed)
    out = {"epochs": []}
    for epoch in range(epochs):
        train_s = pyg_train_epoch(model, train_ids, train_neg, epoch)
        scores = pyg_evaluate(model, events, eval_parts, eval_neg, mrr_negatives=mrr_negatives, mrr_events=mrr_events)
        out["epochs"].append({"epoch": epoch, "train_s": train_s, "events_per_s": train_ids.shape[0] / train_s,
                              **scores})
    return out


def pyg_evaluate(model: PygTGN, events, eval_parts, eval_neg, *, mrr_negatives: int = 20,
                 mrr_events: int = 2000) -> dict[str, float]:
    """Validation then test with the memory following the stream (haloflow's protocol and negatives): AP, the
    inductive AP of each part in ``eval_parts`` (name -> (event ids, new-node mask)), and the test MRR against
    ``mrr_negatives`` fixed negatives over the first ``mrr_events`` test events (0: no MRR)."""
    from haloflow.models.temporal_metrics import average_precision, mean_reciprocal_rank

    run_batch = model.batch
    model.train(False)
    scores = {}
    with torch.no_grad():
        for part, (ids_all, new_mask) in eval_parts.items():
            pos, neg, mrr_pos, mrr_neg = [], [], [], []
            ranked = ids_all[:mrr_events] if part == "test" else ids_all[:0]
            fixed = eval_neg.sample_fixed(ranked, events.dst[ranked], mrr_negatives, stream=1)
            for s in range(0, ids_all.shape[0], 200):
                ids = ids_all[s:s + 200]
                if s < ranked.size:  # haloflow's protocol: fixed negatives scored before the batch is stored
                    mrr_neg.append(torch.stack([run_batch(ids, fixed[s:s + ids.size, j], False, store=False)[1]
                                                for j in range(mrr_negatives)], dim=1).cpu().numpy())
                p, q = run_batch(ids, eval_neg.sample(ids), False)
                if s < ranked.size:
                    mrr_pos.append(p.cpu().numpy())
                pos.append(p.cpu().numpy())
                neg.append(q.cpu().numpy())
            pos, neg = np.concatenate(pos), np.concatenate(neg)
            new = new_mask[ids_all]
            scores[f"{part}_ap"] = average_precision(pos, neg)
            scores[f"{part}_inductive_ap"] = average_precision(pos[new], neg[new])
            if mrr_pos:
                scores["test_mrr"] = mean_reciprocal_rank(np.concatenate(mrr_pos), np.concatenate(mrr_neg))
    return scores


def pyg_train_epoch(model: PygTGN, train_ids: np.ndarray, train_neg, epoch: int) -> float:
    """One training epoch of PyG's example from an empty memory; returns its seconds (the host's clock: on a GPU,
    time it with CUDA events around the call)."""
    model.reset()
    model.train()
    t0 = time.perf_counter()
    for s in range(0, train_ids.shape[0], 200):
        ids = train_ids[s:s + 200]
        model.batch(ids, train_neg.sample(ids, stream=epoch), True)
    return time.perf_counter() - t0


# haloflow's runs share this process with PyG's: fixed threads, so that neither side puts MKL in its reproducible
# mode for both (MKL takes one mode a process). A default `train tgn` pays that mode too: 1.02x the step time
# (host/threads.reproducible_blas)
SAME_PROCESS = {"progress": False, "device": "cpu", "adapt_threads": False}


def speed_rounds(events, train_ids: np.ndarray, train_neg, rounds: int, seed: int) -> dict:
    """Training events/s of both sides, one epoch each per round, in alternating order (haloflow first in even
    rounds): under a shared machine's changing load the per-round ratio is what compares them. Returns the
    per-round events/s and the median of the per-round ratios."""
    from haloflow.engine.runtime import RuntimeConfig
    from haloflow.engine.tgn.train import TGNTrainConfig, train_tgn

    pyg = PygTGN(events, seed)
    cfg = TGNTrainConfig(events="-", seed=seed, eval=False, runtime=RuntimeConfig(**SAME_PROCESS))
    ours, theirs = [], []
    for r in range(rounds):
        for side in (("haloflow", "pyg") if r % 2 == 0 else ("pyg", "haloflow")):
            if side == "haloflow":
                ours.append(train_tgn(cfg, events=events).events_per_s)
            else:
                theirs.append(train_ids.shape[0] / pyg_train_epoch(pyg, train_ids, train_neg, 0))
    return {"haloflow_events_per_s": ours, "pyg_events_per_s": theirs,
            "ratio_median": statistics.median(a / b for a, b in zip(ours, theirs))}


def haloflow_tgn(events, epochs: int, seed: int) -> dict:
    from haloflow.engine.runtime import RuntimeConfig
    from haloflow.engine.tgn.train import TGNTrainConfig, train_tgn

    # warm-up: numba compiles the sampler and negative kernels on first use (cached on disk afterwards)
    train_tgn(TGNTrainConfig(events="-", max_train_batches=3, eval=False, runtime=RuntimeConfig(**SAME_PROCESS)),
              events=events)
    out = {"epochs": []}
    for e in range(1, epochs + 1):  # a fresh run per epoch count, evaluated after its last epoch
        if e != epochs and e != 1:
            continue
        r = train_tgn(TGNTrainConfig(events="-", epochs=e, seed=seed, runtime=RuntimeConfig(**SAME_PROCESS)),
                      events=events)
        out["epochs"].append({"epoch": e - 1, "train_s": r.train_s, "events_per_s": r.events_per_s, **r.metrics})
    return out


# ------------------------------------------------------------------------------------------------ distributed
def worker(args) -> None:
    from dataclasses import replace

    from haloflow.engine.runtime import Runtime, RuntimeConfig
    from haloflow.engine.tgn.train import TGNFamily, TGNTrainConfig, read_events

    events = read_events(args.events)
    cfg = TGNTrainConfig(events=args.events, seed=0, eval=False,
                         runtime=RuntimeConfig(device="cpu", progress=False, timeout_s=300))
    with Runtime.start(cfg.runtime, distributed=True) as rt:
        runs = {s: TGNFamily(replace(cfg, schedule=s), events=events) for s in ("overlap", "wait_first")}
        for family in runs.values():
            family.setup(rt)
        ids_all = runs["overlap"].train_ids
        batches = [ids_all[i:i + cfg.batch_size] for i in range(0, args.batches * cfg.batch_size, cfg.batch_size)]
        times = {s: [] for s in runs}
        fetched, predicted = [], []
        for b, ids in enumerate(batches):  # both schedules on every batch, in alternating order
            for s in (list(runs) if b % 2 == 0 else list(runs)[::-1]):
                run = runs[s]
                run.stats.reset()
                torch.distributed.barrier()
                t0 = time.perf_counter()
                run.step(ids, run.train_neg.sample(ids), run.train_csr, epoch=0, train=True)
                times[s].append(time.perf_counter() - t0)
                if s == "overlap":
                    fetched.append(run.stats.bytes["tgn_fetch"])
                    predicted.append(_predicted_fetch_bytes(run, ids))
        fetch_s, sample_s = _alone(runs["overlap"], batches[-1])
        warm = 2  # the first batches compile the kernels
        row = {"overlap": statistics.median(times["overlap"][warm:]),
               "wait_first": statistics.median(times["wait_first"][warm:]), "fetch_s": fetch_s,
               "sample_s": sample_s, "bytes": [int(x) for x in fetched], "bytes_predicted": predicted,
               "events_per_s": sum(i.shape[0] for i in batches[warm:]) / sum(times["overlap"][warm:])}
        rows = [None] * rt.layout.world_size
        torch.distributed.all_gather_object(rows, row)
        if rt.layout.is_main:
            Path(args.worker_out).write_text(json.dumps(rows))


def _predicted_fetch_bytes(run, ids: np.ndarray) -> int:
    """Bytes this rank's fetches send: requests (8 B per row) to other owners and replies (a packed row) for rows
    other ranks ask of it. Computed from the batch alone, as every rank can: the rows each rank needs are its
    query nodes plus its sampled neighbours."""
    from haloflow.models.tgn import make_tgn_batch

    lay, ev = run.rt.layout, run.events
    K, me = lay.world_size, lay.rank
    row_bytes = 4 * (2 * run.config.memory_dim + ev.edge_dim) + 24
    owner = run.memory.owners.owner
    neg_all = run.train_neg.sample(ids)
    total = 0
    cut = np.concatenate([[0], np.cumsum(run.workers.rank_sizes(ids.shape[0]))])  # each rank's workers' block
    for r in range(K):
        mine, neg = ids[cut[r]:cut[r + 1]], neg_all[cut[r]:cut[r + 1]]
        query = np.unique(np.concatenate([ev.src[mine], ev.dst[mine], neg]))
        batch = make_tgn_batch(ev, mine, neg, run.train_csr, num_neighbors=run.config.num_neighbors)
        nodes = batch.node_ids.numpy()
        for part in (query, np.setdiff1d(nodes, query)):
            own = owner[part]
            if r == me:
                total += 8 * int((own != me).sum())  # my requests to other owners
            total += row_bytes * int(((own == me) & (r != me)).sum())  # my replies to rank r
    return total


def _alone(run, ids: np.ndarray) -> tuple[float, float]:
    """Seconds of the query-row fetch alone and of the neighbour sampling alone, for one batch (median of 5)."""
    from haloflow.models.tgn import make_tgn_batch

    ev = run.events
    mine, neg = run.mine(ids), run.mine(run.train_neg.sample(ids))
    query = torch.from_numpy(np.unique(np.concatenate([ev.src[mine], ev.dst[mine], neg])))
    fetch, sample = [], []
    for _ in range(5):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        run.memory.fetch(query).wait()
        fetch.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        make_tgn_batch(ev, mine, neg, run.train_csr, num_neighbors=run.config.num_neighbors)
        sample.append(time.perf_counter() - t0)
    return statistics.median(fetch), statistics.median(sample)


# ------------------------------------------------------------------------------------------------ driver
def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--events", default=None, help=f"event stream (default: $HALOFLOW_DATA/{DEFAULT_EVENTS})")
    p.add_argument("--epochs", type=at_least(1), default=1, help="training epochs of each model")
    p.add_argument("--ks", type=k_list_or_none, default="2,4", help="rank counts of the distributed rows ('' for none)")
    p.add_argument("--batches", type=at_least(1), default=40, help="batches timed per schedule in the distributed rows")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the one-process runs")
    p.add_argument("--rounds", type=at_least(0), default=3,
                   help="extra training epochs per side, alternating, for the speed "
                   "ratio (0: the evaluated runs' speeds only)")
    p.add_argument("--skip-pyg", action="store_true", help="time haloflow alone, without the PyG peer")
    p.add_argument("--seed", type=int, default=0, help="seed of the models and the negatives")
    p.add_argument("--out", default="bench-results/tgn.json", help="where the JSON results go")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.events is None:
        from haloflow.data.paths import data_root

        args.events = str(data_root() / DEFAULT_EVENTS)
    if args.worker:
        worker(args)
        return 0

    from haloflow.data.temporal import chronological_split, inductive_nodes
    from haloflow.data.temporal_sampler import NegativeSampler
    from haloflow.engine.launch import launch_torchrun
    from haloflow.engine.tgn.train import read_events
    from haloflow.models.temporal_metrics import EdgeBank
    from haloflow.utils.atomic import atomic_write_text
    from haloflow.utils.table import format_table

    torch.set_num_threads(args.threads)
    events = read_events(args.events)
    split = chronological_split(events)
    ind = inductive_nodes(events, split, 0.1, seed=args.seed)
    train_neg = NegativeSampler.from_destinations(events, ind.train_ids, seed=args.seed)
    eval_neg = NegativeSampler.from_destinations(events, seed=args.seed + 1)  # what haloflow's evaluation uses
    print(f"{events}; train {ind.train_ids.size:,} events (inductive protocol), {args.threads} threads", flush=True)
    results = {"events": str(args.events), "threads": args.threads, "epochs": args.epochs}
    results["haloflow"] = haloflow_tgn(events, args.epochs, args.seed)
    if not args.skip_pyg:
        parts = {"val": (split.ids("val"), ind.new_node_val_mask), "test": (split.ids("test"), ind.new_node_test_mask)}
        results["pyg"] = pyg_tgn(events, ind.train_ids, parts, eval_neg, train_neg, args.epochs, args.seed)
    eb = EdgeBank(events).evaluate(events, split.ids("test"), eval_neg, num_negatives=20, stream=1)
    results["edgebank"] = {"test_ap": eb.ap, "test_auc": eb.auc, "test_mrr": eb.mrr}
    rows = []
    for name in ("haloflow", "pyg"):
        if name in results:
            for e in results[name]["epochs"]:
                rows.append([name, e["epoch"] + 1, e["events_per_s"], e.get("test_ap"), e.get("test_inductive_ap"),
                             e.get("test_mrr")])
    rows.append(["EdgeBank (unlimited)", "-", None, eb.ap, None, eb.mrr])
    print(format_table(["model", "epochs", "train events/s", "test AP", "inductive AP", "test MRR"], rows,
                       title="TGN on the Wikipedia stream, one process"))
    if "pyg" in results:
        h, g = results["haloflow"]["epochs"][-1], results["pyg"]["epochs"][-1]
        results["ratio_events_per_s"] = h["events_per_s"] / g["events_per_s"]
        if args.rounds > 0:
            sr = results["speed_rounds"] = speed_rounds(events, ind.train_ids, train_neg, args.rounds, args.seed)
            print(format_table(["round", "haloflow events/s", "PyG events/s", "ratio"],
                               [[i + 1, a, b, a / b] for i, (a, b) in
                                enumerate(zip(sr["haloflow_events_per_s"], sr["pyg_events_per_s"]))],
                               title="training speed, one epoch per side and round, alternating order"))
            results["ratio_events_per_s"] = sr["ratio_median"]
        print(f"haloflow / PyG training speed: {results['ratio_events_per_s']:.2f}x (target >= 2; "
              f"{'median of ' + str(args.rounds) + ' alternating rounds' if args.rounds > 0 else 'one run each'}); "
              f"test AP {h['test_ap']:.4f} vs {g['test_ap']:.4f} (target: at least PyG's)")
    dist_rows = []
    with tempfile.TemporaryDirectory(prefix="tgn-") as tmp:
        for k in [int(x) for x in args.ks.split(",") if x]:
            out = Path(tmp) / f"k{k}.json"
            proc = launch_torchrun(k, ["-m", "haloflow.bench.tgn", "--worker", "--events", args.events,
                                       "--worker-out", out, "--batches", args.batches],
                                   threads_per_rank=1, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"K={k} failed:\n{proc.stderr[-3000:]}")
            per_rank = json.loads(out.read_text())
            slow = {key: max(r[key] for r in per_rank) for key in ("overlap", "wait_first", "fetch_s", "sample_s")}
            hide = min(slow["fetch_s"], slow["sample_s"])
            overlap = (slow["wait_first"] - slow["overlap"]) / hide if hide > 0 else None
            got = [sum(b) for b in zip(*(r["bytes"] for r in per_rank))]
            want = [sum(b) for b in zip(*(r["bytes_predicted"] for r in per_rank))]
            dist_rows.append([k, min(r["events_per_s"] for r in per_rank), 1000 * slow["wait_first"],
                              1000 * slow["overlap"], 1000 * slow["fetch_s"], 1000 * slow["sample_s"], overlap,
                              statistics.mean(got) / k, got == want])
            results.setdefault("distributed", []).append({"k": k, "per_rank": per_rank, "overlap": overlap})
    if dist_rows:
        print(format_table(["K", "events/s", "control ms", "overlapped ms", "fetch ms", "sampling ms", "overlap",
                            "fetch bytes/batch/rank", "= predicted"], dist_rows,
                           title=f"distributed step, 1 thread per rank, {os.cpu_count()} cores; overlap = (control - "
                                 "overlapped) / min(fetch, sampling)"))
    atomic_write_text(args.out, json.dumps(results, indent=1, default=float) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
