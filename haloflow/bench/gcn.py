"""Single-process GCN benchmark: haloflow's epoch against PyG ``GCNConv`` in the same run, plus SpMM kernels.

Graph: random, symmetric, no self-loops, ``--nodes`` nodes and about ``--entries`` adjacency entries (default
200,000 / 2.2 M); features (N, 128) and labels in 40 classes drawn from a seeded RNG. Model 128 -> 128 -> 40,
dropout 0.5, Adam, cross-entropy over all nodes. One epoch = forward + backward + optimizer step.

Contestants (each timed for one epoch in turn, round after round, so load from other processes hits all alike).
The headline computes the peer's model - Kipf's GCN, dropout on the layer's input X, every SpMM every epoch -
and the optimisations follow, labelled, each against the row it changes:

    haloflow                  GCN(precompute_first=False): Kipf's model, the same math as PyG's GCNConv
    pyg-sparse                2 x GCNConv(cached=True) on a torch.sparse_csr adjacency (PyG's sparse input)
    pyg-edge_index            2 x GCNConv(cached=True) on edge_index (gather / scatter message passing)
    dgl                       2 x dgl GraphConv(norm="both") on the graph with self-loops: in this process when
                              dgl imports here, else in DGL's own Python (``--dgl-python``, see below)
    dgl-nodropout             the DGL peer with dropout 0, from haloflow-nodropout's initial weights
    haloflow+precompute       optimisation: layer 0's A_hat X once before training, dropout moved onto A_hat X
                              (a different dropout placement, and the widest SpMM skipped)
    haloflow-numba-kernel     haloflow with the numba SpMM kernel instead of the default torch.sparse.mm (with
                              ``--kernel numba``: haloflow-torch-kernel, the other way round)
    haloflow-nodropout        dropout 0: the compute alone, against ...
    pyg-sparse-nodropout      ... PyG with dropout 0 (torch's dropout draws a Bernoulli per element, and on CPU
                              that costs about as much as the SpMMs; haloflow's mask is a counter-based hash)

Targets (issue "One engine that scales"): haloflow <= 0.5 x pyg-sparse epoch time on the same model, and
haloflow-nodropout <= 0.65 x dgl-nodropout (DGL 2.1's GraphConv, no precompute: DGL's math).

DGL's wheels stop at torch 2.2, so beside our torch DGL runs as a peer process (``bench/peers/dgl_gcn.py`` under
the Python that ``bash scripts/setup_peers.sh dgl`` builds), one epoch per request, in the same rounds as the
rest; its time is the peer's own clock around the epoch, without the pipe. The graph, features, labels and
haloflow's initial weights travel through a temporary ``.npz``, so with dropout 0 both sides compute the same
numbers: the first epoch's losses of haloflow-nodropout and dgl-nodropout must agree to float32 rounding
(``dgl_loss_equal`` in the JSON), or the two are not timing the same model::

    this process                                       DGL peer (torch 2.2.1, dgl 2.1.0), one per dropout p
    ------------                                       --------
    gcn.npz: indptr indices x y w0 b0 w1 b1   ---->    dgl.graph + add_self_loop, 2 x GraphConv, Adam
    round r: haloflow, pyg-..., {"cmd": "epoch"} -->   zero_grad, forward, loss, backward, step
                                              <---     {"seconds": 0.9, "loss": 3.7}

SpMM table: forward ``A @ X`` and backward ``A^T @ G`` (our custom autograd function with the transpose built
once) for both kernels at widths 16, 40, 128, and torch's own sparse autograd backward for reference.

    haloflow bench gcn                          # defaults, about a minute on 2 cores
    haloflow bench gcn --nodes 20000 --entries 220000 --epochs 3    # a quick look
    haloflow bench gcn --dgl-python ''          # without the DGL peer
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from haloflow.bench.args import at_least
from haloflow.bench.peer import PeerProcess, peer_python_flag
from haloflow.data.graph import CSRGraph
from haloflow.models import GCN, GCNConfig, KERNELS, LocalAggregator, gcn_loss
from haloflow.models.spmm import DEFAULT_KERNEL
from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.table import format_table
from haloflow.utils.help_format import HelpFormatter

log = logging.getLogger("benchmarks.gcn")

DGL_TARGET = 0.65  # the haloflow-nodropout / dgl-nodropout
LOSS_RTOL = 1e-4  # float32 rounding of two summation orders over 2 layers and a mean over N rows


def random_graph(num_nodes: int, entries: int, seed: int) -> CSRGraph:
    """Symmetric random graph with about ``entries`` stored (directed) entries and no self-loops."""
    rng = np.random.default_rng(seed)
    m = entries // 2
    return CSRGraph.from_edges(rng.integers(0, num_nodes, m), rng.integers(0, num_nodes, m), num_nodes,
                               symmetrize=True, drop_self_loops=True)


def best_ms(fn, repeats: int) -> float:
    fn()  # warm-up (numba compilation, allocator)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000.0 * min(times)


# ----------------------------------------------------------------------------------------------- SpMM kernels
def bench_spmm(graph: CSRGraph, widths: list[int], repeats: int, seed: int) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(seed)
    for kernel in KERNELS:
        op = LocalAggregator(graph, "gcn", kernel=kernel).op
        for f in widths:
            x = torch.randn(graph.num_nodes, f, generator=gen)  # (N, F)
            fwd = best_ms(lambda: op @ x, repeats)
            bwd = best_ms(lambda: op.t_matmul(x), repeats)  # the backward's A^T @ G
            rows.append(dict(kernel=kernel, width=f, forward_ms=fwd, backward_ms=bwd))
    # torch's own autograd through torch.sparse.mm (what a plain torch user gets), for reference
    a = LocalAggregator(graph, "gcn", kernel="torch").op.sparse_csr(torch.float32)
    for f in widths:
        x = torch.randn(graph.num_nodes, f, generator=gen).requires_grad_()
        g = torch.randn(graph.num_nodes, f, generator=gen)

        def autograd_step():
            x.grad = None
            torch.sparse.mm(a, x).backward(g)

        total = best_ms(autograd_step, repeats)
        fwd = best_ms(lambda: torch.sparse.mm(a, x.detach()), repeats)
        rows.append(dict(kernel="torch-autograd", width=f, forward_ms=fwd, backward_ms=total - fwd))
    return rows


# ----------------------------------------------------------------------------------------------- epochs
@dataclass(frozen=True)
class Epoch:
    """What a contestant's step returns for one training epoch."""

    loss: torch.Tensor | float
    seconds: float | None = None  # the step's own clock (a peer's: the pipe not counted); None: timed around it


