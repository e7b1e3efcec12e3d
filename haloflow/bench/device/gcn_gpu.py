"""GCN on one device against PyG's ``GCNConv`` on the same device: epoch time, peak memory, SpMM bandwidth.

Kipf's two-layer GCN (128 -> 128 -> 40, Adam lr 0.01, cross-entropy over every node) on random symmetric graphs of
200,000 nodes / 2.2 M adjacency entries and 2 M nodes / 50 M entries (``--tiny``: 2,000 / 20,000). Contestants, one
epoch each in turn, the order rotating round by round, each epoch timed with CUDA events:

    haloflow              GCN(precompute_first=False), dropout 0.5 (counter-hash mask on the device)
    pyg-sparse            2 x GCNConv(cached=True) on a torch.sparse_csr adjacency, dropout 0.5
    pyg-edge_index        2 x GCNConv(cached=True) on edge_index (gather / scatter), dropout 0.5
    haloflow-nodropout    dropout 0, from the same initial weights as ...
    pyg-sparse-nodropout  ... PyG with dropout 0: their first losses must agree (the same math)

Ratios are medians of per-round ratios against the PyG row with the same dropout. Peak memory is what an epoch
allocates above what was resident before it (every contestant's graph and weights stay resident). The SpMM row
times haloflow's forward ``A_hat @ X`` alone at widths 40 and 128 and counts the fewest bytes it must move (the CSR
arrays and X read once, the output written once) and the bytes of one X row read per stored entry (what a product
over a random graph gathers, less what the L2 cache catches), each against the device's copy bandwidth measured
in the same run.
"""

from __future__ import annotations

import statistics
import sys

import numpy as np
import torch

from haloflow.bench.device.common import (Table, Timer, copy_bandwidth, parse_part_args, part_parser,
                                          peak_memory_mib, reset_peak_memory, sync, time_ms, write_part)
from haloflow.bench.gcn import PygGCN, pyg_epoch, random_graph
from haloflow.data.graph import CSRGraph
from haloflow.models import GCN, GCNConfig, LocalAggregator, gcn_loss

NAME = "gcn_gpu"
IN_DIM, HIDDEN, CLASSES = 128, 128, 40
LOSS_RTOL = 1e-4  # float32: two summation orders (cuSPARSE's and PyG's) over two layers and a mean over N rows
PEERS = {"haloflow": "pyg-sparse", "pyg-edge_index": "pyg-sparse", "haloflow-nodropout": "pyg-sparse-nodropout"}


def contestants(graph: CSRGraph, x: torch.Tensor, y: torch.Tensor,
                dev: torch.device) -> tuple[dict, LocalAggregator]:
    """name -> one training epoch on ``dev`` returning its loss (a 0-dim tensor, not synchronised); and haloflow's
    aggregator (for the SpMM rows)."""
    n = graph.num_nodes
    ids, mask = torch.arange(n, device=dev), torch.ones(n, dtype=torch.bool, device=dev)
    agg = LocalAggregator(graph, "gcn", kernel="torch")  # its CSR is copied to the device at the first product
    steps, weights = {}, {}
    for name, p in (("haloflow", 0.5), ("haloflow-nodropout", 0.0)):
        cfg = GCNConfig(in_dim=IN_DIM, out_dim=CLASSES, hidden_dim=HIDDEN, dropout=p, precompute_first=False)
        model = GCN(cfg).to(dev).train()
        weights[name] = [(w.detach().clone(), b.detach().clone()) for w, b in zip(model.weights, model.biases)]
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        state = {"epoch": 0}

        def step(model=model, opt=opt, state=state):
            opt.zero_grad()
            loss = gcn_loss(model(x, agg, ids, state["epoch"]), y, mask, n)
            loss.backward()
            opt.step()
            state["epoch"] += 1
            return loss.detach()

        steps[name] = step
    src, dst = graph.edges()
    adj_t = torch.sparse_csr_tensor(  # row = destination: PyG's adj_t convention
        torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices), torch.ones(graph.num_edges), size=(n, n),
        check_invariants=False).to(dev)
    edge_index = torch.from_numpy(np.stack([src, dst])).to(dev)
    for name, adj, p, init in (("pyg-sparse", adj_t, 0.5, "haloflow"), ("pyg-edge_index", edge_index, 0.5, "haloflow"),
                               ("pyg-sparse-nodropout", adj_t, 0.0, "haloflow-nodropout")):
        model = PygGCN([IN_DIM, HIDDEN, CLASSES], p).to(dev).train()
        with torch.no_grad():  # the same initial weights as the haloflow row it is compared with
            for conv, (w, b) in zip(model.convs, weights[init]):
                conv.lin.weight.copy_(w.T)
                conv.bias.copy_(b)
        steps[name] = pyg_epoch(model, x, adj, y)
    return steps, agg