class PygGCN(torch.nn.Module):
    def __init__(self, dims: list[int], p: float):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.convs = torch.nn.ModuleList(GCNConv(dims[i], dims[i + 1], cached=True) for i in range(len(dims) - 1))
        self.p = p

    def forward(self, x, adj):
        for i, conv in enumerate(self.convs):
            x = conv(F.dropout(x, self.p, self.training), adj)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


def pyg_epoch(model: PygGCN, x: torch.Tensor, adj, y: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A function that trains ``model`` one epoch per call (Adam lr 0.01, cross-entropy over every node) and
    returns that epoch's loss, detached (not synchronised on a device)."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x, adj), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _other(kernel: str) -> str:
    return next(k for k in KERNELS if k != kernel)


def other_kernel_name(kernel: str) -> str:
    """The contestant that swaps the SpMM kernel (what the default kernel adds)."""
    return f"haloflow-{_other(kernel)}-kernel"


def haloflow_config(args, dropout: float, precompute: bool) -> GCNConfig:
    return GCNConfig(in_dim=args.in_dim, out_dim=args.out_dim, hidden_dim=args.hidden, dropout=dropout,
                     precompute_first=precompute)


def make_contestants(graph: CSRGraph, x: torch.Tensor, y: torch.Tensor, args) -> dict:
    """name -> a function running one training epoch in this process and returning its `Epoch`."""
    n = graph.num_nodes
    dims = [args.in_dim, args.hidden, args.out_dim]
    ids = torch.arange(n)
    mask = torch.ones(n, dtype=torch.bool)
    steps = {}
    variants = {"haloflow": (False, args.kernel, 0.5), "haloflow+precompute": (True, args.kernel, 0.5),
                other_kernel_name(args.kernel): (False, _other(args.kernel), 0.5),
                "haloflow-nodropout": (False, args.kernel, 0.0)}
    for name, (pre, kernel, p) in variants.items():
        cfg = haloflow_config(args, p, pre)
        model, agg = GCN(cfg).train(), LocalAggregator(graph, cfg.norm, kernel=kernel)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        state = {"epoch": 0}

        def step(model=model, agg=agg, opt=opt, state=state):
            opt.zero_grad()
            loss = gcn_loss(model(x, agg, ids, state["epoch"]), y, mask, n)
            loss.backward()
            opt.step()
            state["epoch"] += 1
            return Epoch(loss.detach())

        steps[name] = step
    src, dst = graph.edges()
    adj_t = torch.sparse_csr_tensor(  # row = destination: PyG's adj_t convention
        torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices), torch.ones(graph.num_edges), size=(n, n),
        check_invariants=False,
    )
    edge_index = torch.from_numpy(np.stack([src, dst]))
    for name, adj, p in (("pyg-sparse", adj_t, 0.5), ("pyg-edge_index", edge_index, 0.5),
                         ("pyg-sparse-nodropout", adj_t, 0.0)):
        torch.manual_seed(args.seed)
        epoch = pyg_epoch(PygGCN(dims, p).train(), x, adj, y)
        steps[name] = lambda epoch=epoch: Epoch(epoch())
    dgl_step = _dgl_contestant(graph, x, y, dims, args.seed)
    if dgl_step is not None:
        steps["dgl"] = dgl_step
    return steps


# name -> the row it is measured against (the same model, one thing changed)
PEERS = {"haloflow": "pyg-sparse", "pyg-edge_index": "pyg-sparse", "dgl": "pyg-sparse",
         "haloflow+precompute": "haloflow", "haloflow-torch-kernel": "haloflow", "haloflow-numba-kernel": "haloflow",
         "haloflow-nodropout": "pyg-sparse-nodropout", "dgl-nodropout": "pyg-sparse-nodropout"}
# name -> its DGL counterpart (the target is stated against DGL's GraphConv)
DGL_PEERS = {"haloflow": "dgl", "haloflow-nodropout": "dgl-nodropout"}


def _dgl_contestant(graph: CSRGraph, x: torch.Tensor, y: torch.Tensor, dims: list[int], seed: int):
    """DGL's GraphConv (norm="both" on A + I = Kipf's GCN) when dgl imports; None (and a note) otherwise."""
    try:
        import dgl
        from dgl.nn import GraphConv
    except Exception as err:  # not installed, or a wheel built for another torch
        log.info("dgl: does not import in this process (%s)",
                 str(err).splitlines()[0][:80] if str(err) else type(err).__name__)
        return None
    src, dst = graph.edges()
    g = dgl.add_self_loop(dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=graph.num_nodes))
    torch.manual_seed(seed)
    convs = torch.nn.ModuleList(GraphConv(dims[i], dims[i + 1], norm="both") for i in range(len(dims) - 1))
    opt = torch.optim.Adam(convs.parameters(), lr=0.01)

    def step():
        h = x
        for i, conv in enumerate(convs):
            h = conv(g, F.dropout(h, 0.5, True))
            if i < len(convs) - 1:
                h = F.relu(h)
        opt.zero_grad()
        loss = F.cross_entropy(h, y)
        loss.backward()
        opt.step()
        return Epoch(loss.detach())

    return step


def dgl_peer_contestants(graph: CSRGraph, x: torch.Tensor, y: torch.Tensor, args,
                         stack: ExitStack) -> tuple[dict, dict]:
    """``dgl`` (dropout 0.5) and ``dgl-nodropout`` in DGL's own Python, one peer process each, started from
    haloflow's initial weights; their shutdown and the temporary data go on ``stack``. Returns the steps and the
    peer's versions."""
    names = {name: p for name, p in (("dgl", 0.5), ("dgl-nodropout", 0.0)) if name not in args.skip}
    if not names:
        return {}, {}
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="haloflow-gcn-dgl-")))
    model = GCN(haloflow_config(args, 0.0, False))  # the same seeded init as every haloflow contestant
    weights = {}
    for i, (w, b) in enumerate(zip(model.weights, model.biases)):
        weights[f"w{i}"], weights[f"b{i}"] = w.detach().numpy(), b.detach().numpy()  # (d_i, d_i+1), (d_i+1,)
    data = folder / "gcn.npz"
    np.savez(data, indptr=graph.indptr, indices=graph.indices, x=x.numpy(), y=y.numpy(), **weights)
    steps, info = {}, {}
    for name, p in names.items():
        setup = dict(data=str(data), dims=[args.in_dim, args.hidden, args.out_dim], dropout=p, seed=args.seed,
                     threads=args.threads)
        peer = stack.enter_context(PeerProcess(args.dgl_python, "dgl_gcn", setup, threads=args.threads))
        info = dict(python=str(args.dgl_python), dgl=peer.info.get("dgl"), torch=peer.info.get("torch"))
        steps[name] = functools.partial(_peer_epoch, peer)
    log.info("dgl: peer %s (dgl %s, torch %s)", info["python"], info["dgl"], info["torch"])
    return steps, info