def race(steps: dict, dev: torch.device, warmup: int, rounds: int) -> tuple[dict, dict, dict]:
    """The untimed epochs' losses, per-round epoch milliseconds and each contestant's epoch peak memory above
    resident (MiB)."""
    losses = {name: [] for name in steps}
    for _ in range(warmup):  # the losses compared: the forward, and after the first the backward and Adam too
        for name, step in steps.items():
            losses[name].append(float(step()))
    sync(dev)
    names, times, peaks, timer = list(steps), {n: [] for n in steps}, {}, Timer(dev)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            base = torch.cuda.memory_allocated(dev) / 2**20 if dev.type == "cuda" else None
            reset_peak_memory(dev)
            timer.start()
            steps[name]()
            times[name].append(timer.stop())
            peak = peak_memory_mib(dev)
            if peak is not None:
                peaks[name] = max(peaks.get(name, 0.0), peak - base)
    return losses, times, peaks


def spmm_rows(agg: LocalAggregator, graph: CSRGraph, dev: torch.device, widths: list[int], copy_gbs: float,
              repeats: int) -> list[list]:
    a = agg.op.sparse_csr(torch.float32, dev)
    csr_bytes = sum(t.numel() * t.element_size() for t in (a.crow_indices(), a.col_indices(), a.values()))
    rows = []
    for f in widths:
        x = torch.randn(graph.num_nodes, f, device=dev)
        ms = statistics.median(time_ms(lambda: agg.op @ x, dev, warmup=2, repeats=repeats))
        nbytes = csr_bytes + 2 * graph.num_nodes * f * 4  # CSR read once, X read once, the output written once
        gathered = csr_bytes + (a.values().numel() + graph.num_nodes) * f * 4  # one X row read per stored entry
        gbs, gathered_gbs = nbytes / (ms * 1e-3) / 1e9, gathered / (ms * 1e-3) / 1e9
        rows.append([f, ms, nbytes / 1e9, gbs, gbs / copy_gbs, gathered / 1e9, gathered_gbs / copy_gbs])
    return rows


def dropout_rows(nodes: int, dev: torch.device, repeats: int) -> tuple[list[list], bool]:
    """The keyed dropout's bodies on the device, (nodes, 128) float32, p = 0.5: the body registered for it (Triton
    where it imports) against the stock formula (~10 int64 passes): ms each and whether every bit agrees."""
    from haloflow.kernels import keyed_dropout as kd
    from haloflow.kernels._registry import triton_available

    gen = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(nodes, HIDDEN, generator=gen, device=dev)
    ids = torch.arange(nodes, device=dev) * 7 + 3
    args = (h, ids, kd.base_key(0, 1, 1), kd.threshold(0.5), 2.0, True, True)
    fused = kd.gpu if dev.type == "cuda" and triton_available() else kd.cpu if dev.type == "cpu" else None
    want = kd.stock(*args)
    rows = [["stock (torch int64 ops)", statistics.median(time_ms(lambda: kd.stock(*args), dev, warmup=2,
                                                                     repeats=repeats)), 1.0, True]]
    same = True
    if fused is not None:
        got = fused(*args)
        same = all(torch.equal(a, b) for a, b in zip(got, want))
        ms = statistics.median(time_ms(lambda: fused(*args), dev, warmup=2, repeats=repeats))
        rows.append([f"registered body ({'Triton' if dev.type == 'cuda' else 'numba'})", ms, ms / rows[0][1], same])
    return rows, same