@dataclass
class Rounds:
    seconds: dict[str, list[float]]  # name -> one epoch time per timed round (the warm-up rounds left out)
    first_loss: dict[str, float]  # name -> the loss of its first epoch (a warm-up one when there is warm-up)


def _peer_epoch(peer: PeerProcess) -> Epoch:
    reply = peer.call("epoch")
    return Epoch(reply["loss"], reply["seconds"])


def bench_epochs(steps: dict, epochs: int, warmup: int, skip: set[str]) -> Rounds:
    rounds = Rounds({name: [] for name in steps if name not in skip}, {})
    for r in range(warmup + epochs):
        for name, times in rounds.seconds.items():
            t0 = time.perf_counter()
            epoch = steps[name]()
            dt = time.perf_counter() - t0
            if r == 0:
                rounds.first_loss[name] = float(epoch.loss)  # outside the timing: on a device, a sync
            if r >= warmup:
                times.append(dt if epoch.seconds is None else epoch.seconds)
        log.info("round %d done", r)
    return rounds


def same_loss(first_loss: dict[str, float], a: str, b: str) -> bool | None:
    """Whether ``a``'s and ``b``'s first losses agree to float32 rounding; None when one was not run."""
    if a not in first_loss or b not in first_loss:
        return None
    return abs(first_loss[a] - first_loss[b]) <= LOSS_RTOL * abs(first_loss[b])


def dgl_status(steps: dict, args) -> str:
    if {"dgl", "dgl-nodropout"} & steps.keys():
        return "measured"
    if args.dgl_python is None:
        return "off (--dgl-python '')" if args.dgl_off else "not installed"
    return "skipped"


def ratio(times: dict[str, list[float]], a: str, b: str | None) -> float | None:
    """The median of ``a``'s per-round epoch times over ``b``'s (each round ran both under the same load)."""
    if a not in times or b not in times:
        return None
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def print_epochs(args, rounds: Rounds, med: dict[str, float], dgl: str, loss_equal: bool | None) -> None:
    """The epoch table, then DGL's same-math check and target, one line each."""
    times = rounds.seconds
    rows = [[k, med[k], min(times[k]), PEERS.get(k, "-"), ratio(times, k, PEERS.get(k)),
             ratio(times, k, DGL_PEERS.get(k))] for k in times]
    if dgl != "measured":
        rows.append(["dgl", None, None, dgl, None, None])
    print(format_table(["contestant", "epoch s (median)", "min s", "against", "ratio", "vs dgl"], rows,
                       title=f"GCN epoch {args.in_dim}->{args.hidden}->{args.out_dim}, {args.threads} threads"))
    if dgl == "not installed":
        print("dgl: not installed (bash scripts/setup_peers.sh dgl)")
    if loss_equal is not None:
        a, b = rounds.first_loss["haloflow-nodropout"], rounds.first_loss["dgl-nodropout"]
        print(f"same math: first-epoch loss haloflow-nodropout {a:.6f}, dgl-nodropout {b:.6f}: "
              f"{'equal' if loss_equal else 'DIFFERENT'} (rel {LOSS_RTOL:g})")
        if not loss_equal:
            log.warning("dgl-nodropout's first loss differs from haloflow-nodropout's: not the same model")
    r = ratio(times, "haloflow-nodropout", "dgl-nodropout")
    if r is not None:
        print(f"target: haloflow-nodropout / dgl-nodropout = {r:.3f} <= {DGL_TARGET}: "
              f"{'met' if r <= DGL_TARGET else 'missed'}")


def perf_model(graph: CSRGraph, d: list[int]) -> dict:
    """FLOPs and main-memory bytes of one epoch of Kipf's model (no precompute), counting the big terms only."""
    n, nnz = graph.num_nodes, graph.num_edges + graph.num_nodes  # + self-loops
    w0 = d[1] if d[1] < d[0] else d[0]  # layer 0 aggregates the narrower side
    flops = 2 * n * d[0] * d[1] * 2  # layer 0: X W0 forward and its weight gradient (X needs no gradient)
    flops += 2 * nnz * w0  # layer 0 SpMM forward (no backward into X)
    flops += 2 * n * d[1] * d[2] * 3  # layer 1: H W1 forward, grad W1, grad H
    flops += 2 * nnz * d[2] * 2  # layer 1 SpMM forward + backward at width d[2]
    spmm_bytes = nnz * (w0 * 4 + 16) + 2 * nnz * (d[2] * 4 + 16)  # gathers of F floats + index and value
    return dict(gflop=flops / 1e9, spmm_gbytes=spmm_bytes / 1e9)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--nodes", type=at_least(2), default=200_000, help="nodes of the random graph")
    ap.add_argument("--entries", type=at_least(1), default=2_200_000, help="adjacency entries (both directions)")
    ap.add_argument("--in-dim", type=int, default=128, help="input feature width")
    ap.add_argument("--hidden", type=int, default=128, help="hidden width")
    ap.add_argument("--out-dim", type=int, default=40, help="classes (the output width)")
    ap.add_argument("--epochs", type=at_least(1), default=5, help="timed rounds (one epoch of every contestant each)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds before the timed ones")
    ap.add_argument("--spmm-repeats", type=at_least(1), default=3, help="repetitions of each SpMM timing")
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 40, 128], help="feature widths of the SpMM timings")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of this process")
    ap.add_argument("--kernel", choices=KERNELS, default=DEFAULT_KERNEL, help="SpMM kernel on CPU")
    ap.add_argument("--skip", nargs="*", default=[], help="contestants to leave out, e.g. pyg-edge_index")
    ap.add_argument("--seed", type=int, default=0, help="seed of the graph and the weights")
    ap.add_argument("--out", type=Path, default=Path("bench-results/gcn.json"), help="where the JSON results go")
    ap.add_argument("--dgl-python", default=None, metavar="PATH",
                    help="the DGL peer's Python, used where dgl does not import here (default: the one "
                         "`bash scripts/setup_peers.sh dgl` builds, when built; '' leaves DGL out)")
    args = ap.parse_args(argv)
    most = args.nodes * (args.nodes - 1)  # a graph without loops or repeated edges holds no more
    if args.entries > most:
        ap.error(f"argument --entries: {args.entries:,} entries do not fit in a graph of {args.nodes:,} nodes (at "
                 f"most {most:,} without loops and repeats); give more --nodes or fewer --entries")
    args.dgl_off = args.dgl_python == ""
    args.dgl_python = peer_python_flag(args.dgl_python, "dgl")  # a path, or None: not built or left out
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    torch.set_num_threads(args.threads)

    graph = random_graph(args.nodes, args.entries, args.seed)
    log.info("graph: %s", graph)
    spmm = bench_spmm(graph, args.widths, args.spmm_repeats, args.seed)
    print(format_table(["kernel", "width", "forward ms", "backward ms"],
                       [[r["kernel"], r["width"], r["forward_ms"], r["backward_ms"]] for r in spmm],
                       float_fmt=".1f", title="SpMM, A (N x N) @ X (N x F)"))

    rng = np.random.default_rng(args.seed)
    x = torch.from_numpy(rng.standard_normal((args.nodes, args.in_dim), dtype=np.float32))  # (N, in_dim)
    y = torch.from_numpy(rng.integers(0, args.out_dim, args.nodes))  # (N,)
    with ExitStack() as stack:  # the DGL peers and their data: closed and removed however the rounds end
        steps = make_contestants(graph, x, y, args)
        dgl_peer = {}
        if "dgl" not in steps and args.dgl_python:
            peer_steps, dgl_peer = dgl_peer_contestants(graph, x, y, args, stack)
            steps.update(peer_steps)
        rounds = bench_epochs(steps, args.epochs, args.warmup, set(args.skip))
    times = rounds.seconds
    med = {name: statistics.median(ts) for name, ts in times.items()}
    dgl = dgl_status(steps, args)
    loss_equal = same_loss(rounds.first_loss, "dgl-nodropout", "haloflow-nodropout")
    print()
    print_epochs(args, rounds, med, dgl, loss_equal)
    model = perf_model(graph, [args.in_dim, args.hidden, args.out_dim])
    if "haloflow" in med:
        model["gflops_per_s"] = model["gflop"] / med["haloflow"]
    result = dict(
        benchmark="gcn",
        config={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        graph=dict(nodes=graph.num_nodes, entries=graph.num_edges),
        default_kernel=DEFAULT_KERNEL,
        spmm=spmm,
        epochs={k: dict(median_s=med[k], times_s=times[k]) for k in times},
        ratio_haloflow_vs_pyg_sparse=ratio(times, "haloflow", "pyg-sparse"),
        peers=PEERS, dgl=dgl,
        target_ratio=0.5,
        ratios_vs_dgl={k: ratio(times, k, v) for k, v in DGL_PEERS.items()},
        dgl_peers=DGL_PEERS, dgl_peer=dgl_peer or None,
        target_ratio_vs_dgl=DGL_TARGET,  # for haloflow-nodropout / dgl-nodropout
        first_loss=rounds.first_loss,
        dgl_loss_equal=loss_equal,
        perf_model=model,
    )
    out = atomic_write_text(args.out, json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