def one_graph(nodes: int, entries: int, args, copy_gbs: float) -> tuple[list[Table], dict, bool]:
    dev = args.device
    print(f"[{NAME}] graph {nodes:,} nodes / {entries:,} entries: building", flush=True)
    graph = random_graph(nodes, entries, args.seed)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    x = torch.randn(nodes, IN_DIM, generator=gen, device=dev)
    y = torch.randint(0, CLASSES, (nodes,), generator=gen, device=dev)
    steps, agg = contestants(graph, x, y, dev)
    print(f"[{NAME}] graph {nodes:,}: timing {len(steps)} contestants", flush=True)
    rounds, warmup = (2, 2) if args.tiny else (5, 2)
    losses, times, peaks = race(steps, dev, warmup, rounds)
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(losses["haloflow-nodropout"], losses["pyg-sparse-nodropout"]))
    same = loss_rel <= LOSS_RTOL
    label = f"{nodes:,} nodes / {graph.num_edges:,} entries"
    epochs = Table(f"GCN epoch on {dev.type}, {label} ({rounds} rounds; ratio = median of per-round ratios)",
                   ["contestant", "epoch ms", "vs", "time ratio", "epoch peak MiB", "first loss"],
                   float_fmt=["", ".2f", "", ".3f", ".0f", ".5f"])
    ratios = {}
    for name in steps:
        ref = PEERS.get(name)
        ratios[name] = (statistics.median(a / b for a, b in zip(times[name], times[ref])) if ref else None)
        epochs.rows.append([name, statistics.median(times[name]), ref or "", ratios[name], peaks.get(name),
                            losses[name][0]])
    spmm = Table(f"haloflow forward SpMM A_hat @ X, {label} (copy bandwidth {copy_gbs:.0f} GB/s)",
                 ["width", "ms", "GB moved (min)", "GB/s", "of copy bw", "GB gathered", "gathered of copy bw"],
                 float_fmt=["", ".3f", ".3f", ".0f", ".1%", ".3f", ".1%"])
    spmm.rows = spmm_rows(agg, graph, dev, [40, 128] if not args.tiny else [8], copy_gbs, 3 if args.tiny else 10)
    drop = Table(f"keyed dropout (relu fused, p 0.5) of a ({nodes:,}, {HIDDEN}) block on {dev.type}: its bodies",
                 ["body", "ms", "vs stock", "bits equal the stock formula's"], float_fmt=["", ".3f", ".3f", ""])
    drop.rows, drop_same = dropout_rows(nodes, dev, 3 if args.tiny else 10)
    target = ratios.get("haloflow")
    epochs.title += (f"; target: haloflow (dropout 0.5) <= 0.6x pyg-sparse's time: "
                     f"{'met' if target is not None and target <= 0.6 else 'NOT met'} ({target:.3f})"
                     if target is not None else "")
    result = {"nodes": nodes, "entries": graph.num_edges, "epoch_ms": {k: statistics.median(v) for k, v in
                                                                         times.items()},
              "epoch_ms_rounds": times, "ratios": ratios, "peak_mib": peaks, "untimed_losses": losses,
              "nodropout_loss_rel_diff": loss_rel, "same_math": same,
              "spmm": [dict(zip(spmm.headers, r)) for r in spmm.rows],
              "keyed_dropout": [dict(zip(drop.headers, r)) for r in drop.rows], "dropout_target_0.6": target}
    del steps, agg, x, y
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return [epochs, spmm, drop], result, same and drop_same


def main(argv: list[str] | None = None) -> int:
    p = part_parser(f"python -m haloflow.bench.device.{NAME}", __doc__.splitlines()[0])
    args, _ = parse_part_args(p, argv)
    sizes = [(2_000, 20_000)] if args.tiny else [(200_000, 2_200_000), (2_000_000, 50_000_000)]
    copy_gbs = copy_bandwidth(args.device, nbytes=(1 << 24) if args.tiny else (1 << 31))
    tables, results, ok = [], [], True
    for nodes, entries in sizes:
        t, r, same = one_graph(nodes, entries, args, copy_gbs)
        tables += t
        results.append(r)
        ok &= same
    notes = [f"Same math: haloflow-nodropout's losses of the untimed epochs (the first: the forward; the next: "
             f"after a backward and an Adam step) equal pyg-sparse-nodropout's within {LOSS_RTOL:g} (relative) on "
             f"every graph: {ok}. time ratio = epoch ms / the peer's (below 1: haloflow faster). Dropout rows draw "
             "different masks (haloflow: a counter hash; torch: its Philox generator), so only their times compare."]
    return write_part(args, NAME, tables, {"copy_gbs": copy_gbs, "graphs": results}, ok=ok, notes=notes)


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
